package storetest

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// testPreparedEvents: events prepared ahead of their transaction
// (PrepareEvents) are stored exactly as unprepared ones — the same bytes
// read back, after reopen too, and range sums equal to the scan — whether
// all of a prepared group is appended in one transaction, most of it, a
// few of it in a later one, or some of it deleted again in the appending
// transaction; and a preparation made for other bytes (misattached, or
// the bytes replaced) is not used: the event is stored and summed as its
// own.
func testPreparedEvents(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	var evs []persistence.StoredEvent
	mk := func(n int, tk persistence.TableKey, site messages.SiteID) {
		ev := mkEvent(n, tk, []byte{byte(n % 2)}, messages.HLC(10*n))
		ev.Site = site
		evs = append(evs, ev)
	}
	for n := 0; n < 6; n++ { // group A: (tblX, siteA), appended whole, two deleted in the same transaction
		mk(n, tblX, siteA)
	}
	for n := 6; n < 12; n++ { // group B: (tblAB, siteB): four appended first, two later
		mk(n, tblAB, siteB)
	}
	mk(12, tblBC, siteA) // misattached preparation
	mk(13, tblBC, siteB) // bytes replaced after preparing
	ptrs := make([]*persistence.StoredEvent, 0, len(evs))
	for i := range evs[:12] {
		ptrs = append(ptrs, &evs[i])
	}
	ptrs = append(ptrs, &evs[13])
	s.PrepareEvents(ptrs)
	for i, p := range ptrs {
		if p.Prepared == nil {
			t.Fatalf("PrepareEvents left event %d unprepared", i)
		}
	}
	evs[12].Prepared = evs[0].Prepared
	evs[13].Raw = append([]byte("changed-"), evs[13].Raw...)

	var kept []persistence.StoredEvent
	appendIn := func(tx persistence.SyncTx, list ...persistence.StoredEvent) error {
		for _, ev := range list {
			seq, err := tx.AppendEvent(ev)
			if err != nil {
				return err
			}
			ev.Seq = seq
			kept = append(kept, ev)
		}
		return nil
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := appendIn(tx, evs[0:10]...); err != nil {
			return err
		}
		if err := appendIn(tx, evs[12:14]...); err != nil {
			return err
		}
		// Events 0 and 1 of group A (HLC 0 and 10) go again at once.
		n, err := tx.DeleteEventsBelow(tblX, 20)
		if n != 2 {
			t.Fatalf("DeleteEventsBelow removed %d events, want 2", n)
		}
		return err
	})
	kept = kept[2:]
	update(t, s, func(tx persistence.SyncTx) error { return appendIn(tx, evs[10:12]...) })
	check := func(s persistence.SyncStore) {
		t.Helper()
		view(t, s, func(r persistence.SyncReader) error {
			for _, ev := range kept {
				checkEvent(t, r, ev)
			}
			for _, ev := range evs[:2] {
				checkNoEvent(t, r, ev.ID)
			}
			checkSums(t, r, 0, 25, 95)
			return nil
		})
	}
	check(s)
	for _, p := range ptrs {
		p.Prepared.Release()
	}
	check(s)
	check(reopen())
}
