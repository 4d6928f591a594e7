package bolt

import (
	"bytes"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// Secondary indexes (layout 14): bucketSyncIndexes holds one entry per
// existing row and index, lp(schema)|lp(table)|lp(index)|entry → ∅, the
// entry being persistence.IndexEntry (the indexed values' ordered
// encodings, then the row's storage key). PutRow keeps them in the
// row's transaction.

// tableDef returns k's definition, cached for the transaction (the zero
// definition for a table that is not defined: its rows, if any, are
// keyed by their CBOR key alone).
func (t *syncTx) tableDef(k persistence.TableKey) (persistence.TableDef, error) {
	if d, ok := t.defs[k]; ok {
		return d, nil
	}
	d, _, err := t.Table(k)
	if err != nil {
		return d, err
	}
	if t.defs == nil {
		t.defs = make(map[persistence.TableKey]persistence.TableDef, 2)
	}
	t.defs[k] = d
	return d, nil
}

// indexPrefix is lp(schema)|lp(table)|lp(index).
func indexPrefix(b []byte, k persistence.TableKey, index string) []byte {
	return appendLPString(tablePrefix(b, k), index)
}

// updateIndexes moves row's index entries from what the stored record
// old (nil: none) gave to what row gives. prefix|sk is the row's
// rows-bucket key.
func (t *syncTx) updateIndexes(k persistence.TableKey, def persistence.TableDef, prefix, sk, old []byte, row *persistence.Row) error {
	var prev persistence.Row
	if old != nil {
		_, rowKey, err := ordkey.SplitRowKey(len(def.KeyColumns), sk)
		if err != nil {
			return corrupt("row key", err)
		}
		if prev, err = readRowKeyed(k, rowKey, row.Key, old, nil); err != nil {
			return err
		}
	}
	var a, b []byte
	for _, x := range def.Indexes {
		ip := indexPrefix(nil, k, x.Name)
		a, b = a[:0], b[:0]
		var hadOld, hasNew bool
		if old != nil {
			a, hadOld = persistence.IndexEntry(append(a, ip...), def, x, prev)
		}
		b, hasNew = persistence.IndexEntry(append(b, ip...), def, x, *row)
		if hadOld && hasNew && bytes.Equal(a, b) {
			continue
		}
		if hadOld {
			if err := t.rowIndexes.Delete(a); err != nil {
				return err
			}
		}
		if hasNew {
			if len(b) > bbolt.MaxKeySize {
				return fmt.Errorf("bolt: index %q entry of %d bytes: %w", x.Name, len(b), persistence.ErrLimit)
			}
			if err := t.rowIndexes.Put(b, empty); err != nil {
				return err
			}
		}
	}
	return nil
}

// IndexRow puts row's entry in index of k (an index build; PutRow keeps
// the entries of the rows it writes).
func (t *syncTx) IndexRow(k persistence.TableKey, index string, row persistence.Row) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	def, err := t.tableDef(k)
	if err != nil {
		return err
	}
	x, ok := def.Index(index)
	if !ok {
		return fmt.Errorf("bolt: index row: %q of %s.%s: %w", index, k.Schema, k.Table, persistence.ErrNotFound)
	}
	e, ok := persistence.IndexEntry(indexPrefix(nil, k, index), def, x, row)
	if !ok {
		return nil
	}
	if len(e) > bbolt.MaxKeySize {
		return fmt.Errorf("bolt: index %q entry of %d bytes: %w", index, len(e), persistence.ErrLimit)
	}
	return t.rowIndexes.Put(e, empty)
}

// IndexRange visits, in order, the entries of index of k ("": the rows
// in key order, each entry its storage key) from the first at or after
// from, with their rows.
func (t *syncTx) IndexRange(k persistence.TableKey, index string, from []byte, fn func(entry []byte, row persistence.Row) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if err := t.flushRows(); err != nil {
		return err
	}
	def, err := t.tableDef(k)
	if err != nil {
		return err
	}
	tp := tablePrefix(nil, k)
	if index == "" {
		return scanChunks(t.rows, append(clone(tp), from...), tp, 16, func(key, v []byte) (bool, error) {
			sk := key[len(tp):]
			_, rowKey, err := ordkey.SplitRowKey(len(def.KeyColumns), sk)
			if err != nil {
				return false, corrupt("row key", err)
			}
			row, err := readRow(k, rowKey, v)
			if err != nil {
				return false, err
			}
			return fn(sk, row)
		})
	}
	x, ok := def.Index(index)
	if !ok {
		return fmt.Errorf("bolt: index range: %q of %s.%s: %w", index, k.Schema, k.Table, persistence.ErrNotFound)
	}
	ip := indexPrefix(nil, k, index)
	var rk []byte
	return scanChunks(t.rowIndexes, append(clone(ip), from...), ip, 16, func(key, _ []byte) (bool, error) {
		e := key[len(ip):]
		sk, err := persistence.IndexRowKey(len(x.Columns), e)
		if err != nil {
			return false, corrupt("index entry", err)
		}
		_, rowKey, err := ordkey.SplitRowKey(len(def.KeyColumns), sk)
		if err != nil {
			return false, corrupt("index entry", err)
		}
		rk = append(append(rk[:0], tp...), sk...)
		v := t.rows.Get(rk)
		if v == nil {
			return false, corrupt("index entry", fmt.Errorf("no row under %x", sk))
		}
		row, err := readRow(k, rowKey, v)
		if err != nil {
			return false, err
		}
		return fn(e, row)
	})
}
