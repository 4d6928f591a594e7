package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// SiteEventIDs scans the (site, HLC, id) index from (site, from) through
// (site, to): sequential keys, no event record is opened.
func (t *syncTx) SiteEventIDs(site messages.SiteID, from, to messages.HLC, fn func(messages.HLC, persistence.EventID) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if from > to {
		return nil
	}
	var buf [24]byte
	start := binary.BigEndian.AppendUint64(append(buf[:0], site[:]...), uint64(from))
	c := t.ids.Cursor()
	for k, _ := c.Seek(start); k != nil && bytes.HasPrefix(k, site[:]); k, _ = c.Next() {
		if len(k) != 16+8+32 {
			return fmt.Errorf("bolt: event index key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		h := messages.HLC(binary.BigEndian.Uint64(k[16:24]))
		if h > to {
			return nil
		}
		var id persistence.EventID
		copy(id[:], k[24:])
		if more, err := fn(h, id); err != nil || !more {
			return err
		}
	}
	return nil
}
