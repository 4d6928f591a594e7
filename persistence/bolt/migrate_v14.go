package bolt

import (
	"bytes"
	"fmt"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// naturalRowsV14 is layout 14 (docs/storage.md, "Row order"): every row of
// a defined table is moved from lp(schema)|lp(table)|rowkey, the CBOR
// order of its key (text shortest first, negative integers after
// positive ones), to lp(schema)|lp(table)|ordered key|rowkey
// (persistence.RowStorageKey), so scans, ranges and cursors follow the
// natural order. Row records, events, event ids and the change log are
// unchanged (a row key's CBOR encoding stays its identity, SSP/1 §13).
// Rows of a table with no definition keep their key (a store keys them
// by the CBOR key alone until the table is defined, which cannot happen
// with rows present). The secondary indexes' bucket is created (empty:
// a layout-13 table declares none).
//
// A pending column rebuild (AddColumn) resumes after a row key in the
// old order; it is restarted from the first row instead, which is safe
// (a rebuild only raises cells to what the retained log gives) and
// skips no row.
func naturalRowsV14(tx *wtx) error {
	if _, err := tx.CreateBucketIfNotExists(bucketSyncIndexes); err != nil {
		return err
	}
	tables, rows := tx.Bucket(bucketSyncTables), tx.Bucket(bucketSyncRows)
	if tables == nil || rows == nil {
		return fmt.Errorf("sync buckets missing: %w", persistence.ErrCorrupt)
	}
	var defs []persistence.TableDef
	if err := tables.ForEach(func(_, v []byte) error {
		d, err := decodeTable(v)
		defs = append(defs, d)
		return err
	}); err != nil {
		return err
	}
	for _, def := range defs {
		if len(def.KeyColumns) == 0 {
			continue
		}
		prefix := tablePrefix(nil, tableKeyOf(def.Schema, def.Table))
		type kv struct{ k, v []byte }
		var moved []kv
		c := rows.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			nk, err := ordkey.RowKeyFromEncoded(clone(prefix), def.KeyColumns, k[len(prefix):])
			if err != nil {
				return corrupt("row key", err)
			}
			moved = append(moved, kv{nk, clone(v)})
		}
		// Every old key starts with a CBOR map head (0xa0–0xbf) after
		// the prefix, every new one with an ordkey kind byte (< 0x80):
		// deleting the old keys first never deletes a moved row.
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
			if len(k) > len(prefix) && k[len(prefix)] < 0x80 {
				break // the table's first new key: every old one is gone
			}
			if err := c.Delete(); err != nil {
				return err
			}
		}
		for _, m := range moved {
			if err := rows.Put(m.k, m.v); err != nil {
				return err
			}
		}
	}
	return restartColumnRebuildsV14(tx)
}

// metaColumnRebuildsV14 is the sync meta key of the pending column
// rebuilds (actors/syncgroup: a CBOR array of maps; key 4 is the last
// row key rebuilt).
var metaColumnRebuildsV14 = []byte("sync.column_rebuilds")

func restartColumnRebuildsV14(tx *wtx) error {
	m := tx.Bucket(bucketSyncMeta)
	if m == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketSyncMeta, persistence.ErrCorrupt)
	}
	b := m.Get(metaColumnRebuildsV14)
	if len(b) == 0 {
		return nil
	}
	var rs []map[uint64]cbor.RawMessage
	if err := cbor.Unmarshal(b, &rs); err != nil {
		return corrupt("column rebuilds", err)
	}
	for _, r := range rs {
		delete(r, 4)
	}
	enc, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		return err
	}
	out, err := enc.Marshal(rs)
	if err != nil {
		return err
	}
	return m.Put(metaColumnRebuildsV14, out)
}
