package runtime

import (
	"context"
	"errors"
	"iter"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// take reads k changes of app.t after `after`, failing on an error or when
// they do not come (the ctx bound only turns a hang into a failure).
func take(t *testing.T, n *Node, after uint64, k int) []Change {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []Change
	if k == 0 {
		return nil
	}
	for c, err := range n.Watch(ctx, "app", "t", after) {
		if err != nil {
			t.Fatalf("watch after %d, change %d of %d: %v", after, len(out)+1, k, err)
		}
		out = append(out, c)
		if len(out) == k {
			break
		}
	}
	return out
}

func lastChange(t *testing.T, n *Node) uint64 {
	t.Helper()
	s, err := n.LastChangeSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type changeWant struct {
	id     int
	cause  ChangeCause
	site   messages.SiteID
	exists bool
	cells  map[string]CellState // the changed cells and their state
}

// checkChanges checks got against want, change by change, and their
// sequences against seqs.
func checkChanges(t *testing.T, got []Change, want []changeWant, seqs []uint64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d changes, want %d: %+v", len(got), len(want), got)
	}
	for i, c := range got {
		w := want[i]
		var id int
		if err := c.Key["id"].Decode(&id); err != nil {
			t.Fatal(err)
		}
		if c.Seq != seqs[i] {
			t.Fatalf("change %d has seq %d, want %d (a gap or a duplicate)", i, c.Seq, seqs[i])
		}
		if id != w.id || c.Cause != w.cause || c.Exists != w.exists || c.Schema != "app" || c.Table != "t" {
			t.Fatalf("change %d = row %d cause %v exists %v; want row %d cause %v exists %v", c.Seq, id, c.Cause, c.Exists, w.id, w.cause, w.exists)
		}
		switch c.Cause {
		case CauseEvent:
			if c.Event.Site != w.site || c.Event.HLC == 0 || c.Event.ID == (messages.EventID{}) {
				t.Fatalf("change %d: event clock %+v, want site %v", c.Seq, c.Event, w.site)
			}
		default:
			if !c.Event.IsZero() {
				t.Fatalf("change %d (%v) names an event: %+v", c.Seq, c.Cause, c.Event)
			}
		}
		if len(c.Cells) != len(w.cells) {
			t.Fatalf("change %d cells %v, want %v", c.Seq, c.Cells, w.cells)
		}
		for name, st := range w.cells {
			cell, ok := c.Cells[name]
			if !ok || cell.State != st || cell.Clock.IsZero() {
				t.Fatalf("change %d cell %s = %+v, want %v", c.Seq, name, cell, st)
			}
		}
	}
}

// TestWatchResumesAcrossARestart is the change feed's must-show: a node
// on disk takes remote applies into a missing table (held), the table is
// defined (the held group is released), it writes locally, a watcher
// reads part of that and the node restarts; then AddColumn rebuilds a
// column from the log and a remote delete arrives. The watcher resumes
// after the last sequence it processed and gets exactly the rest, in
// order: no gap, no duplicate, each change with its cause and the event's
// site. A duplicate delivery is not a change. Each Open continues above
// the wall clock in microseconds: the sequences jump there, and only
// there.
func TestWatchResumesAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	clock := newWall()
	cfg := Config{Dir: dir, NoSync: true, ReconcileInterval: -1, SyncInterval: -1, ChangeLogLimit: 64, Wall: clock.Now}
	a := openTestNode(t, cfg)
	p := newPeer(t, 1)
	a.trust(p)
	self := a.Identity().Site
	ms := a.wall.MS()

	// Remote applies into a table a has not defined: held.
	for i, raw := range [][]byte{p.upsert(hlcAt(ms, 1), 1, map[string]any{"a": "x"}), p.upsert(hlcAt(ms, 2), 2, map[string]any{"a": "y"})} {
		if out := a.apply(raw); out.Kind != messages.Held {
			t.Fatalf("event %d: %v, want held", i, out)
		}
	}
	if got := lastChange(t, a.Node); got != 0 {
		t.Fatalf("held events made changes: %d", got)
	}
	a.define(TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}})
	if _, err := a.Upsert(a.ctx, "app", "t", map[string]any{"id": 3}, map[string]any{"a": "z"}); err != nil {
		t.Fatal(err)
	}
	// Column c is unknown here: only the existence clock moves.
	if out := a.apply(p.upsert(hlcAt(ms, 3), 1, map[string]any{"c": "red"})); out.Kind != messages.Applied {
		t.Fatalf("c write: %v", out)
	}
	all := []changeWant{
		{1, CauseEvent, p.signer.Site(), true, map[string]CellState{"a": Written}}, // released
		{2, CauseEvent, p.signer.Site(), true, map[string]CellState{"a": Written}}, // released
		{3, CauseEvent, self, true, map[string]CellState{"a": Written}},            // local
		{1, CauseEvent, p.signer.Site(), true, map[string]CellState{}},             // remote, existence only
		{1, CauseAddColumn, messages.SiteID{}, true, map[string]CellState{"c": Written}},
		{2, CauseEvent, p.signer.Site(), false, map[string]CellState{"a": Cleared}}, // remote delete
	}
	s1 := uint64(clock.Now().UnixMicro()) + 1 // the first Open's floor
	first := take(t, a.Node, 0, 2)
	checkChanges(t, first, all[:2], []uint64{s1, s1 + 1})
	processed := first[len(first)-1].Seq

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	s2 := uint64(clock.Now().UnixMicro()) + 1 // the second Open's floor
	a = openTestNode(t, cfg)
	if err := a.AddColumn(a.ctx, "app", "t", "c"); err != nil {
		t.Fatal(err)
	}
	del := p.del(hlcAt(ms, 4), 2)
	if out := a.apply(del); out.Kind != messages.Applied {
		t.Fatalf("delete: %v", out)
	}
	if out := a.apply(del); out.Kind != messages.Duplicate {
		t.Fatalf("duplicate delete: %v", out)
	}
	rest := take(t, a.Node, processed, len(all)-len(first))
	checkChanges(t, rest, all[len(first):], []uint64{s1 + 2, s1 + 3, s2, s2 + 1})
	if got := lastChange(t, a.Node); got != s2+1 {
		t.Fatalf("last change %d, want %d: something else was logged", got, len(all))
	}
	// The rebuilt cell carries the clock of the event it came from.
	if c := rest[2].Cells["c"]; c.Clock.HLC != hlcAt(ms, 3) || c.Clock.Site != p.signer.Site() {
		t.Fatalf("rebuilt cell clock %+v", c.Clock)
	}
}

