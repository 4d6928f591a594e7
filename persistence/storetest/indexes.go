package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// tblIdx is a table with a composite key (text g, then integer-ish n)
// and indexes over a value column and over a value and a key column.
var tblIdx = persistence.TableKey{Schema: "app", Table: "idx"}

func idxDef(indexes ...persistence.IndexDef) persistence.TableDef {
	return persistence.TableDef{Schema: tblIdx.Schema, Table: tblIdx.Table, KeyColumns: []string{"g", "n"}, Columns: []string{"v", "w"}, Indexes: indexes}
}

var (
	idxV  = persistence.IndexDef{Name: "by_v", Columns: []string{"v"}}
	idxVG = persistence.IndexDef{Name: "by_v_g", Columns: []string{"v", "g"}}
)

func idxKey(g string, n any) messages.Columns {
	return messages.Columns{"g": messages.MustValue(g), "n": messages.MustValue(n)}
}

// rowKeys lists the encoded keys Rows visits.
func rowKeys(t *testing.T, r persistence.SyncReader, tk persistence.TableKey) [][]byte {
	t.Helper()
	var out [][]byte
	if err := r.Rows(tk, nil, func(k []byte, _ persistence.Row) (bool, error) {
		out = append(out, bytes.Clone(k))
		return true, nil
	}); err != nil {
		t.Fatalf("Rows: %v", err)
	}
	return out
}

// testRowsNaturalOrder: a defined table's rows are in the natural order
// of their keys, key column by key column in the table's order, and
// Rows resumes after a key in that order.
func testRowsNaturalOrder(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	def := idxDef()
	// In natural order.
	want := []messages.Columns{
		idxKey("", -1<<40), idxKey("", 0),
		idxKey("Z", 5), idxKey("a", -300), idxKey("a", -2), idxKey("a", 7), idxKey("a", 10), idxKey("a", 1<<40), idxKey("a", 2.5e20),
		idxKey("a\x00", 0), idxKey("aa", -1), idxKey("b", 0), idxKey("zzz", 0), idxKey("é", 0),
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutTable(def); err != nil {
			return err
		}
		for _, i := range []int{7, 3, 12, 0, 9, 1, 13, 4, 11, 2, 6, 10, 5, 8} {
			r := sampleRow(tblIdx, 0)
			r.Key = want[i]
			if err := tx.PutRow(r); err != nil {
				return err
			}
		}
		return nil
	})
	var enc [][]byte
	for _, k := range want {
		enc = append(enc, k.Encode())
	}
	for i := range 2 {
		if i == 1 {
			s = reopen()
		}
		view(t, s, func(r persistence.SyncReader) error {
			if got := rowKeys(t, r, tblIdx); !slices.EqualFunc(got, enc, bytes.Equal) {
				t.Fatalf("Rows in %s, want %s", keysString(got), keysString(enc))
			}
			var after [][]byte
			if err := r.Rows(tblIdx, enc[4], func(k []byte, _ persistence.Row) (bool, error) {
				after = append(after, bytes.Clone(k))
				return true, nil
			}); err != nil {
				return err
			}
			if !slices.EqualFunc(after, enc[5:], bytes.Equal) {
				t.Fatalf("Rows after %s: %s", keysString(enc[4:5]), keysString(after))
			}
			// An absent key resumes at the next one in the natural order.
			after = after[:0]
			if err := r.Rows(tblIdx, idxKey("a", 8).Encode(), func(k []byte, _ persistence.Row) (bool, error) {
				after = append(after, bytes.Clone(k))
				return len(after) < 1, nil
			}); err != nil {
				return err
			}
			if len(after) != 1 || !bytes.Equal(after[0], enc[6]) {
				t.Fatalf("Rows after an absent a/8: %s, want a/10", keysString(after))
			}
			return nil
		})
	}
}

func keysString(ks [][]byte) string {
	var out []string
	for _, k := range ks {
		c, err := messages.DecodeColumns(k)
		if err != nil {
			out = append(out, fmt.Sprintf("%x", k))
			continue
		}
		var g, n any
		_ = c["g"].Decode(&g)
		_ = c["n"].Decode(&n)
		out = append(out, fmt.Sprintf("%v/%v", g, n))
	}
	return fmt.Sprint(out)
}

