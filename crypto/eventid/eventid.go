// Package eventid derives SSP/1 event ids: the BLAKE3-256 of a signed event's
// bytes exactly as received (docs/protocol.md, "Wire formats"; SSP/1 §12 step 4).
//
// The id is taken over the raw COSE_Sign1 bytes, never over a re-encoding, so
// two different encodings of the same event are two different ids.
package eventid

import (
	"github.com/zeebo/blake3"

	"github.com/syncmesh/syncmesh/messages"
)

// Of returns the event id of raw: BLAKE3-256 over the bytes exactly as
// received. It never fails and never retains raw.
func Of(raw []byte) messages.EventID {
	return messages.EventID(blake3.Sum256(raw))
}
