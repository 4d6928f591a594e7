package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Layout 7: every clock of a row record (existence, tombstone, each cell)
// carries the id of the event that set it, so an equal (HLC, site) — two
// distinct events one site signed with one HLC — is settled by event id
// exactly as the materializer settles it in memory (messages.Clock). The
// id could instead be looked up in the (site, HLC, id) event index on a
// tie, but that index cannot say which of several events at one stamp set
// a given clock (that needs each candidate opened and re-judged, and a
// candidate may be held or reclaimed), so the row states it itself: 32
// bytes per clock, a pure function of the delivered events on every node.

// EventIDsAt returns the ids of the retained events site signed with HLC
// h, ascending, at most limit (≤ 0: all): a prefix scan of the (site,
// HLC, id) index.
func (t *syncTx) EventIDsAt(site messages.SiteID, h messages.HLC, limit int) ([]persistence.EventID, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	if t.noneAt && t.noneAtSite == site && t.noneAtHLC == h {
		return nil, nil // Event just found none there (sync.go)
	}
	if t.idsCur == nil {
		t.idsCur = t.ids.Cursor()
	}
	return eventIDsAt(t.idsCur, site, h, limit, nil)
}

// eventIDsAt scans the index for the ids at (site, h); keep, when non-nil,
// filters them by their index value (the log sequence).
func eventIDsAt(c *wcursor, site messages.SiteID, h messages.HLC, limit int, keep func(seq []byte) (bool, error)) ([]persistence.EventID, error) {
	var buf [24]byte
	prefix := binary.BigEndian.AppendUint64(append(buf[:0], site[:]...), uint64(h))
	var out []persistence.EventID
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && (limit <= 0 || len(out) < limit); k, v = c.Next() {
		if len(k) != len(prefix)+32 {
			return nil, fmt.Errorf("bolt: event index key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		if keep != nil {
			ok, err := keep(v)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		var id persistence.EventID
		copy(id[:], k[len(prefix):])
		out = append(out, id)
	}
	return out, nil
}

// migrateRowClockIDsV1 (layout 6 → 7) rewrites every row record from
// version 1 (clocks of (HLC, site)) to version 2 (clocks of (HLC, site,
// id)). A clock's id is that of the retained event of the same row with
// the clock's (site, HLC), found through the event index. Two cases have
// no single such event:
//   - none: the event was reclaimed below the table's horizon. The id
//     stays zero; an event with that (site, HLC) lies below the horizon
//     too, so it writes nothing and the zero id is never compared.
//   - several: the site already equivocated on this row before layout 7
//     and the row holds whichever event arrived first. The clock gets the
//     highest candidate id (what a tie now resolves to); the value is kept
//     as it is — the events' payloads are sealed and a migration does not
//     re-materialize — so such a row may differ from a node that received
//     the events after the upgrade until the row is written again.
//
// It runs in the Open transaction: all or nothing.
func migrateRowClockIDsV1(tx *wtx) error {
	rows, ids, events := tx.Bucket(bucketSyncRows), tx.Bucket(bucketSyncEventKeys), tx.Bucket(bucketSyncEvents)
	if rows == nil || ids == nil || events == nil {
		return fmt.Errorf("sync buckets missing: %w", persistence.ErrCorrupt)
	}
	// bbolt forbids writes under a live cursor: read a chunk, rewrite it,
	// seek past it.
	var after []byte
	for {
		var keys, vals [][]byte
		c := rows.Cursor()
		k, v := c.First()
		if after != nil {
			if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(keys) < scanChunk; k, v = c.Next() {
			keys, vals = append(keys, clone(k)), append(vals, clone(v))
		}
		if len(keys) == 0 {
			return nil
		}
		for i, key := range keys {
			nv, err := rowV1ToV2(ids, events, key, vals[i])
			if err != nil {
				return err
			}
			if err := rows.Put(key, nv); err != nil {
				return err
			}
		}
		after = keys[len(keys)-1]
	}
}

// rowV1ToV2 converts one version-1 row record stored at key.
func rowV1ToV2(ids, events *wbucket, key, v []byte) ([]byte, error) {
	schema, rest, err := readLP(key)
	if err != nil {
		return nil, err
	}
	table, rowKey, err := readLP(rest)
	if err != nil {
		return nil, err
	}
	var rec rowRecord
	if err := decodeRecordVersion("row v1", v, &rec, &rec.V, 1); err != nil {
		return nil, err
	}
	cache := map[messages.Clock]messages.EventID{}
	idOf := func(cr clockRecord) (messages.Clock, error) {
		if len(cr.ID) != 0 {
			return messages.Clock{}, corrupt("row v1", fmt.Errorf("clock carries an event id"))
		}
		c, err := fromClockRecord(cr)
		if err != nil || c.IsZero() {
			return c, err
		}
		if id, ok := cache[c]; ok {
			c.ID = id
			return c, nil
		}
		cands, err := eventIDsAt(ids.Cursor(), c.Site, c.HLC, 0, func(seq []byte) (bool, error) {
			if len(seq) != 8 {
				return false, fmt.Errorf("bolt: id index value of %d bytes: %w", len(seq), persistence.ErrCorrupt)
			}
			ev := events.Get(seq)
			if ev == nil {
				return false, fmt.Errorf("bolt: index points at missing event: %w", persistence.ErrCorrupt)
			}
			se, err := decodeEvent(binary.BigEndian.Uint64(seq), ev)
			if err != nil {
				return false, err
			}
			return se.Schema == string(schema) && se.Table == string(table) && bytes.Equal(se.RowKey, rowKey), nil
		})
		if err != nil {
			return c, err
		}
		var id messages.EventID
		if len(cands) > 0 {
			id = cands[len(cands)-1] // ascending: the highest
		}
		cache[c] = id
		c.ID = id
		return c, nil
	}
	row := persistence.Row{Exists: rec.Exists}
	if row.Existence, err = idOf(rec.Existence); err != nil {
		return nil, err
	}
	if row.Tomb, err = idOf(rec.Tomb); err != nil {
		return nil, err
	}
	if len(rec.Cells) > 0 {
		row.Cells = make(map[string]persistence.Cell, len(rec.Cells))
		for n, cell := range rec.Cells {
			c, err := idOf(cell.Clock)
			if err != nil {
				return nil, err
			}
			row.Cells[n] = persistence.Cell{Value: messages.Value(cell.Value), Clock: c}
		}
	}
	return encodeRow(&row)
}
