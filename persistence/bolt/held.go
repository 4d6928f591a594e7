package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Layout 6: a held entry's value is the held event's stored size (8
// bytes; empty for entries written before), and bucketSyncHeldUsage keeps
// each signer's totals, so a quota check is one point read.
var bucketSyncHeldUsage = []byte("sync.held_usage") // site(16) → events(8)|bytes(8)

func (t *syncTx) IsHeld(g persistence.GroupKey, seq uint64) (bool, error) {
	if err := t.check(); err != nil {
		return false, err
	}
	return t.held.Get(binary.BigEndian.AppendUint64(groupPrefix(nil, g), seq)) != nil, nil
}

func (t *syncTx) HeldUsage(site messages.SiteID) (persistence.HeldUsage, error) {
	b, err := t.bucket(bucketSyncHeldUsage)
	if err != nil {
		return persistence.HeldUsage{}, err
	}
	return decodeUsage(b.Get(site[:]))
}

func decodeUsage(v []byte) (persistence.HeldUsage, error) {
	switch len(v) {
	case 0:
		return persistence.HeldUsage{}, nil
	case 16:
		return persistence.HeldUsage{Events: int(binary.BigEndian.Uint64(v)), Bytes: int64(binary.BigEndian.Uint64(v[8:]))}, nil
	}
	return persistence.HeldUsage{}, fmt.Errorf("bolt: held usage of %d bytes: %w", len(v), persistence.ErrCorrupt)
}

// addUsage moves site's held totals by (events, size).
func addUsage(tx *wtx, site messages.SiteID, events int, size int64) error {
	b := tx.Bucket(bucketSyncHeldUsage)
	if b == nil {
		return fmt.Errorf("bolt: bucket %s missing: %w", bucketSyncHeldUsage, persistence.ErrCorrupt)
	}
	u, err := decodeUsage(b.Get(site[:]))
	if err != nil {
		return err
	}
	u.Events += events
	u.Bytes += size
	if u.Events <= 0 {
		return b.Delete(site[:])
	}
	v := binary.BigEndian.AppendUint64(nil, uint64(u.Events))
	return b.Put(site[:], binary.BigEndian.AppendUint64(v, uint64(max(u.Bytes, 0))))
}

func (t *syncTx) HoldEvent(g persistence.GroupKey, seq uint64) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	k := binary.BigEndian.AppendUint64(groupPrefix(nil, g), seq)
	if t.held.Get(k) != nil {
		return nil
	}
	size := int64(len(t.events.Get(u64(seq))))
	if err := t.held.Put(k, u64(uint64(size))); err != nil {
		return err
	}
	return addUsage(t.tx, g.Site, 1, size)
}

func (t *syncTx) ReleaseGroup(g persistence.GroupKey) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	_, err := t.dropHeld(g, false)
	return err
}

func (t *syncTx) PurgeHeld(g persistence.GroupKey) (int, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	return t.dropHeld(g, true)
}

// dropHeld forgets g's held entries (and, with purge, their events).
func (t *syncTx) dropHeld(g persistence.GroupKey, purge bool) (int, error) {
	prefix := groupPrefix(nil, g)
	var keys [][]byte
	var size int64
	c := t.held.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(k) != len(prefix)+8 {
			return 0, fmt.Errorf("bolt: held key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		keys = append(keys, clone(k))
		if len(v) == 8 {
			size += int64(binary.BigEndian.Uint64(v))
		}
	}
	for _, k := range keys {
		if err := t.held.Delete(k); err != nil {
			return 0, err
		}
		if purge {
			if err := t.deleteEvent(binary.BigEndian.Uint64(k[len(prefix):])); err != nil {
				return 0, err
			}
		}
	}
	if len(keys) == 0 {
		return 0, nil
	}
	return len(keys), addUsage(t.tx, g.Site, -len(keys), -size)
}

// deleteEvent removes one event and its index entries (absent: nothing).
func (t *syncTx) deleteEvent(seq uint64) error {
	if err := t.flushIndexes(); err != nil {
		return err
	}
	seqKey := u64(seq)
	v := t.events.Get(seqKey)
	if v == nil {
		return nil
	}
	ev, err := decodeEvent(seq, v)
	if err != nil {
		return err
	}
	tk := persistence.TableKey{Schema: ev.Schema, Table: ev.Table}
	for _, del := range []struct {
		b   *wbucket
		key []byte
	}{
		{t.events, seqKey}, {t.ids, eventKey(nil, ev.Site, ev.HLC, ev.ID)}, {t.rowIdx, rowIdxKey(nil, tk, ev.RowKey, seq)}, {t.tableIdx, tableIdxKey(nil, tk, ev.HLC, seq)},
	} {
		if err := del.b.Delete(del.key); err != nil {
			return err
		}
	}
	t.sumChange(tk, ev.Site, ev.HLC, ev.ID, false)
	t.hasMissed = false
	return nil
}