// indexEntries lists an index's entries and the keys of their rows.
func indexEntries(t *testing.T, r persistence.SyncReader, index string) (entries, keys [][]byte) {
	t.Helper()
	if err := r.IndexRange(tblIdx, index, nil, func(e []byte, row persistence.Row) (bool, error) {
		entries = append(entries, bytes.Clone(e))
		keys = append(keys, row.Key.Encode())
		return true, nil
	}); err != nil {
		t.Fatalf("IndexRange %q: %v", index, err)
	}
	return entries, keys
}

// expectedEntries is an index's entries recomputed from rows.
func expectedEntries(def persistence.TableDef, index string, rows map[string]persistence.Row) (entries, keys [][]byte) {
	type ek struct{ e, k []byte }
	var all []ek
	for _, r := range rows {
		var e []byte
		if index == "" {
			e = persistence.RowStorageKey(nil, def, r.Key)
		} else {
			x, _ := def.Index(index)
			var ok bool
			if e, ok = persistence.IndexEntry(nil, def, x, r); !ok {
				continue
			}
		}
		all = append(all, ek{e, r.Key.Encode()})
	}
	sort.Slice(all, func(i, j int) bool { return bytes.Compare(all[i].e, all[j].e) < 0 })
	for _, x := range all {
		entries, keys = append(entries, x.e), append(keys, x.k)
	}
	return entries, keys
}

// testIndexes: PutRow moves a row's entries (a changed value, a delete's
// tombstone takes it out, a resurrection puts it back), an index added
// later is built with IndexRow, a failed transaction leaves no entry,
// and IndexRange of an undeclared index is ErrNotFound.
func testIndexes(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	def := idxDef(idxV)
	rows := map[string]persistence.Row{}
	put := func(tx persistence.SyncTx, g string, n int, v any, exists bool) error {
		r := persistence.Row{Schema: tblIdx.Schema, Table: tblIdx.Table, Key: idxKey(g, n), Exists: exists,
			Existence: clock(messages.HLC(len(rows)+1), siteA), Cells: map[string]persistence.Cell{}}
		if !exists {
			r.Tomb = r.Existence
		} else if v != nil {
			r.Cells["v"] = persistence.Cell{Value: messages.MustValue(v), Clock: r.Existence}
		}
		rows[string(r.Key.Encode())] = r
		return tx.PutRow(r)
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutTable(def); err != nil {
			return err
		}
		for i, v := range []any{3, "x", -1, nil, 2.5, []byte("b"), true, 3} {
			if err := put(tx, "a", i, v, true); err != nil {
				return err
			}
		}
		return nil
	})
	check := func(st persistence.SyncStore, def persistence.TableDef, what string) {
		t.Helper()
		view(t, st, func(r persistence.SyncReader) error {
			for _, x := range append([]persistence.IndexDef{{}}, def.Indexes...) {
				ge, gk := indexEntries(t, r, x.Name)
				we, wk := expectedEntries(def, x.Name, rows)
				if !slices.EqualFunc(ge, we, bytes.Equal) || !slices.EqualFunc(gk, wk, bytes.Equal) {
					t.Fatalf("%s: index %q: entries %x of rows %s, want %x of %s", what, x.Name, ge, keysString(gk), we, keysString(wk))
				}
			}
			return nil
		})
	}
	check(s, def, "first rows")
	update(t, s, func(tx persistence.SyncTx) error {
		if err := put(tx, "a", 0, "changed", true); err != nil { // moves
			return err
		}
		if err := put(tx, "a", 1, nil, false); err != nil { // tombstoned: out
			return err
		}
		return put(tx, "a", 2, -1, true) // unchanged
	})
	check(s, def, "changed, deleted")
	update(t, s, func(tx persistence.SyncTx) error { return put(tx, "a", 1, "back", true) }) // resurrected
	check(s, def, "resurrected")

	// A failed transaction leaves neither the row nor its entry.
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		r := sampleRow(tblIdx, 0)
		r.Key = idxKey("zz", 1)
		if err := tx.PutRow(r); err != nil {
			return err
		}
		return errFn
	})
	if !errors.Is(err, errFn) {
		t.Fatalf("Update: %v", err)
	}
	check(s, def, "after a failed transaction")

	// An index declared later: empty until built, then as if maintained.
	def = idxDef(idxV, idxVG)
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutTable(def); err != nil {
			return err
		}
		return tx.Rows(tblIdx, nil, func(_ []byte, r persistence.Row) (bool, error) {
			return true, tx.IndexRow(tblIdx, idxVG.Name, r)
		})
	})
	s = reopen()
	check(s, def, "built later, reopened")
	view(t, s, func(r persistence.SyncReader) error {
		err := r.IndexRange(tblIdx, "nope", nil, func([]byte, persistence.Row) (bool, error) { return true, nil })
		if !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("IndexRange of an undeclared index: %v, want ErrNotFound", err)
		}
		return nil
	})
	// IndexRange from an entry starts there.
	view(t, s, func(r persistence.SyncReader) error {
		we, _ := expectedEntries(def, idxV.Name, rows)
		var got [][]byte
		if err := r.IndexRange(tblIdx, idxV.Name, we[2], func(e []byte, _ persistence.Row) (bool, error) {
			got = append(got, bytes.Clone(e))
			return true, nil
		}); err != nil {
			return err
		}
		if !slices.EqualFunc(got, we[2:], bytes.Equal) {
			t.Fatalf("IndexRange from the third entry: %x, want %x", got, we[2:])
		}
		return nil
	})
}