// TestWatchSlowWatcherGetsLagError: a watcher that stops reading never
// holds writers back, and the log stays at ChangeLogLimit entries while
// it is stalled; when it reads again it gets a *WatchLagError naming the
// oldest retained change and where to resume, not a silent gap, and
// resuming there works.
func TestWatchSlowWatcherGetsLagError(t *testing.T) {
	const limit = 8
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := Config{ReconcileInterval: -1, SyncInterval: -1, ChangeLogLimit: limit}
			if store == "bolt" {
				cfg.Dir, cfg.NoSync = t.TempDir(), true
			}
			n := openTestNode(t, cfg)
			n.define(defT)
			put := func(i int) {
				t.Helper()
				if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
					t.Fatal(err)
				}
			}
			put(0)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			next, stop := iter.Pull2(n.Watch(ctx, "app", "t", 0))
			defer stop()
			c, err, ok := next()
			if !ok || err != nil || (store == "memory" && c.Seq != 1) {
				t.Fatalf("first change: %+v %v %v", c, err, ok)
			}
			base := c.Seq - 1 // on disk, the Open's floor (the wall clock)
			// The watcher is stalled inside its loop body; writers go on.
			for i := 1; i <= 5*limit; i++ {
				put(i)
			}
			if err := n.store.View(n.ctx, func(tx persistence.SyncReader) error {
				oldest, last, err := tx.ChangeBounds()
				if err != nil {
					return err
				}
				if last != base+5*limit+1 || last-oldest+1 != limit {
					t.Fatalf("log bounds %d..%d: want %d entries ending at %d", oldest, last, limit, base+5*limit+1)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			_, err, ok = next()
			var lag *WatchLagError
			if !ok || !errors.Is(err, ErrWatchLagged) || !errors.As(err, &lag) {
				t.Fatalf("stalled watcher got %v (ok %v), want a *WatchLagError", err, ok)
			}
			if lag.After != base+1 || lag.Oldest != base+5*limit+2-limit || lag.Resume != base+5*limit+1 {
				t.Fatalf("lag error %+v", lag)
			}
			if _, _, ok := next(); ok {
				t.Fatal("the watch went on after its error")
			}
			// As the error says: re-read, then watch after Resume.
			put(100)
			got := take(t, n.Node, lag.Resume, 1)
			if got[0].Seq != lag.Resume+1 {
				t.Fatalf("resumed at %d, want %d", got[0].Seq, lag.Resume+1)
			}
		})
	}
}

// TestWatchEndsWithItsContextAndTheNode: a watch waiting for changes ends
// with ctx.Err() when its context ends and with ErrClosed when the node
// closes; a watch after a sequence never assigned is refused.
func TestWatchEndsWithItsContextAndTheNode(t *testing.T) {
	n := openTestNode(t, Config{ReconcileInterval: -1, SyncInterval: -1})
	n.define(defT)
	ctx, cancel := context.WithCancel(context.Background())
	next, stop := iter.Pull2(n.Watch(ctx, "app", "t", 0))
	defer stop()
	cancel()
	if _, err, _ := next(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled watch: %v", err)
	}
	for _, err := range n.Watch(context.Background(), "app", "t", 5) {
		if !errors.Is(err, ErrWatchAhead) {
			t.Fatalf("watch after an unassigned sequence: %v", err)
		}
	}
	done := make(chan error, 1)
	go func() {
		for _, err := range n.Watch(context.Background(), "app", "t", 0) {
			done <- err
			return
		}
	}()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("watch on a closed node: %v", err)
	}
}

// TestChangeOnlyForWhatAReaderSees pins what counts as a change: a
// losing write and a duplicate are none; a winning write lists only the
// cells it changed.
func TestChangeOnlyForWhatAReaderSees(t *testing.T) {
	n, p := nodeWithPeer(t, Config{ReconcileInterval: -1, SyncInterval: -1})
	ms := n.wall.MS()
	newer := p.upsert(hlcAt(ms, 5), 1, map[string]any{"a": "new", "b": "b"})
	n.apply(newer)
	base := lastChange(t, n.Node)
	n.apply(newer)                                                 // duplicate
	n.apply(p.upsert(hlcAt(ms, 1), 1, map[string]any{"a": "old"})) // loses LWW, older than existence
	if got := lastChange(t, n.Node); got != base {
		t.Fatalf("a duplicate and a losing write logged %d changes", got-base)
	}
	n.apply(p.upsert(hlcAt(ms, 6), 1, map[string]any{"b": "b2"}))
	got := take(t, n.Node, base, 1)
	if names := slices.Sorted(maps.Keys(got[0].Cells)); !slices.Equal(names, []string{"b"}) {
		t.Fatalf("changed cells %v, want [b]", names)
	}
}
