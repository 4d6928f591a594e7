package persistence

import (
	"bytes"
	"cmp"

	"github.com/syncmesh/syncmesh/messages"
)

// EventKey is a retained event's place in the order reconciliation uses:
// (site, HLC, id).
type EventKey struct {
	Site messages.SiteID
	HLC  messages.HLC
	ID   EventID
}

// Compare orders keys by site bytes, then HLC, then id bytes.
func (k EventKey) Compare(o EventKey) int {
	if c := bytes.Compare(k.Site[:], o.Site[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(k.HLC, o.HLC); c != 0 {
		return c
	}
	return bytes.Compare(k.ID[:], o.ID[:])
}

// EventRangeReader is the read-only range API over the retained event
// log that set reconciliation uses. The signed bytes of a key are read
// with SyncReader.Event(key.Site, key.HLC, key.ID).
type EventRangeReader interface {
	// TableEventKeys calls fn, in (site, HLC, id) order, for the keys of
	// the table's retained events with an HLC at or above min, until fn
	// returns false or an error.
	TableEventKeys(t TableKey, min messages.HLC, fn func(EventKey) (bool, error)) error
}
