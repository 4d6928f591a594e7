package runtime

import (
	"bytes"
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// TestRehydrateCompletesPartialRebuild (SSP/1 §13.4, §13.5): b evicts
// below a horizon, then receives a late upsert below it (counted, writes
// nothing) and a resurrecting upsert above it: the rebuild is partial —
// column a comes back null where a, which kept everything, holds "late".
// Rehydrate from a drops b's horizon to zero, takes the history below it
// back through the chokepoint and surfaces the row as complete: b's state
// is a's, cell clocks included, and a second Rehydrate finds nothing.
func TestRehydrateCompletesPartialRebuild(t *testing.T) {
	a, b, _ := reconPair(t, true)
	p := newPeer(t, 9)
	a.trust(p)
	b.trust(p)
	ms := b.wall.MS()
	u1 := p.upsert(hlcAt(ms-5000, 0), 1, map[string]any{"a": "first"})
	d := p.del(hlcAt(ms-4000, 0), 1)
	late := p.upsert(hlcAt(ms-3000, 0), 1, map[string]any{"a": "late"})
	res := p.upsert(hlcAt(ms-1000, 0), 1, map[string]any{"b": "back"})
	other := p.upsert(hlcAt(ms-4500, 0), 2, map[string]any{"c": "kept"})
	for _, raw := range [][]byte{u1, d, late, res, other} {
		if out := a.apply(raw); out.Kind != messages.Applied {
			t.Fatalf("a: %v", out)
		}
	}
	for _, raw := range [][]byte{u1, d, other} {
		b.apply(raw)
	}
	horizon := hlcAt(ms-2000, 0)
	if _, err := b.SetHorizon(b.ctx, "app", "t", horizon); err != nil {
		t.Fatal(err)
	}
	b.apply(late) // below the horizon: counted, writes nothing
	ns := b.collect()
	b.apply(res)
	ns.waitFor(t, "partial rebuild", func(x messages.Notice) bool { _, ok := x.(messages.PartialRebuild); return ok })
	r, _ := b.get(1)
	if v, st := cellString(t, r, "a"); st == Written {
		t.Fatalf("before rehydration b's a is %q, want the partial rebuild's null", v)
	}
	if state(t, a.Node) == state(t, b.Node) {
		t.Fatal("the partial rebuild left no difference to repair")
	}

	rep, err := b.Rehydrate(b.ctx, "app", "t", "a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.OldHorizon != horizon || rep.Bound != 0 || rep.Fetched != 4 || len(rep.Completed) != 1 || rep.StillPartial != 0 {
		t.Fatalf("report %+v", rep)
	}
	if h, _ := b.Horizon(b.ctx, "app", "t"); h != 0 {
		t.Fatalf("horizon %v after rehydration", h)
	}
	done := ns.waitFor(t, "rebuild completed", func(x messages.Notice) bool { _, ok := x.(messages.RebuildCompleted); return ok }).(messages.RebuildCompleted)
	if !bytes.Equal(done.Key.Encode(), messages.Columns{"id": messages.MustValue(1)}.Encode()) || done.Horizon != horizon {
		t.Fatalf("notice %+v", done)
	}
	r, _ = b.get(1)
	if v, st := cellString(t, r, "a"); st != Written || v != "late" {
		t.Fatalf("after rehydration b's a is %q (%v), want the complete value \"late\"", v, st)
	}
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("b differs from a after rehydration:\n%s\n---\n%s", sb, sa)
	}
	again, err := b.Rehydrate(b.ctx, "app", "t", "a")
	if err != nil || again.Fetched != 0 || len(again.Completed) != 0 || again.Sessions != 1 {
		t.Fatalf("second rehydration: %+v, %v", again, err)
	}
}

