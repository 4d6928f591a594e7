package storetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func tableKeys(t *testing.T, r persistence.SyncReader, tk persistence.TableKey, min messages.HLC) []persistence.EventKey {
	t.Helper()
	var out []persistence.EventKey
	if err := r.TableEventKeys(tk, min, func(k persistence.EventKey) (bool, error) {
		out = append(out, k)
		return true, nil
	}); err != nil {
		t.Fatalf("TableEventKeys: %v", err)
	}
	return out
}

// testTableEventKeys: the range API lists exactly the table's retained
// events at or above the bound, in (site, HLC, id) order, whatever the
// order they were appended in; each key reads back its signed bytes;
// deleted events leave it; fn stops it and its error propagates; it works
// in a read transaction and after reopen.
func testTableEventKeys(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	ev := func(n int, site messages.SiteID, tk persistence.TableKey, h messages.HLC) persistence.StoredEvent {
		e := mkEvent(n, tk, []byte("r"), h)
		e.Site = site
		return e
	}
	evs := []persistence.StoredEvent{
		ev(1, siteB, tblX, 10),
		ev(2, siteA, tblX, 30),
		ev(3, siteA, tblX, 10),
		ev(4, siteB, tblX, 5),
		ev(5, siteA, tblAB, 10), // another table
		ev(6, siteA, tblBC, 10), // a table whose concatenated name collides
		ev(7, siteA, tblX, 20),
		ev(8, siteA, tblX, 20), // equal (site, HLC): ordered by id
	}
	appendAll(t, s, evs...)
	want := func(min messages.HLC) []persistence.EventKey {
		var out []persistence.EventKey
		for _, e := range evs {
			if e.Schema == tblX.Schema && e.Table == tblX.Table && e.HLC >= min {
				out = append(out, persistence.EventKey{Site: e.Site, HLC: e.HLC, ID: e.ID})
			}
		}
		slices.SortFunc(out, persistence.EventKey.Compare)
		return out
	}
	check := func(r persistence.SyncReader) {
		for _, min := range []messages.HLC{0, 5, 6, 10, 20, 30, 31} {
			if got := tableKeys(t, r, tblX, min); !slices.Equal(got, want(min)) {
				t.Fatalf("TableEventKeys(min %d) = %v, want %v", min, got, want(min))
			}
		}
		if got := tableKeys(t, r, tblAB, 0); len(got) != 1 || got[0].ID != eventID(5) {
			t.Fatalf("TableEventKeys(other table) = %v", got)
		}
		if got := tableKeys(t, r, persistence.TableKey{Schema: "none", Table: "x"}, 0); len(got) != 0 {
			t.Fatalf("TableEventKeys(undefined) = %v", got)
		}
		for _, k := range tableKeys(t, r, tblX, 0) {
			got, ok, err := r.Event(k.Site, k.HLC, k.ID)
			if err != nil || !ok || got.Schema != tblX.Schema || got.Table != tblX.Table || len(got.Raw) == 0 {
				t.Fatalf("Event(%v) = %+v, %v, %v", k, got, ok, err)
			}
		}
		n := 0
		if err := r.TableEventKeys(tblX, 0, func(persistence.EventKey) (bool, error) { n++; return n < 2, nil }); err != nil || n != 2 {
			t.Fatalf("stop after 2: visited %d, %v", n, err)
		}
		if err := r.TableEventKeys(tblX, 0, func(persistence.EventKey) (bool, error) { return true, errFn }); !errors.Is(err, errFn) {
			t.Fatalf("callback error: %v", err)
		}
	}
	view(t, s, func(r persistence.SyncReader) error { check(r); return nil })
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error { check(r); return nil })
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.DeleteEventsBelow(tblX, 20)
		return err
	})
	evs = slices.DeleteFunc(evs, func(e persistence.StoredEvent) bool { return e.Table == tblX.Table && e.HLC < 20 })
	view(t, s, func(r persistence.SyncReader) error { check(r); return nil })
}
