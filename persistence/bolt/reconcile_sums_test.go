package bolt

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
		if v, _ := layoutVersion(wrapTx(tx)); v != 10 {
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
		if v, _ := layoutVersion(wrapTx(tx)); v != LayoutVersion || LayoutVersion < 12 {
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

// crashChildEnv makes the test binary the writer that TestRangeSumsSurviveSIGKILL kills.
const crashChildEnv = "SYNCMESH_RANGE_SUM_CRASH_CHILD"

// TestRangeSumsSurviveSIGKILL: a child process appends and evicts events
// in fsync'd transactions without end; it is killed (SIGKILL) after it
// reported 20 commits, somewhere in the middle of the next ones. The
// file it leaves opens with range sums equal to the scan of every table
// at every bound: they are written in the transaction that changes the
// events, so no crash can leave one without the other.
func TestRangeSumsSurviveSIGKILL(t *testing.T) {
	if path := os.Getenv(crashChildEnv); path != "" {
		rangeSumCrashChild(path)
		return
	}
	path := filepath.Join(t.TempDir(), "node.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRangeSumsSurviveSIGKILL$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	commits := 0
	for commits < 20 && lines.Scan() {
		if lines.Text() == "committed" {
			commits++
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if commits < 20 {
		t.Fatalf("the child reported %d commits before it ended", commits)
	}
	db := mustOpen(t, path, Options{})
	defer db.Close()
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		n := uint64(0)
		for _, tk := range crashTables {
			for _, min := range []messages.HLC{0, 1, 500, 1000, 5000, 1 << 40} {
				got, err := r.TableEventSum(tk, min)
				if err != nil {
					return err
				}
				var want persistence.RangeSum
				if err := r.TableEventKeys(tk, min, func(k persistence.EventKey) (bool, error) { want.Add(k); return true, nil }); err != nil {
					return err
				}
				if got != want {
					t.Fatalf("after SIGKILL: TableEventSum(%v, %d) has %d events, the scan %d", tk, min, got.Count, want.Count)
				}
				if min == 0 {
					n += got.Count
				}
			}
		}
		if n == 0 {
			t.Fatal("no event survived 20 commits")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

var crashTables = []persistence.TableKey{{Schema: "app", Table: "a"}, {Schema: "app", Table: "b"}}

// rangeSumCrashChild writes until it is killed: each transaction appends
// 50 events of three sites over two tables and, every third one, evicts
// one table below a rising horizon.
func rangeSumCrashChild(path string) {
	db, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	s := db.Sync()
	for n, tx := 0, 0; ; tx++ {
		if err := s.Update(ctx, func(w persistence.SyncTx) error {
			for i := 0; i < 50; i++ {
				n++
				var id persistence.EventID
				binary.BigEndian.PutUint64(id[:], uint64(n))
				tk := crashTables[n%2]
				ev := persistence.StoredEvent{ID: id, Raw: []byte{0xd2, byte(n)}, Site: messages.SiteID{byte(n % 3)}, HLC: messages.HLC(n),
					Schema: tk.Schema, Table: tk.Table, RowKey: []byte{byte(n % 7)}}
				if _, err := w.AppendEvent(ev); err != nil {
					return err
				}
			}
			if tx%3 == 2 {
				_, err := w.DeleteEventsBelow(crashTables[tx%2], messages.HLC(n/2))
				return err
			}
			return nil
		}); err != nil {
			fmt.Fprintln(os.Stderr, "child update:", err)
			os.Exit(2)
		}
		fmt.Println("committed")
	}
}
