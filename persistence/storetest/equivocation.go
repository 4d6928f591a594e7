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

// SiteEventIDs lists one site's retained events of an HLC range, in
// (HLC, id) order, inclusive at both ends, in the writing transaction
// and after a restart, stops when fn says so, and forgets reclaimed ones.
func testSiteEventIDs(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	at := func(n int, site messages.SiteID, h messages.HLC) persistence.StoredEvent {
		e := mkEvent(n, tblX, key(n).Encode(), h)
		e.Site = site
		return e
	}
	type hid struct {
		h  messages.HLC
		id persistence.EventID
	}
	list := func(r persistence.SyncReader, site messages.SiteID, from, to messages.HLC, limit int) []hid {
		t.Helper()
		var out []hid
		err := r.SiteEventIDs(site, from, to, func(h messages.HLC, id persistence.EventID) (bool, error) {
			out = append(out, hid{h, id})
			return limit <= 0 || len(out) < limit, nil
		})
		if err != nil {
			t.Fatalf("SiteEventIDs: %v", err)
		}
		return out
	}
	want := func(pairs ...any) []hid {
		var out []hid
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, hid{messages.HLC(pairs[i].(int)), eventID(pairs[i+1].(int))})
		}
		return out
	}
	both := func(a, b int) (int, int) {
		x, y := eventID(a), eventID(b)
		if bytes.Compare(x[:], y[:]) < 0 {
			return a, b
		}
		return b, a
	}
	lo, hi := both(1, 3)
	update(t, s, func(tx persistence.SyncTx) error {
		for _, e := range []persistence.StoredEvent{at(3, siteA, 5), at(2, siteA, 7), at(1, siteA, 5), at(4, siteB, 6), at(5, siteA, 9)} {
			if _, err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		if got := list(tx, siteA, 5, 7, 0); !slices.Equal(got, want(5, lo, 5, hi, 7, 2)) {
			t.Fatalf("in the writing transaction: %v", got)
		}
		return nil
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		for _, c := range []struct {
			site     messages.SiteID
			from, to messages.HLC
			limit    int
			want     []hid
		}{
			{siteA, 0, 100, 0, want(5, lo, 5, hi, 7, 2, 9, 5)},
			{siteA, 6, 9, 0, want(7, 2, 9, 5)},
			{siteA, 6, 6, 0, nil},
			{siteA, 9, 5, 0, nil},
			{siteA, 0, 100, 2, want(5, lo, 5, hi)},
			{siteB, 0, 100, 0, want(6, 4)},
		} {
			if got := list(r, c.site, c.from, c.to, c.limit); !slices.Equal(got, c.want) {
				t.Fatalf("SiteEventIDs(%v, %v, %v) = %v, want %v", c.site, c.from, c.to, got, c.want)
			}
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.DeleteEventsBelow(tblX, 7)
		return err
	})
	view(t, s, func(r persistence.SyncReader) error {
		if got := list(r, siteA, 0, 100, 0); !slices.Equal(got, want(7, 2, 9, 5)) {
			t.Fatalf("after reclamation: %v", got)
		}
		return nil
	})
}
