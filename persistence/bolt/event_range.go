package bolt

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TableEventKeys lists a table's event keys at or above min in (site,
// HLC, id) order for reconciliation. The table index is in (HLC, seq)
// order, so the keys are collected and sorted first: memory and time
// linear in the table's retained events above min.
func (t *syncTx) TableEventKeys(k persistence.TableKey, min messages.HLC, fn func(persistence.EventKey) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	keys, err := t.tableKeysFrom(k, min)
	if err != nil {
		return err
	}
	slices.SortFunc(keys, persistence.EventKey.Compare)
	for _, key := range keys {
		if more, err := fn(key); err != nil || !more {
			return err
		}
	}
	return nil
}

// tableKeysFrom is the one place reconciliation reads the index layout:
// the table index (lp(schema)|lp(table)|hlc|seq) from min on, each entry's
// site and id from its event record. The layout may change for write cost
// (its owner's helpers tablePrefix and tableIdxKey build the keys); adapt
// only this function then.
func (t *syncTx) tableKeysFrom(k persistence.TableKey, min messages.HLC) ([]persistence.EventKey, error) {
	if err := t.flushIndexes(); err != nil {
		return nil, err
	}
	prefix := tablePrefix(nil, k)
	var out []persistence.EventKey
	c := t.tableIdx.Cursor()
	for key, _ := c.Seek(tableIdxKey(nil, k, min, 0)); key != nil && len(key) >= len(prefix) && string(key[:len(prefix)]) == string(prefix); key, _ = c.Next() {
		if len(key) != len(prefix)+16 {
			return nil, fmt.Errorf("bolt: table index key of %d bytes: %w", len(key), persistence.ErrCorrupt)
		}
		seq := binary.BigEndian.Uint64(key[len(key)-8:])
		v := t.events.Get(u64(seq))
		if v == nil {
			return nil, fmt.Errorf("bolt: table index points at missing event %d: %w", seq, persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(seq, v)
		if err != nil {
			return nil, err
		}
		if ev.HLC != messages.HLC(binary.BigEndian.Uint64(key[len(prefix):])) || ev.Schema != k.Schema || ev.Table != k.Table {
			return nil, fmt.Errorf("bolt: table index entry disagrees with event %d: %w", seq, persistence.ErrCorrupt)
		}
		out = append(out, persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID})
	}
	return out, nil
}
