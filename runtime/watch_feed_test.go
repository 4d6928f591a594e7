package runtime

import (
	"context"
	"errors"
	"iter"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/persistence"
)

// A watcher of a table that never changed is not lagging when other
// tables fill the change log: lag is judged by the table's own trimmed
// changes. It resumes from an old position and from 0 alike, and gets the
// table's first change when it comes.
func TestWatchOfQuietTableNeverLagsFromOtherTables(t *testing.T) {
	const limit = 8
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := Config{ReconcileInterval: -1, SyncInterval: -1, ChangeLogLimit: limit}
			if store == "bolt" {
				cfg.Dir, cfg.NoSync = t.TempDir(), true
			}
			n := openTestNode(t, cfg)
			n.define(defT)
			n.define(TableDef{Schema: "app", Table: "quiet", KeyColumns: []string{"id"}, Columns: []string{"a"}})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// A watcher waiting on the quiet table while the busy one
			// writes five times the log's limit.
			next, stop := iter.Pull2(n.Watch(ctx, "app", "quiet", 0))
			defer stop()
			got := make(chan error, 1)
			go func() {
				c, err, ok := next()
				if ok && err == nil && (c.Table != "quiet" || c.Key["id"] == nil) {
					err = errors.New("a change of another table")
				}
				got <- err
			}()
			var old uint64
			for i := 0; i < 5*limit; i++ {
				if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
					t.Fatal(err)
				}
				if i == 2 {
					old = lastChange(t, n.Node)
				}
			}
			// Resuming from 0 and from an old position: no lag either.
			for _, after := range []uint64{0, old} {
				wctx, wcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				for _, err := range n.Watch(wctx, "app", "quiet", after) {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("watch of the quiet table after %d: %v", after, err)
					}
				}
				wcancel()
			}
			if _, err := n.Upsert(n.ctx, "app", "quiet", map[string]any{"id": 1}, map[string]any{"a": "first"}); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the quiet table's watcher: %v", err)
			}
			// Its own trimmed changes still make it lag.
			for i := 0; i < 2*limit; i++ {
				if _, err := n.Upsert(n.ctx, "app", "quiet", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
					t.Fatal(err)
				}
			}
			for _, err := range n.Watch(ctx, "app", "quiet", 0) {
				if !errors.Is(err, ErrWatchLagged) {
					t.Fatalf("watch of a table whose changes were trimmed: %v", err)
				}
				break
			}
		})
	}
}

// Change sequences are never reused: after node.db is restored from an
// older copy, a watcher that processed changes the copy does not hold gets
// a *WatchRestoredError saying where to resume, never other changes under
// the numbers it already saw; a watcher whose position the copy holds
// continues, and new changes take numbers above every one assigned before.
func TestWatchAfterRestoreNeverSeesReusedSequences(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, NoSync: true, ReconcileInterval: -1, SyncInterval: -1}
	n := openTestNode(t, cfg)
	n.define(defT)
	put := func(n *testNode, i int, v string) {
		t.Helper()
		if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": v}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		put(n, i, "before")
	}
	copyLast := lastChange(t, n.Node)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "node.db.bak")
	copyFile(t, filepath.Join(dir, "node.db"), backup)
	n = openTestNode(t, cfg)
	for i := 5; i < 10; i++ {
		put(n, i, "lost")
	}
	seen := take(t, n.Node, 0, 10)
	processed := seen[len(seen)-1].Seq
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	copyFile(t, backup, filepath.Join(dir, "node.db"))
	n = openTestNode(t, cfg)
	for i := 10; i < 20; i++ {
		put(n, i, "after")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for c, err := range n.Watch(ctx, "app", "t", processed) {
		var re *WatchRestoredError
		if !errors.As(err, &re) || !errors.Is(err, ErrWatchRestored) {
			var a string
			_, _ = c.Value("a", &a)
			t.Fatalf("watch after %d, past a restore that lost changes: change %d (a=%q), err %v; want a *WatchRestoredError", processed, c.Seq, a, err)
		}
		if re.After != processed || re.Lost.From != copyLast || re.Lost.To < processed || re.Resume <= processed {
			t.Fatalf("restore error %+v", re)
		}
		break
	}
	// A position the copy holds: its remaining changes, then the new ones,
	// all numbered above what was assigned before the restore.
	got := take(t, n.Node, seen[2].Seq, 12)
	for i, c := range got {
		var a string
		if _, err := c.Value("a", &a); err != nil {
			t.Fatal(err)
		}
		switch {
		case i < 2 && (a != "before" || c.Seq != seen[3+i].Seq):
			t.Fatalf("change %d: seq %d a=%q, want the copy's change %d", i, c.Seq, a, seen[3+i].Seq)
		case i >= 2 && (a != "after" || c.Seq <= processed):
			t.Fatalf("change %d: seq %d a=%q: a new change reused a number at or below %d", i, c.Seq, a, processed)
		}
	}
}

// A commit wakes only the watchers of the tables it changed: a watcher of
// a quiet table does no work for other tables' commits.
func TestCommitWakesOnlyItsTablesWatchers(t *testing.T) {
	n := openTestNode(t, Config{ReconcileInterval: -1, SyncInterval: -1})
	n.define(defT)
	n.define(TableDef{Schema: "app", Table: "quiet", KeyColumns: []string{"id"}, Columns: []string{"a"}})
	quiet := n.changes.wait(persistence.TableKey{Schema: "app", Table: "quiet"})
	busy := n.changes.wait(persistence.TableKey{Schema: "app", Table: "t"})
	for i := 0; i < 100; i++ {
		if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-busy:
	default:
		t.Fatal("the busy table's watcher was not woken")
	}
	select {
	case <-quiet:
		t.Fatal("the quiet table's watcher was woken by another table's commits")
	default:
	}
	if _, err := n.Upsert(n.ctx, "app", "quiet", map[string]any{"id": 1}, map[string]any{"a": 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-quiet:
	default:
		t.Fatal("the quiet table's watcher was not woken by its own change")
	}
}
