package storetest

import (
	"errors"
	"reflect"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func sampleChange(tk persistence.TableKey, id any, cause persistence.ChangeCause) persistence.RowChange {
	r := sampleRow(tk, id)
	c := persistence.RowChange{Schema: tk.Schema, Table: tk.Table, Key: r.Key, Exists: r.Exists,
		Existence: r.Existence, Tomb: r.Tomb, Cells: r.Cells, Cleared: []string{"gone"}, Cause: cause}
	if cause == persistence.CauseEvent {
		c.Event = messages.Clock{HLC: 7, Site: siteA, ID: eventID(7)}
	}
	return c
}

func changesOf(t *testing.T, r persistence.SyncReader, tk persistence.TableKey, after uint64, limit int) []persistence.RowChange {
	t.Helper()
	var out []persistence.RowChange
	if err := r.ChangesAfter(tk, after, limit, func(c persistence.RowChange) (bool, error) {
		out = append(out, c)
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func changeSeqs(cs []persistence.RowChange) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.Seq)
	}
	return out
}

// testChangeLog: AppendChange assigns dense sequences across tables, a
// change reads back field for field, per table (tables whose names
// collide when concatenated stay apart), in order, with limit and stop;
// TrimChanges keeps exactly the newest keep (at and past the edge) and
// never lets a sequence be reused, across a failed Update and a reopen.
func testChangeLog(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	view(t, s, func(r persistence.SyncReader) error {
		if o, l, err := r.ChangeBounds(); err != nil || o != 0 || l != 0 {
			t.Fatalf("empty log bounds = %d, %d, %v", o, l, err)
		}
		if got := changesOf(t, r, tblAB, 0, 0); len(got) != 0 {
			t.Fatalf("empty log yields %v", got)
		}
		return nil
	})
	want := map[persistence.TableKey][]persistence.RowChange{}
	update(t, s, func(tx persistence.SyncTx) error {
		for i := 1; i <= 10; i++ {
			tk, cause := tblAB, persistence.CauseEvent
			if i%3 == 0 {
				tk, cause = tblBC, persistence.CauseAddColumn
			}
			c := sampleChange(tk, i, cause)
			seq, err := tx.AppendChange(c)
			if err != nil {
				return err
			}
			if seq != uint64(i) {
				t.Fatalf("change %d got seq %d", i, seq)
			}
			c.Seq = seq
			want[tk] = append(want[tk], c)
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		for tk, w := range want {
			if got := changesOf(t, r, tk, 0, 0); !reflect.DeepEqual(got, w) {
				t.Fatalf("%v changes:\n got %+v\nwant %+v", tk, got, w)
			}
		}
		if got := changeSeqs(changesOf(t, r, tblAB, 2, 2)); !reflect.DeepEqual(got, []uint64{4, 5}) {
			t.Fatalf("after 2, limit 2: %v", got)
		}
		n := 0
		if err := r.ChangesAfter(tblAB, 0, 0, func(persistence.RowChange) (bool, error) { n++; return n < 3, nil }); err != nil || n != 3 {
			t.Fatalf("stop after 3: visited %d, %v", n, err)
		}
		if err := r.ChangesAfter(tblAB, 0, 0, func(persistence.RowChange) (bool, error) { return true, errFn }); !errors.Is(err, errFn) {
			t.Fatalf("callback error: %v", err)
		}
		if got := changesOf(t, r, tblX, 0, 0); len(got) != 0 {
			t.Fatalf("another table's changes: %v", got)
		}
		return nil
	})
	// A failed Update consumes nothing.
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendChange(sampleChange(tblX, 1, persistence.CauseEvent)); err != nil {
			return err
		}
		return errFn
	}); !errors.Is(err, errFn) {
		t.Fatalf("failing update: %v", err)
	}
	// Trim: at the edge nothing goes; past it the oldest go.
	update(t, s, func(tx persistence.SyncTx) error {
		if n, err := tx.TrimChanges(10, nil); err != nil || n != 0 {
			t.Fatalf("trim to 10 of 10: %d, %v", n, err)
		}
		if n, err := tx.TrimChanges(4, nil); err != nil || n != 6 {
			t.Fatalf("trim to 4 of 10: %d, %v", n, err)
		}
		return nil
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		if o, l, err := r.ChangeBounds(); err != nil || o != 7 || l != 10 {
			t.Fatalf("bounds after trim and reopen = %d, %d, %v; want 7, 10", o, l, err)
		}
		if got := changeSeqs(changesOf(t, r, tblAB, 0, 0)); !reflect.DeepEqual(got, []uint64{7, 8, 10}) {
			t.Fatalf("retained %v", got)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		if n, err := tx.TrimChanges(0, nil); err != nil || n != 4 {
			t.Fatalf("trim to 0: %d, %v", n, err)
		}
		if _, err := tx.AppendChange(persistence.RowChange{Schema: "s", Table: "t"}); !errors.Is(err, messages.ErrEmptyRowKey) {
			t.Fatalf("change without a key: %v", err)
		}
		seq, err := tx.AppendChange(sampleChange(tblX, 1, persistence.CauseEvent))
		if err != nil || seq != 11 {
			t.Fatalf("append after trimming everything: seq %d, %v; want 11", seq, err)
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		if o, l, err := r.ChangeBounds(); err != nil || o != 11 || l != 11 {
			t.Fatalf("bounds = %d, %d, %v; want 11, 11", o, l, err)
		}
		return nil
	})
}

// testChangeLogTrimmedAsItGrows: the apply path's pattern at scale — a
// transaction appends thousands of changes and then trims the log back to
// its limit, removing more entries than a storage page holds — keeps
// exactly the newest, in order, with dense sequences.
func testChangeLogTrimmedAsItGrows(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	const keep, per = 2500, 2000
	for round := 0; round < 3; round++ {
		update(t, s, func(tx persistence.SyncTx) error {
			for i := 0; i < per; i++ {
				if _, err := tx.AppendChange(sampleChange(tblAB, round*per+i, persistence.CauseEvent)); err != nil {
					return err
				}
			}
			n, err := tx.TrimChanges(keep, nil)
			if want := max(0, (round+1)*per-keep) - max(0, round*per-keep); err != nil || n != want {
				t.Fatalf("round %d: trimmed %d, %v; want %d", round, n, err, want)
			}
			// The transaction reads its own trim.
			if o, l, err := tx.ChangeBounds(); err != nil || l != uint64((round+1)*per) || l-o+1 != min(keep, uint64((round+1)*per)) {
				t.Fatalf("round %d: bounds %d, %d, %v", round, o, l, err)
			}
			return nil
		})
	}
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		got := changeSeqs(changesOf(t, r, tblAB, 0, 0))
		if len(got) != keep || got[0] != 3*per-keep+1 || got[len(got)-1] != 3*per {
			t.Fatalf("retained %d changes from %v to %v; want %d from %d to %d", len(got), got[:1], got[len(got)-1:], keep, 3*per-keep+1, 3*per)
		}
		for i := 1; i < len(got); i++ {
			if got[i] != got[i-1]+1 {
				t.Fatalf("retained sequences not dense at %d: %d after %d", i, got[i], got[i-1])
			}
		}
		return nil
	})
}

