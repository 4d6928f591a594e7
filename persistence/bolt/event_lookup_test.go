package bolt

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Event answers a miss with one seek to the (site, HLC) prefix and lets
// the EventIDsAt that follows skip its own search when that prefix is
// empty. Within one transaction every answer must stay what a fresh search
// gives: after appends at the same (site, HLC), with many events there,
// and for another HLC.
func TestEventLookupAndEventIDsAtAgreeWithinATransaction(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	site := messages.SiteID{9}
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	ev := func(first byte, h messages.HLC) persistence.StoredEvent {
		return persistence.StoredEvent{ID: persistence.EventID{first, 1}, Raw: []byte{first}, Site: site, HLC: h,
			Schema: tk.Schema, Table: tk.Table, RowKey: messages.Columns{"k": messages.MustValue(int(first))}.Encode()}
	}
	idsAt := func(tx persistence.SyncTx, h messages.HLC, want ...byte) {
		t.Helper()
		got, err := tx.EventIDsAt(site, h, 0)
		if err != nil {
			t.Fatal(err)
		}
		var w []persistence.EventID
		for _, f := range want {
			w = append(w, ev(f, h).ID)
		}
		if !slices.Equal(got, w) {
			t.Fatalf("EventIDsAt(%v) = %x, want %x", h, got, w)
		}
	}
	lookup := func(tx persistence.SyncTx, e persistence.StoredEvent, wantSeq uint64) {
		t.Helper()
		got, ok, err := tx.Event(e.Site, e.HLC, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ok != (wantSeq != 0) || ok && (got.Seq != wantSeq || got.ID != e.ID) {
			t.Fatalf("Event(%x) = seq %d, ok %v; want seq %d", e.ID[:2], got.Seq, ok, wantSeq)
		}
	}
	err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		lookup(tx, ev(1, 5), 0)
		idsAt(tx, 5) // none there
		seq1, err := tx.AppendEvent(ev(1, 5))
		if err != nil {
			return err
		}
		idsAt(tx, 5, 1) // the append made the empty answer stale
		lookup(tx, ev(1, 5), seq1)
		lookup(tx, ev(4, 5), 0)
		idsAt(tx, 5, 1)
		var seqs []uint64
		for _, f := range []byte{2, 3, 4} {
			s, err := tx.AppendEvent(ev(f, 5))
			if err != nil {
				return err
			}
			seqs = append(seqs, s)
		}
		// Three others before it: the lookup past the prefix walk.
		lookup(tx, ev(4, 5), seqs[2])
		lookup(tx, ev(2, 5), seqs[0])
		lookup(tx, ev(5, 5), 0)
		idsAt(tx, 5, 1, 2, 3, 4)
		lookup(tx, ev(1, 6), 0) // an empty (site, 6) says nothing of (site, 5)
		idsAt(tx, 5, 1, 2, 3, 4)
		idsAt(tx, 6)
		if _, err := tx.AppendEvent(ev(7, 6)); err != nil {
			return err
		}
		idsAt(tx, 6, 7)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkEventMissLookups compares, call by call in one transaction
// over a store of 100 000 events, the apply path's lookups of a new event
// (Event misses, then EventIDsAt) with the two searches they were before
// this change (an exact seek, then a prefix seek).
func BenchmarkEventMissLookups(b *testing.B) {
	db := mustOpen(b, filepath.Join(b.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	raw := make([]byte, 193)
	for i := 0; i < 100_000; i += 2000 {
		sameRowsBatch(b, db.Sync(), i, 2000, raw)
	}
	var now, before time.Duration
	err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		tx := r.(*syncTx)
		for i := 0; b.Loop(); i++ {
			// A new event: a fresh HLC of one of the store's sites (as
			// the workload's are), so the searches end at the tail of
			// that site's range.
			j := (i * 7919) % 100_000
			id := persistence.EventID{byte(j >> 16), byte(j >> 8), byte(j), 0xee}
			site, h := messages.SiteID{byte(1 + j%4)}, messages.HLC(1<<41+i)
			nowFn := func() {
				if _, ok, err := tx.Event(site, h, id); err != nil || ok {
					b.Fatal("found", err)
				}
				if ids, err := tx.EventIDsAt(site, h, 2); err != nil || len(ids) != 0 {
					b.Fatal("stamped", ids, err)
				}
			}
			beforeFn := func() {
				if get(&tx.idsCur, tx.ids, eventKey(tx.keyBuf[:0], site, h, id)) != nil {
					b.Fatal("found")
				}
				if ids, err := eventIDsAt(tx.idsCur, site, h, 2, nil); err != nil || len(ids) != 0 {
					b.Fatal("stamped", ids, err)
				}
			}
			// Each goes first every other call: the second finds the
			// pages the first brought into the cache.
			first, second, fd, sd := nowFn, beforeFn, &now, &before
			if i%2 == 1 {
				first, second, fd, sd = beforeFn, nowFn, &before, &now
			}
			t0 := time.Now()
			first()
			t1 := time.Now()
			second()
			*fd, *sd = *fd+t1.Sub(t0), *sd+time.Since(t1)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(now.Nanoseconds())/float64(b.N), "now-ns")
	b.ReportMetric(float64(before.Nanoseconds())/float64(b.N), "before-ns")
	b.ReportMetric(float64(now)/float64(before), "now/before")
}