// TestRehydrateFromAPeerThatEvictedToo: the peer's own horizon bounds
// what can come back; rows below it are StillPartial, never surfaced as
// complete.
func TestRehydrateFromAPeerThatEvictedToo(t *testing.T) {
	a, b, _ := reconPair(t, true)
	p := newPeer(t, 9)
	a.trust(p)
	b.trust(p)
	ms := b.wall.MS()
	evs := [][]byte{
		p.upsert(hlcAt(ms-5000, 0), 1, map[string]any{"a": "first"}),
		p.del(hlcAt(ms-4000, 0), 1),
		p.upsert(hlcAt(ms-1000, 0), 1, map[string]any{"b": "back"}),
	}
	horizon := hlcAt(ms-2000, 0)
	for _, n := range []*testNode{a, b} {
		for _, raw := range evs[:2] {
			n.apply(raw)
		}
		if _, err := n.SetHorizon(n.ctx, "app", "t", horizon); err != nil {
			t.Fatal(err)
		}
		n.apply(evs[2])
	}
	ns := b.collect()
	rep, err := b.Rehydrate(b.ctx, "app", "t", "a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Bound != horizon || len(rep.Completed) != 0 || rep.StillPartial != 1 {
		t.Fatalf("report %+v", rep)
	}
	ns.mu.Lock()
	defer ns.mu.Unlock()
	for _, x := range ns.all {
		if _, ok := x.(messages.RebuildCompleted); ok {
			t.Fatalf("a row the peer evicted too surfaced as complete: %+v", x)
		}
	}
}

func TestRehydrateRefusesUnknownPeerAndTable(t *testing.T) {
	_, b, _ := reconPair(t, true)
	if _, err := b.Rehydrate(b.ctx, "app", "t", "nobody"); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	if _, err := b.Rehydrate(b.ctx, "app", "missing", "a"); !errors.Is(err, ErrUnknownTable) {
		t.Fatalf("unknown table: %v", err)
	}
}

// TestRehydrateFromAPeerThatDoesNotSyncTheTable (regression): b's row was
// rebuilt partially under a horizon; Rehydrate from e, which does not
// define the table (it leaves the group out of its answers), fetched
// nothing: it fails with ErrRehydrateNotServed, reports no row completed
// and raises no RebuildCompleted notice.
func TestRehydrateFromAPeerThatDoesNotSyncTheTable(t *testing.T) {
	a, b, net := reconPair(t, true)
	e := openTestNode(t, Config{Name: "e", SyncInterval: -1, ReconcileInterval: -1})
	net.Register("e", e.Node)
	if err := b.AddPeer("e", net.Transport("b"), ""); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t, 9)
	b.trust(p)
	ms := b.wall.MS()
	u1 := p.upsert(hlcAt(ms-5000, 0), 1, map[string]any{"a": "first"})
	d := p.del(hlcAt(ms-4000, 0), 1)
	late := p.upsert(hlcAt(ms-3000, 0), 1, map[string]any{"a": "late"})
	res := p.upsert(hlcAt(ms-1000, 0), 1, map[string]any{"b": "back"})
	for _, raw := range [][]byte{u1, d} {
		b.apply(raw)
	}
	if _, err := b.SetHorizon(b.ctx, "app", "t", hlcAt(ms-2000, 0)); err != nil {
		t.Fatal(err)
	}
	b.apply(late)
	ns := b.collect()
	b.apply(res)
	ns.waitFor(t, "partial rebuild", func(x messages.Notice) bool { _, ok := x.(messages.PartialRebuild); return ok })

	rep, err := b.Rehydrate(b.ctx, "app", "t", "e")
	if !errors.Is(err, ErrRehydrateNotServed) {
		t.Fatalf("rehydrate from a peer without the table: %v (report %+v)", err, rep)
	}
	if len(rep.Completed) != 0 || rep.Fetched != 0 {
		t.Fatalf("report %+v", rep)
	}
	// The partial row is not surfaced as complete. Notices reach the
	// subscriber in order: once a marker published after Rehydrate (an
	// event rejected for skew) arrived, a RebuildCompleted would have too.
	b.apply(p.upsert(hlcAt(ms+3_600_000, 0), 5, map[string]any{"a": "future"}))
	ns.waitFor(t, "marker", func(x messages.Notice) bool { _, ok := x.(messages.EventRejected); return ok })
	ns.mu.Lock()
	defer ns.mu.Unlock()
	for _, x := range ns.all {
		if _, ok := x.(messages.RebuildCompleted); ok {
			t.Fatalf("RebuildCompleted raised after rehydrating from a peer that served nothing: %+v", x)
		}
	}
	_ = a
}