// testChangeLogTrimReportsTablesAndRaiseSkips: ChangeTablesAfter names
// the tables of the changes past a sequence, until told to stop;
// TrimChanges names the
// table and sequence of every change it deletes, oldest first;
// RaiseChangeSeq makes the next sequence follow the floor (never lower),
// the skipped sequences hold nothing, trimming counts them as sequences,
// and the raise survives a reopen.
func testChangeLogTrimReportsTablesAndRaiseSkips(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	other := persistence.TableKey{Schema: "a", Table: "other"}
	update(t, s, func(tx persistence.SyncTx) error {
		for i := 1; i <= 6; i++ {
			tk := tblAB
			if i%2 == 0 {
				tk = other
			}
			if _, err := tx.AppendChange(sampleChange(tk, i, persistence.CauseEvent)); err != nil {
				return err
			}
		}
		return nil
	})
	type trimmed struct {
		t   persistence.TableKey
		seq uint64
	}
	var got []trimmed
	view(t, s, func(r persistence.SyncReader) error {
		if err := r.ChangeTablesAfter(3, func(tk persistence.TableKey, seq uint64) bool {
			got = append(got, trimmed{tk, seq})
			return seq < 5
		}); err != nil {
			return err
		}
		if want := []trimmed{{other, 4}, {tblAB, 5}}; !reflect.DeepEqual(got, want) {
			t.Fatalf("ChangeTablesAfter(3) stopping at 5: %v, want %v", got, want)
		}
		got = nil
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		n, err := tx.TrimChanges(3, func(tk persistence.TableKey, seq uint64) { got = append(got, trimmed{tk, seq}) })
		if err != nil || n != 3 {
			t.Fatalf("trim: %d, %v", n, err)
		}
		return nil
	})
	if want := []trimmed{{tblAB, 1}, {other, 2}, {tblAB, 3}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("trimmed %v, want %v", got, want)
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.RaiseChangeSeq(2); err != nil { // below the last: nothing
			return err
		}
		if err := tx.RaiseChangeSeq(100); err != nil {
			return err
		}
		seq, err := tx.AppendChange(sampleChange(tblAB, 7, persistence.CauseEvent))
		if err != nil || seq != 101 {
			t.Fatalf("after a raise to 100: seq %d, %v", seq, err)
		}
		return nil
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		if o, l, err := r.ChangeBounds(); err != nil || o != 4 || l != 101 {
			t.Fatalf("bounds after the raise: %d..%d, %v", o, l, err)
		}
		if got := changeSeqs(changesOf(t, r, tblAB, 0, 0)); !reflect.DeepEqual(got, []uint64{5, 101}) {
			t.Fatalf("changes of the table: %v", got)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		// Keep the newest 50 sequences: everything below 52 goes, the
		// skipped ones counted.
		got = nil
		n, err := tx.TrimChanges(50, func(tk persistence.TableKey, seq uint64) { got = append(got, trimmed{tk, seq}) })
		if err != nil || n != 3 {
			t.Fatalf("trim across the raise: %d, %v (%v)", n, err, got)
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		if o, l, err := r.ChangeBounds(); err != nil || o != 101 || l != 101 {
			t.Fatalf("bounds after trimming across the raise: %d..%d, %v", o, l, err)
		}
		return nil
	})
}
