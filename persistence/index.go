package persistence

import (
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// IndexDef is a secondary index: a name unique in its table and the
// columns it orders rows by, in order. A row's entry holds the ordered
// encoding (persistence/ordkey) of what a reader sees in each column
// (IndexValue), then the row's storage key (RowStorageKey), so entries
// with equal values follow the key order.
type IndexDef struct {
	Name    string
	Columns []string
}

// CloneIndexes returns a deep copy of idx.
func CloneIndexes(idx []IndexDef) []IndexDef {
	if idx == nil {
		return nil
	}
	out := make([]IndexDef, len(idx))
	for i, x := range idx {
		out[i] = IndexDef{Name: x.Name, Columns: slices.Clone(x.Columns)}
	}
	return out
}

// Index returns the table's index called name.
func (d TableDef) Index(name string) (IndexDef, bool) {
	for _, x := range d.Indexes {
		if x.Name == name {
			return x, true
		}
	}
	return IndexDef{}, false
}

// RowStorageKey appends the key a store orders a row of def by: its key
// columns' ordered encodings in def.KeyColumns order, then the key's CBOR
// encoding (ordkey.AppendRowKey). Both stores key rows by it, so Rows and
// every range over a table follow the natural key order.
func RowStorageKey(dst []byte, def TableDef, key messages.Columns) []byte {
	return ordkey.AppendRowKey(dst, def.KeyColumns, key)
}

// IndexValue appends the ordered encoding of what a reader sees in
// column col of row (SSP/1 §13.6): a key column's value; a value column's
// written value, whatever its type (a received value of another type than
// the declared one is indexed by its own kind, deterministically), null
// when a delete cleared it, absent when never materialized.
func IndexValue(dst []byte, def TableDef, row Row, col string) []byte {
	if slices.Contains(def.KeyColumns, col) {
		if v, ok := row.Key[col]; ok {
			return ordkey.AppendValue(dst, v)
		}
		return ordkey.AppendAbsent(dst)
	}
	if c, ok := row.Cells[col]; ok {
		return ordkey.AppendValue(dst, c.Value)
	}
	if !row.Tomb.IsZero() {
		return ordkey.AppendValue(dst, messages.Null)
	}
	return ordkey.AppendAbsent(dst)
}

// IndexEntry appends row's entry in index idx of def: the indexed
// columns' values, then the row's storage key. Only a row that exists
// has an entry (a tombstoned row is in no index); ok is false otherwise.
func IndexEntry(dst []byte, def TableDef, idx IndexDef, row Row) (entry []byte, ok bool) {
	if !row.Exists {
		return dst, false
	}
	for _, c := range idx.Columns {
		dst = IndexValue(dst, def, row, c)
	}
	return RowStorageKey(dst, def, row.Key), true
}

// IndexRowKey returns the row storage key at the end of an entry of an
// index over n columns.
func IndexRowKey(n int, entry []byte) ([]byte, error) {
	rest := entry
	var err error
	for range n {
		if rest, err = ordkey.Skip(rest); err != nil {
			return nil, err
		}
	}
	return rest, nil
}
