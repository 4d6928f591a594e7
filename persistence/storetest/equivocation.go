package storetest

import (
	"bytes"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// withID is a clock naming the event that set it.
func withID(c messages.Clock, n int) messages.Clock {
	c.ID = eventID(n)
	return c
}

// Row clocks keep the event id (the last tiebreak of an equal (HLC,
// site)): existence, tombstone and cells, a zero id beside a non-zero one,
// and across a reopen.
func testRowClocksKeepEventIDs(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	row := persistence.Row{
		Schema: tblX.Schema, Table: tblX.Table, Key: key(1),
		Exists: true, Existence: withID(clock(7, siteA), 1), Tomb: withID(clock(7, siteA), 2),
		Cells: map[string]persistence.Cell{
			"a": {Value: messages.MustValue("x"), Clock: withID(clock(7, siteA), 3)},
			"b": {Value: messages.Null, Clock: clock(5, siteB)}, // zero id (reclaimed before ids were kept)
			"c": {Value: messages.MustValue(1), Clock: withID(clock(0, siteB), 4)},
		},
	}
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutRow(row) })
	view(t, s, func(r persistence.SyncReader) error { checkRow(t, r, row); return nil })
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error { checkRow(t, r, row); return nil })
}

// EventIDsAt lists exactly the retained events of one (site, HLC),
// ascending, in the writing transaction and after commit, and forgets
// reclaimed ones.
func testEventIDsAt(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	at := func(n int, site messages.SiteID, h messages.HLC) persistence.StoredEvent {
		e := mkEvent(n, tblX, key(n).Encode(), h)
		e.Site = site
		return e
	}
	check := func(r persistence.SyncReader, site messages.SiteID, h messages.HLC, want ...int) {
		t.Helper()
		got, err := r.EventIDsAt(site, h, 0)
		if err != nil {
			t.Fatalf("EventIDsAt: %v", err)
		}
		var w []persistence.EventID
		for _, n := range want {
			w = append(w, eventID(n))
		}
		slices.SortFunc(w, func(a, b persistence.EventID) int { return bytes.Compare(a[:], b[:]) })
		if !slices.Equal(got, w) {
			t.Fatalf("EventIDsAt(%v, %v) = %x, want %x", site, h, got, w)
		}
	}
	update(t, s, func(tx persistence.SyncTx) error {
		check(tx, siteA, 5)
		for _, e := range []persistence.StoredEvent{at(3, siteA, 5), at(1, siteA, 5), at(2, siteA, 6), at(4, siteB, 5), at(5, siteA, 5)} {
			if _, err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		check(tx, siteA, 5, 1, 3, 5) // visible in the writing transaction
		if got, err := tx.EventIDsAt(siteA, 5, 2); err != nil || len(got) != 2 || got[0] != eventID(1) || got[1] != eventID(3) {
			t.Fatalf("EventIDsAt limit 2 = %x, %v; want the two lowest", got, err)
		}
		return nil
	})
	// A failed Update adds nothing.
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(at(6, siteA, 5)); err != nil {
			return err
		}
		return errFn
	}); err == nil {
		t.Fatal("failing Update succeeded")
	}
	view(t, s, func(r persistence.SyncReader) error {
		check(r, siteA, 5, 1, 3, 5)
		check(r, siteA, 6, 2)
		check(r, siteB, 5, 4)
		check(r, siteB, 6)
		check(r, siteA, 4)
		return nil
	})
	s = reopen()
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.DeleteEventsBelow(tblX, 6)
		return err
	})
	view(t, s, func(r persistence.SyncReader) error {
		check(r, siteA, 5)
		check(r, siteB, 5)
		check(r, siteA, 6, 2)
		return nil
	})
}
