package bolt

import (
	"errors"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestOpenFixtureV10BuildsRangeSums opens a frozen layout-10 file (written
// by defa365: 60 events of three sites in two tables, one table evicted
// below HLC 1200): the layout-12 migration builds the range sums, which
// equal the scan of every table at every bound, and later appends and
// evictions keep them equal.
func TestOpenFixtureV10BuildsRangeSums(t *testing.T) {
	path := copyFixture(t, "layout_v10_events.db")
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.View(func(tx *bbolt.Tx) error {
		if v, _ := layoutVersion(tx); v != 10 {
			t.Fatalf("fixture is layout %d, want 10", v)
		}
		if tx.Bucket(bucketSyncRangeSums) != nil {
			t.Fatal("layout 10 already has range sums")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}

	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	notes, tags := persistence.TableKey{Schema: "app", Table: "notes"}, persistence.TableKey{Schema: "app", Table: "tags"}
	mins := []messages.HLC{0, 1000, 1010, 1200, 1205, 1400, 1601, 1 << 40}
	check := func(r persistence.SyncReader, wantNotes, wantTags uint64) {
		t.Helper()
		for _, tk := range []persistence.TableKey{notes, tags} {
			for _, min := range mins {
				got, err := r.TableEventSum(tk, min)
				if err != nil {
					t.Fatalf("TableEventSum(%v, %d): %v", tk, min, err)
				}
				var want persistence.RangeSum
				if err := r.TableEventKeys(tk, min, func(k persistence.EventKey) (bool, error) { want.Add(k); return true, nil }); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("TableEventSum(%v, %d): %d events, the scan %d", tk, min, got.Count, want.Count)
				}
			}
		}
		if n, _ := r.TableEventSum(notes, 0); n.Count != wantNotes {
			t.Fatalf("notes: %d events, want %d", n.Count, wantNotes)
		}
		if n, _ := r.TableEventSum(tags, 0); n.Count != wantTags {
			t.Fatalf("tags: %d events, want %d", n.Count, wantTags)
		}
	}
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if v, _ := layoutVersion(tx); v != LayoutVersion || LayoutVersion < 12 {
			t.Fatalf("layout %d after Open", v)
		}
		if b := tx.Bucket(bucketSyncRangeSums); b == nil || b.Stats().KeyN != 6 {
			t.Fatalf("range sums after the migration: want one record per (table, site), 6")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// notes: even n ≤ 60 with 1000+10n ≥ 1200 → n = 20..60 even: 21; tags: odd n: 30.
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error { check(r, 21, 30); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		ev := testEvent(1, tags)
		ev.HLC = 5000
		if _, err := tx.AppendEvent(ev); err != nil {
			return err
		}
		if _, err := tx.DeleteEventsBelow(notes, 1400); err != nil {
			return err
		}
		check(tx, 11, 31)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error { check(r, 11, 31); return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestRangeSumRecordIsChecked: a damaged range-sum record is ErrCorrupt,
// never a wrong sum.
func TestRangeSumRecordIsChecked(t *testing.T) {
	r := persistence.RangeSum{Count: 3}
	r.Sum.Add([]byte("k"))
	v := encodeRangeSum(&r)
	if got, err := decodeRangeSum(v); err != nil || got != r {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range [][]byte{nil, v[:len(v)-1], append(append([]byte{}, v...), 0), append([]byte{2}, v[1:]...)} {
		if _, err := decodeRangeSum(bad); !errors.Is(err, persistence.ErrCorrupt) {
			t.Fatalf("record of %d bytes: %v", len(bad), err)
		}
	}
}