// testIndexesProperty: under random puts (values of every kind, absent
// cells, tombstones, resurrections), random failing transactions and
// reopens, every index equals the entries recomputed from the rows, and
// Rows follows the row order.
func testIndexesProperty(t *testing.T, open OpenFunc) {
	rapid.Check(t, func(rt *rapid.T) {
		s, reopen := open(t)
		def := idxDef(idxV, idxVG)
		update(t, s, func(tx persistence.SyncTx) error { return tx.PutTable(def) })
		rows := map[string]persistence.Row{}
		value := rapid.OneOf(
			rapid.Map(rapid.Int64Range(-1000, 1000), func(v int64) any { return v }),
			rapid.Map(rapid.Float64(), func(v float64) any { return v }),
			rapid.Map(rapid.StringN(0, 4, -1), func(v string) any { return v }),
			rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 3), func(v []byte) any { return v }),
			rapid.Map(rapid.Bool(), func(v bool) any { return v }),
			rapid.Just[any](nil),
			rapid.Just[any]([]any{1, "x"}),
		)
		h := messages.HLC(1)
		for range rapid.IntRange(1, 6).Draw(rt, "txs") {
			fail := rapid.IntRange(0, 4).Draw(rt, "fail") == 0
			next := maps2(rows)
			err := s.Update(ctx, func(tx persistence.SyncTx) error {
				for range rapid.IntRange(1, 12).Draw(rt, "puts") {
					h++
					k := idxKey(rapid.SampledFrom([]string{"", "a", "ab", "b"}).Draw(rt, "g"), rapid.IntRange(-3, 3).Draw(rt, "n"))
					r := persistence.Row{Schema: tblIdx.Schema, Table: tblIdx.Table, Key: k, Cells: map[string]persistence.Cell{}}
					r.Exists = rapid.IntRange(0, 3).Draw(rt, "exists") > 0
					r.Existence = clock(h, siteA)
					if rapid.Bool().Draw(rt, "tomb") || !r.Exists {
						r.Tomb = clock(h-1, siteB)
					}
					if rapid.IntRange(0, 3).Draw(rt, "written") > 0 {
						v := value.Draw(rt, "v")
						r.Cells["v"] = persistence.Cell{Value: messages.MustValue(v), Clock: r.Existence}
					}
					next[string(k.Encode())] = r
					if err := tx.PutRow(r); err != nil {
						return err
					}
				}
				if fail {
					return errFn
				}
				return nil
			})
			if fail != (err != nil) {
				rt.Fatalf("Update: %v (fail %v)", err, fail)
			}
			if !fail {
				rows = next
			}
			if rapid.Bool().Draw(rt, "reopen") {
				s = reopen()
			}
			if err := s.View(ctx, func(r persistence.SyncReader) error {
				for _, index := range []string{"", idxV.Name, idxVG.Name} {
					ge, gk := indexEntries(t, r, index)
					we, wk := expectedEntries(def, index, rows)
					if !slices.EqualFunc(ge, we, bytes.Equal) || !slices.EqualFunc(gk, wk, bytes.Equal) {
						rt.Fatalf("index %q: %x, want %x", index, ge, we)
					}
					if index == "" {
						if got := rowKeys(t, r, tblIdx); !slices.EqualFunc(got, wk, bytes.Equal) {
							rt.Fatalf("Rows %s, want %s", keysString(got), keysString(wk))
						}
					}
				}
				return nil
			}); err != nil {
				rt.Fatal(err)
			}
		}
	})
}

func maps2(m map[string]persistence.Row) map[string]persistence.Row {
	out := make(map[string]persistence.Row, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
