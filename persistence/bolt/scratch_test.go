package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestScratchReuseKeepsCommittedRecords: the chunks a write transaction's
// records are carved from are lent to the next one (scratch.go; this
// package's tests poison them on release). Records of committed
// transactions read back intact after later ones wrote over those chunks;
// a transaction aborted at the commit — after its records were put into
// bbolt's nodes, the index entries and rows flushed — leaves nothing,
// sealed or not.
func TestScratchReuseKeepsCommittedRecords(t *testing.T) {
	for _, sealer := range []persistence.Sealer{nil, newTestSealer(1)} {
		t.Run(fmt.Sprintf("sealed=%v", sealer != nil), func(t *testing.T) {
			var abort atomic.Bool
			opts := Options{NoSync: true, Sealer: sealer, Failpoint: func(name string) error {
				if name == FailpointSyncUpdateBeforeCommit && abort.Load() {
					return persistence.ErrInjected
				}
				return nil
			}}
			db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), opts)
			defer db.Close()
			s := db.Sync()
			tk := persistence.TableKey{Schema: "s", Table: "t"}
			const perTx = 500 // several chunks of values per transaction
			raw := func(n int) []byte { return bytes.Repeat([]byte{byte(n), byte(n >> 8)}, 20+n%300) }
			rowOf := func(n int) persistence.Row {
				c := messages.Clock{HLC: messages.HLC(n + 1), Site: messages.SiteID{1}, ID: messages.EventID{byte(n), byte(n >> 8), 1}}
				return persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: messages.Columns{"id": messages.MustValue(n % 100)},
					Exists: true, Existence: c, Cells: map[string]persistence.Cell{"v": {Value: raw(n), Clock: c}}}
			}
			write := func(round int) error {
				return s.Update(ctx, func(tx persistence.SyncTx) error {
					for i := 0; i < perTx; i++ {
						n := round*perTx + i
						var id persistence.EventID
						id[0], id[1], id[2] = byte(n), byte(n>>8), 0xee
						ev := persistence.StoredEvent{ID: id, Raw: raw(n), Site: messages.SiteID{1}, HLC: messages.HLC(n + 1),
							Schema: tk.Schema, Table: tk.Table, RowKey: rowOf(n).Key.Encode()}
						if _, err := tx.AppendEvent(ev); err != nil {
							return err
						}
						if err := tx.PutRow(rowOf(n)); err != nil {
							return err
						}
						r := rowOf(n)
						if _, err := tx.AppendChange(persistence.RowChange{Schema: tk.Schema, Table: tk.Table, Key: r.Key, Exists: true,
							Existence: r.Existence, Cells: r.Cells, Cause: persistence.CauseEvent, Event: r.Existence}); err != nil {
							return err
						}
					}
					return nil
				})
			}
			committed := 0
			for round := 0; round < 6; round++ {
				abort.Store(round == 3)
				err := write(round)
				if round == 3 {
					if !errors.Is(err, persistence.ErrInjected) {
						t.Fatalf("aborted round: %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				committed++
			}
			abort.Store(false)
			err := s.View(ctx, func(r persistence.SyncReader) error {
				var n, changes int
				err := r.EventsAfter(0, 0, func(ev persistence.StoredEvent) (bool, error) {
					// Rounds 0-2 and 4-5: the event numbers skip round 3.
					num := n
					if n >= 3*perTx {
						num += perTx
					}
					if ev.Seq != uint64(n+1) || ev.HLC != messages.HLC(num+1) || !bytes.Equal(ev.Raw, raw(num)) {
						return false, fmt.Errorf("event %d read back as seq %d hlc %d raw %d bytes", num, ev.Seq, ev.HLC, len(ev.Raw))
					}
					n++
					return true, nil
				})
				if err != nil {
					return err
				}
				if n != committed*perTx {
					return fmt.Errorf("%d events, want %d", n, committed*perTx)
				}
				last := 6*perTx - 1
				for id := 0; id < 100; id++ {
					num := last - (last-id)%100 // the last write of row id
					got, ok, err := r.Row(tk, rowOf(id).Key.Encode())
					if err != nil || !ok {
						return fmt.Errorf("row %d: %v %v", id, ok, err)
					}
					want := rowOf(num)
					if got.Existence != want.Existence || !bytes.Equal(got.Cells["v"].Value, want.Cells["v"].Value) {
						return fmt.Errorf("row %d holds %+v, want event %d's", id, got.Existence, num)
					}
				}
				err = r.ChangesAfter(tk, 0, 0, func(c persistence.RowChange) (bool, error) {
					changes++
					num := int(c.Seq) - 1
					if num >= 3*perTx {
						num += perTx
					}
					if want := rowOf(num); c.Event != want.Existence || !bytes.Equal(c.Cells["v"].Value, want.Cells["v"].Value) {
						return false, fmt.Errorf("change %d holds %+v, want event %d's", c.Seq, c.Event, num)
					}
					return true, nil
				})
				if err != nil {
					return err
				}
				if changes != committed*perTx {
					return fmt.Errorf("%d changes, want %d", changes, committed*perTx)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRowForUpdateLendsTheTransactionsMemory: RowForUpdate reads what
// RowWithKey reads — rows put in the transaction and rows on disk, with
// and without cells — into the transaction's memory: a value changed in
// place changes neither the stored row nor a row yet to be put, and the
// apply path's read, change, PutRow, AppendChange per row, with one map
// lent for all, stores every row and change as written.
func TestRowForUpdateLendsTheTransactionsMemory(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	s := db.Sync()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	clk := func(n int) messages.Clock {
		return messages.Clock{HLC: messages.HLC(n), Site: messages.SiteID{2}, ID: messages.EventID{byte(n)}}
	}
	rowOf := func(id, n int) persistence.Row {
		r := persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: messages.Columns{"id": messages.MustValue(id)}, Exists: true, Existence: clk(n)}
		if id%3 != 0 { // every third row has no cells
			r.Cells = map[string]persistence.Cell{
				"a": {Value: messages.MustValue(fmt.Sprintf("row %d at %d", id, n)), Clock: clk(n)},
				"b": {Value: messages.MustValue(n), Clock: clk(n)},
			}
		}
		return r
	}
	type updater interface {
		RowForUpdate(persistence.TableKey, []byte, messages.Columns) (persistence.Row, bool, error)
		RowWithKey(persistence.TableKey, []byte, messages.Columns) (persistence.Row, bool, error)
	}
	const rows = 30
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		for id := 0; id < rows; id++ {
			if err := tx.PutRow(rowOf(id, 1)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var changes []persistence.RowChange
	if err := s.Update(ctx, func(ptx persistence.SyncTx) error {
		tx := ptx.(updater)
		for round := 2; round < 5; round++ {
			for id := 0; id < rows; id++ {
				if id%2 == 0 && round == 2 {
					continue // these stay on disk until round 3
				}
				key := messages.Columns{"id": messages.MustValue(id)}
				rk := key.Encode()
				want, _, err := tx.RowWithKey(tk, rk, key)
				if err != nil {
					return err
				}
				got, ok, err := tx.RowForUpdate(tk, rk, key)
				if err != nil || !ok {
					return fmt.Errorf("row %d round %d: %v %v", id, round, ok, err)
				}
				if err := sameRow(got, want); err != nil {
					return fmt.Errorf("row %d round %d: RowForUpdate and RowWithKey differ: %v", id, round, err)
				}
				// Changing a value in place touches only the lent copy.
				for _, c := range got.Cells {
					for i := range c.Value {
						c.Value[i] ^= 0xff
					}
				}
				again, _, err := tx.RowForUpdate(tk, rk, key)
				if err != nil {
					return err
				}
				if err := sameRow(again, want); err != nil {
					return fmt.Errorf("row %d round %d after an in-place change: %v", id, round, err)
				}
				// The apply path: change the lent row, put it, log it.
				next := rowOf(id, round)
				if again.Cells == nil {
					again.Cells = map[string]persistence.Cell{}
				}
				for n, c := range next.Cells {
					again.Cells[n] = c
				}
				again.Existence = next.Existence
				if err := ptx.PutRow(again); err != nil {
					return err
				}
				ch := persistence.RowChange{Schema: tk.Schema, Table: tk.Table, Key: key, Exists: true, Existence: again.Existence,
					Cells: again.Cells, Cause: persistence.CauseEvent, Event: again.Existence}
				if _, err := ptx.AppendChange(ch); err != nil {
					return err
				}
				ch.Cells = rowOf(id, round).Cells // what it held when logged
				changes = append(changes, ch)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err := s.View(ctx, func(r persistence.SyncReader) error {
		for id := 0; id < rows; id++ {
			got, ok, err := r.Row(tk, messages.Columns{"id": messages.MustValue(id)}.Encode())
			if err != nil || !ok {
				return fmt.Errorf("row %d: %v %v", id, ok, err)
			}
			want := rowOf(id, 4)
			if id%3 == 0 {
				want.Cells = nil
			}
			if err := sameRow(got, want); err != nil {
				return fmt.Errorf("row %d: %v", id, err)
			}
		}
		i := 0
		err := r.ChangesAfter(tk, 0, 0, func(c persistence.RowChange) (bool, error) {
			w := changes[i]
			if c.Event != w.Event || len(c.Cells) != len(w.Cells) {
				return false, fmt.Errorf("change %d: %+v, want %+v", i, c, w)
			}
			for n, cell := range w.Cells {
				if !cell.Value.Equal(c.Cells[n].Value) {
					return false, fmt.Errorf("change %d cell %s: %v, want %v", i, n, c.Cells[n].Value, cell.Value)
				}
			}
			i++
			return true, nil
		})
		if err == nil && i != len(changes) {
			err = fmt.Errorf("%d changes, want %d", i, len(changes))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sameRow compares two rows field by field (cells by value and clock).
func sameRow(a, b persistence.Row) error {
	if a.Schema != b.Schema || a.Table != b.Table || a.Exists != b.Exists || a.Existence != b.Existence || a.Tomb != b.Tomb ||
		!bytes.Equal(a.Key.Encode(), b.Key.Encode()) || len(a.Cells) != len(b.Cells) {
		return fmt.Errorf("%+v vs %+v", a, b)
	}
	for n, c := range a.Cells {
		if d, ok := b.Cells[n]; !ok || !c.Value.Equal(d.Value) || c.Clock != d.Clock {
			return fmt.Errorf("cell %q: %+v vs %+v", n, c, d)
		}
	}
	return nil
}

// TestOnlyBatchWritersKeepTheirScratch: a store whose transaction wrote a
// batch keeps that transaction's scratch for its next one (the pool loses
// it to garbage collections between two group commits); a store writing
// small transactions keeps none (the many stores of a hosting node hold
// nothing while idle), and Close drops what a store kept.
func TestOnlyBatchWritersKeepTheirScratch(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	raw := make([]byte, 193)
	base := uint64(1_700_000_000_000)
	applyPathBatch(t, db.Sync(), base, 0, 2, raw)
	if db.scratch.Load() != nil {
		t.Fatal("a store writing two events kept its transaction's scratch")
	}
	applyPathBatch(t, db.Sync(), base, 2, 2000, raw)
	kept := db.scratch.Load()
	if kept == nil || len(kept.chunks) < keepScratchChunks || kept.used != 0 {
		t.Fatalf("a store writing a batch of 2 000 events kept %+v", kept)
	}
	applyPathBatch(t, db.Sync(), base, 2002, 2000, raw)
	if db.scratch.Load() != kept {
		t.Fatal("the next batch did not reuse the kept scratch")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if db.scratch.Load() != nil {
		t.Fatal("Close left the kept scratch")
	}
}

// TestUnchangedLentRowIsNotRewritten: PutRow of the row RowForUpdate lent,
// unchanged (an event that won no cell), writes nothing — a commit of only
// such rows writes no row page — while every other write still lands: a
// changed row, a row put back to its lent state after a change in between,
// another row's key with the lent bytes, and a row lent from this
// transaction's own writes.
func TestUnchangedLentRowIsNotRewritten(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	s := db.Sync()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	keyOf := func(id int) messages.Columns { return messages.Columns{"id": messages.MustValue(id)} }
	rowOf := func(id int, v string) persistence.Row {
		c := messages.Clock{HLC: 5, Site: messages.SiteID{3}, ID: messages.EventID{byte(id)}}
		return persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: keyOf(id), Exists: true, Existence: c,
			Cells: map[string]persistence.Cell{"v": {Value: messages.MustValue(v), Clock: c}}}
	}
	type updater interface {
		RowForUpdate(persistence.TableKey, []byte, messages.Columns) (persistence.Row, bool, error)
	}
	lend := func(tx persistence.SyncTx, id int) persistence.Row {
		r, ok, err := tx.(updater).RowForUpdate(tk, keyOf(id).Encode(), keyOf(id))
		if err != nil || !ok {
			t.Fatalf("RowForUpdate %d: %v %v", id, ok, err)
		}
		return r
	}
	const rows = 400 // many pages of rows
	update := func(fn func(tx persistence.SyncTx) error) (pages int64) {
		t.Helper()
		st := db.bolt.Stats().TxStats
		before := st.GetWrite()
		if err := s.Update(ctx, fn); err != nil {
			t.Fatal(err)
		}
		st = db.bolt.Stats().TxStats
		return st.GetWrite() - before
	}
	full := update(func(tx persistence.SyncTx) error {
		for id := 0; id < rows; id++ {
			if err := tx.PutRow(rowOf(id, fmt.Sprintf("first %d %s", id, bytes.Repeat([]byte{'-'}, 40)))); err != nil {
				return err
			}
		}
		return nil
	})
	unchanged := update(func(tx persistence.SyncTx) error {
		for id := 0; id < rows; id++ {
			if err := tx.PutRow(lend(tx, id)); err != nil {
				return err
			}
		}
		return nil
	})
	// The rows take many pages; a commit writes its meta and freelist.
	if unchanged > 3 || full < 10 {
		t.Fatalf("a commit of %d unchanged lent rows wrote %d pages (writing them wrote %d)", rows, unchanged, full)
	}
	want := map[int]string{}
	update(func(tx persistence.SyncTx) error {
		// 1: changed.
		r := lend(tx, 1)
		r.Cells["v"] = rowOf(1, "changed").Cells["v"]
		want[1] = "changed"
		if err := tx.PutRow(r); err != nil {
			return err
		}
		// 2: lent, changed and put, then put back as lent: stored as lent.
		orig := lend(tx, 2)
		before := orig.Cells["v"]
		if err := tx.PutRow(rowOf(2, "in between")); err != nil {
			return err
		}
		orig.Cells["v"] = before
		if err := tx.PutRow(orig); err != nil {
			return err
		}
		want[2] = fmt.Sprintf("first %d %s", 2, bytes.Repeat([]byte{'-'}, 40))
		// 3's bytes under 4's key: 4 holds 3's cells (the key is not in
		// the record).
		r = lend(tx, 3)
		r.Key = keyOf(4)
		if err := tx.PutRow(r); err != nil {
			return err
		}
		want[4] = fmt.Sprintf("first %d %s", 3, bytes.Repeat([]byte{'-'}, 40))
		// 5: put in this transaction, lent from it, put unchanged.
		if err := tx.PutRow(rowOf(5, "this transaction's")); err != nil {
			return err
		}
		if err := tx.PutRow(lend(tx, 5)); err != nil {
			return err
		}
		want[5] = "this transaction's"
		return nil
	})
	err := s.View(ctx, func(r persistence.SyncReader) error {
		for id := 0; id < rows; id++ {
			v, ok := want[id]
			if !ok {
				v = fmt.Sprintf("first %d %s", id, bytes.Repeat([]byte{'-'}, 40))
			}
			got, found, err := r.Row(tk, keyOf(id).Encode())
			if err != nil || !found {
				return fmt.Errorf("row %d: %v %v", id, found, err)
			}
			if !got.Cells["v"].Value.Equal(messages.MustValue(v)) {
				return fmt.Errorf("row %d holds %v, want %q", id, got.Cells["v"].Value, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFailedTransactionsRowsStayOut: a transaction that fails after
// writing rows leaves them in its rows-to-put map unflushed; the scratch
// it gives back (kept by the store: the transaction wrote a batch) must
// not bring them into the next transaction, which would put them.
func TestFailedTransactionsRowsStayOut(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	s := db.Sync()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	row := func(id int) persistence.Row {
		c := messages.Clock{HLC: 9, Site: messages.SiteID{4}, ID: messages.EventID{1}}
		return persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: messages.Columns{"id": messages.MustValue(id)}, Exists: true, Existence: c,
			Cells: map[string]persistence.Cell{"v": {Value: messages.MustValue(fmt.Sprintf("row %d %s", id, bytes.Repeat([]byte{'.'}, 100))), Clock: c}}}
	}
	errFail := errors.New("fail on purpose")
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		for id := 1; id <= 2000; id++ {
			if err := tx.PutRow(row(id)); err != nil {
				return err
			}
		}
		return errFail
	})
	if !errors.Is(err, errFail) {
		t.Fatal(err)
	}
	if db.scratch.Load() == nil {
		t.Fatal("the failed batch's scratch was not kept: the test reuses nothing")
	}
	if err := s.Update(ctx, func(tx persistence.SyncTx) error { return tx.PutRow(row(0)) }); err != nil {
		t.Fatal(err)
	}
	// Counted in the bucket, whatever the keys: stale entries would be
	// put under the poisoned bytes of their keys.
	err = db.bolt.View(func(tx *bbolt.Tx) error {
		if n := tx.Bucket(bucketSyncRows).Stats().KeyN; n != 1 {
			return fmt.Errorf("%d rows stored, want the one committed", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
