package storetest

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"

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

// scanSum folds TableEventKeys from min into a RangeSum: what
// TableEventSum must equal.
func scanSum(t testing.TB, r persistence.SyncReader, tk persistence.TableKey, min messages.HLC) persistence.RangeSum {
	t.Helper()
	var s persistence.RangeSum
	if err := r.TableEventKeys(tk, min, func(k persistence.EventKey) (bool, error) {
		s.Add(k)
		return true, nil
	}); err != nil {
		t.Fatalf("TableEventKeys: %v", err)
	}
	return s
}

// sumTables and sumSites are the tables and signers the range-sum tests
// draw from (tblAB and tblBC collide when their names are concatenated).
var (
	sumTables = []persistence.TableKey{tblX, tblAB, tblBC}
	sumSites  = []messages.SiteID{siteA, siteB, {0xc1, 15: 0xcf}}
)

func checkSums(t testing.TB, r persistence.SyncReader, mins ...messages.HLC) {
	t.Helper()
	for _, tk := range append(sumTables, persistence.TableKey{Schema: "none", Table: "x"}) {
		for _, min := range mins {
			got, err := r.TableEventSum(tk, min)
			if err != nil {
				t.Fatalf("TableEventSum(%v, %d): %v", tk, min, err)
			}
			if want := scanSum(t, r, tk, min); got != want {
				t.Fatalf("TableEventSum(%v, %d): %d events, the scan %d (or their hashes differ)", tk, min, got.Count, want.Count)
			}
		}
	}
}

// testTableEventSum: the range aggregate equals the scan of the same keys
// after appends, evictions (DeleteEventsBelow) and purges of held events,
// in the writing transaction, after commit, after reopen, and unchanged by
// an Update that fails.
func testTableEventSum(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	ev := func(n int, site messages.SiteID, tk persistence.TableKey, h messages.HLC) persistence.StoredEvent {
		e := mkEvent(n, tk, []byte{byte(n % 3)}, h)
		e.Site = site
		return e
	}
	mins := []messages.HLC{0, 1, 10, 15, 20, 31, 1 << 40}
	var held uint64
	update(t, s, func(tx persistence.SyncTx) error {
		for n := 1; n <= 30; n++ {
			seq, err := tx.AppendEvent(ev(n, sumSites[n%3], sumTables[n%3], messages.HLC(n)))
			if err != nil {
				return err
			}
			if n == 7 {
				held = seq
			}
		}
		checkSums(t, tx, mins...) // visible in the writing transaction
		return tx.HoldEvent(persistence.GroupKey{Site: sumSites[1], Schema: sumTables[1].Schema, Table: sumTables[1].Table}, held)
	})
	view(t, s, func(r persistence.SyncReader) error { checkSums(t, r, mins...); return nil })
	if got, _ := sumOf(s, tblX, 0); got.Count != 10 {
		t.Fatalf("tblX holds %d events, want 10", got.Count)
	}
	// A failing Update leaves the sums as they were.
	before, _ := sumOf(s, tblX, 0)
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(ev(100, siteA, tblX, 3)); err != nil {
			return err
		}
		if _, err := tx.DeleteEventsBelow(tblX, 20); err != nil {
			return err
		}
		checkSums(t, tx, mins...)
		return errFn
	}); !errors.Is(err, errFn) {
		t.Fatalf("failing Update: %v", err)
	}
	if after, _ := sumOf(s, tblX, 0); after != before {
		t.Fatalf("a failed Update changed the sum: %d events, was %d", after.Count, before.Count)
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if _, err := tx.DeleteEventsBelow(tblX, 20); err != nil {
			return err
		}
		if _, err := tx.PurgeHeld(persistence.GroupKey{Site: sumSites[1], Schema: sumTables[1].Schema, Table: sumTables[1].Table}); err != nil {
			return err
		}
		if _, err := tx.AppendEvent(ev(31, siteB, tblX, 5)); err != nil { // below the eviction: retained until the next one
			return err
		}
		checkSums(t, tx, mins...)
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error { checkSums(t, r, mins...); return nil })
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error { checkSums(t, r, mins...); return nil })
	// Evicting everything leaves the empty sum.
	update(t, s, func(tx persistence.SyncTx) error {
		for _, tk := range sumTables {
			if _, err := tx.DeleteEventsBelow(tk, 1<<40); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		for _, tk := range sumTables {
			if got, err := r.TableEventSum(tk, 0); err != nil || got != (persistence.RangeSum{}) {
				t.Fatalf("sum of an emptied table: %d events, %v", got.Count, err)
			}
		}
		return nil
	})
}

