package storetest

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// testRecordsKeptAcrossTransactions: a store may reuse the memory of one
// transaction's records in the next (bolt lends each write transaction
// the chunks the previous one filled). Whatever it reuses, every record a
// committed transaction wrote reads back intact after many later
// transactions — events of every size (past a chunk's share too), rows
// rewritten round after round, change records — and so do the values a
// caller was handed inside an earlier transaction; a transaction that
// fails after writing leaves nothing, and its records never show through
// later ones.
func testRecordsKeptAcrossTransactions(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	const rounds, perRound = 12, 40
	var kept []persistence.StoredEvent
	var dropped []persistence.EventID
	rows := map[string]persistence.Row{} // by encoded key, as committed
	changes := []persistence.RowChange{} // as committed, in order
	var handed []persistence.Row         // rows read inside earlier transactions
	var handedWant []persistence.Row     // what they held then
	var handedEvents []persistence.StoredEvent
	rawOf := func(n int) []byte {
		size := 1 + (n*997)%900
		if n%29 == 0 {
			size = 20_000 // larger than a chunk's share: allocated alone
		}
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(n + i*7)
		}
		return b
	}
	rowOf := func(round, id int) persistence.Row {
		c := messages.Clock{HLC: messages.HLC(1000*round + id + 1), Site: siteB, ID: eventID(round*perRound + id)}
		return persistence.Row{
			Schema: tblX.Schema, Table: tblX.Table, Key: key(id), Exists: round%2 == 0, Existence: c,
			Cells: map[string]persistence.Cell{
				"v": {Value: messages.MustValue(fmt.Sprintf("round %d row %d %s", round, id, bytes.Repeat([]byte{'x'}, id*round%50))), Clock: c},
				"n": {Value: messages.MustValue(round*1000 + id), Clock: c},
			},
		}
	}
	for round := 0; round < rounds; round++ {
		fail := round%4 == 2
		var evs []persistence.StoredEvent
		var rs []persistence.Row
		var cs []persistence.RowChange
		err := s.Update(ctx, func(tx persistence.SyncTx) error {
			evs, rs, cs = nil, nil, nil
			for i := 0; i < perRound; i++ {
				n := round*perRound + i
				ev := persistence.StoredEvent{ID: eventID(n), Raw: rawOf(n), Site: siteA, HLC: messages.HLC(n + 1),
					Schema: tblX.Schema, Table: tblX.Table, RowKey: key(i % 9).Encode()}
				seq, err := tx.AppendEvent(ev)
				if err != nil {
					return err
				}
				ev.Seq = seq
				evs = append(evs, ev)
				// Rows 0..8 rewritten every round, several times in one.
				r := rowOf(round, i%9)
				if err := tx.PutRow(r); err != nil {
					return err
				}
				rs = append(rs, r)
				c := persistence.RowChange{Schema: r.Schema, Table: r.Table, Key: r.Key, Exists: r.Exists,
					Existence: r.Existence, Cells: r.Cells, Cause: persistence.CauseEvent, Event: r.Existence}
				if i%5 == 0 {
					c.Cleared = []string{fmt.Sprintf("gone-%d", n)}
				}
				seq, err = tx.AppendChange(c)
				if err != nil {
					return err
				}
				c.Seq = seq
				cs = append(cs, c)
			}
			// Read back in the writing transaction, after the writes.
			for _, ev := range evs {
				checkEvent(t, tx, ev)
			}
			got, ok, err := tx.Row(tblX, key(3).Encode())
			if err != nil || !ok {
				return fmt.Errorf("row 3 in its writing transaction: %v %v", ok, err)
			}
			if err := sameRow(got, rowOf(round, 3)); err != nil {
				return fmt.Errorf("row 3 in its writing transaction: %w", err)
			}
			if !fail {
				handed, handedWant = append(handed, got), append(handedWant, rowOf(round, 3))
				e, _, err := tx.Event(evs[0].Site, evs[0].HLC, evs[0].ID)
				if err != nil {
					return err
				}
				handedEvents = append(handedEvents, e)
			}
			if fail {
				return errFn
			}
			return nil
		})
		if fail {
			mustErrIs(t, fmt.Sprintf("round %d", round), err, errFn)
			for _, ev := range evs {
				dropped = append(dropped, ev.ID)
			}
			continue
		}
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		kept = append(kept, evs...)
		for _, r := range rs {
			rows[string(r.Key.Encode())] = r
		}
		changes = append(changes, cs...)
	}
	check := func(s persistence.SyncStore) {
		t.Helper()
		view(t, s, func(r persistence.SyncReader) error {
			got := after(t, r, 0, 0)
			if len(got) != len(kept) {
				t.Fatalf("%d events retained, want %d", len(got), len(kept))
			}
			for i, ev := range kept {
				if !sameEvent(got[i], ev) {
					t.Fatalf("event %d (seq %d) read back as %+v", i, ev.Seq, got[i])
				}
				checkEvent(t, r, ev)
			}
			for _, id := range dropped {
				for _, ev := range got {
					if ev.ID == id {
						t.Fatalf("event %s of a failed transaction retained", id)
					}
				}
			}
			for _, want := range rows {
				checkRow(t, r, want)
			}
			var gotChanges []persistence.RowChange
			if err := r.ChangesAfter(tblX, 0, 0, func(c persistence.RowChange) (bool, error) {
				gotChanges = append(gotChanges, c)
				return true, nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(gotChanges) != len(changes) {
				t.Fatalf("%d changes, want %d", len(gotChanges), len(changes))
			}
			for i := range changes {
				if !reflect.DeepEqual(gotChanges[i], changes[i]) {
					t.Fatalf("change %d:\n got %+v\nwant %+v", i, gotChanges[i], changes[i])
				}
			}
			return nil
		})
		for i := range handed {
			if err := sameRow(handed[i], handedWant[i]); err != nil {
				t.Fatalf("row handed out in committed transaction %d changed since: %v", i, err)
			}
			if want := kept[i*perRound]; !sameEvent(handedEvents[i], want) {
				t.Fatalf("event handed out in committed transaction %d changed since: %+v", i, handedEvents[i])
			}
		}
	}
	check(s)
	check(reopen())
	if len(dropped) == 0 || len(handed) == 0 {
		t.Fatal("the test exercised no failed or no committed transaction")
	}
}