func sumOf(s persistence.SyncStore, tk persistence.TableKey, min messages.HLC) (persistence.RangeSum, error) {
	var out persistence.RangeSum
	err := s.View(ctx, func(r persistence.SyncReader) error {
		var err error
		out, err = r.TableEventSum(tk, min)
		return err
	})
	return out, err
}

// testTableEventSumProperty: over random transactions of appends (any
// site, table and HLC, duplicates included), evictions to random
// horizons, holds and purges, some failing and some followed by a
// reopen, the aggregate always equals the scan, at random bounds.
func testTableEventSumProperty(t *testing.T, open OpenFunc) {
	rapid.Check(t, func(rt *rapid.T) {
		s, reopen := open(t)
		next := 1
		var appended []persistence.StoredEvent
		for range rapid.IntRange(1, 5).Draw(rt, "txs") {
			fail := rapid.IntRange(0, 4).Draw(rt, "fail") == 0
			ops := rapid.IntRange(1, 10).Draw(rt, "ops")
			err := s.Update(ctx, func(tx persistence.SyncTx) error {
				for range ops {
					switch rapid.IntRange(0, 9).Draw(rt, "op") {
					case 0: // eviction
						tk := rapid.SampledFrom(sumTables).Draw(rt, "table")
						if _, err := tx.DeleteEventsBelow(tk, messages.HLC(rapid.IntRange(0, 40).Draw(rt, "horizon"))); err != nil {
							return err
						}
					case 1: // hold one event, and maybe purge its group
						if len(appended) == 0 {
							continue
						}
						e := rapid.SampledFrom(appended).Draw(rt, "held")
						g := persistence.GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table}
						if e.Seq != 0 {
							if err := tx.HoldEvent(g, e.Seq); err != nil {
								return err
							}
						}
						if rapid.Bool().Draw(rt, "purge") {
							if _, err := tx.PurgeHeld(g); err != nil {
								return err
							}
						}
					case 2: // a duplicate append changes nothing
						if len(appended) == 0 {
							continue
						}
						e := rapid.SampledFrom(appended).Draw(rt, "dup")
						e.Seq = 0
						if _, err := tx.AppendEvent(e); err != nil && !errors.Is(err, persistence.ErrDuplicate) {
							return err
						}
					default:
						e := mkEvent(next, rapid.SampledFrom(sumTables).Draw(rt, "table"), []byte{byte(next % 4)}, messages.HLC(rapid.IntRange(1, 40).Draw(rt, "hlc")))
						e.Site = rapid.SampledFrom(sumSites).Draw(rt, "site")
						next++
						seq, err := tx.AppendEvent(e)
						if err != nil {
							return err
						}
						e.Seq = seq
						appended = append(appended, e)
					}
				}
				checkSums(t, tx, messages.HLC(rapid.IntRange(0, 41).Draw(rt, "min")))
				if fail {
					return errFn
				}
				return nil
			})
			if fail != (err != nil) || (fail && !errors.Is(err, errFn)) {
				rt.Fatalf("Update: %v (failing %v)", err, fail)
			}
			if rapid.IntRange(0, 3).Draw(rt, "reopen") == 0 {
				s = reopen()
			}
			view(t, s, func(r persistence.SyncReader) error {
				checkSums(t, r, 0, messages.HLC(rapid.IntRange(1, 41).Draw(rt, "min")))
				return nil
			})
		}
	})
}
