package runtime

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// Restart keeps everything: rows, clocks, log, horizons, held groups,
// keyring, identity and the HLC high-water (SSP/1 §13.5: no HLC reuse).
func TestRestartKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	w := newWall()
	ctx := context.Background()
	open := func() *Node {
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	tn := &testNode{Node: n, t: t, wall: w, ctx: ctx}
	tn.define(defT)
	p := newPeer(t, 1)
	tn.trust(p)
	id1 := n.Identity()
	now := w.MS()
	tn.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "x", "b": nil}))
	tn.apply(p.del(hlcAt(now, 2), 2))
	held := p.event(&messages.Event{HLC: hlcAt(now, 3), Schema: "app", Table: "later", Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{"v": messages.MustValue(7)}})
	if out := tn.apply(held); out.Kind != messages.Held {
		t.Fatal(out)
	}
	if _, err := n.SetHorizon(ctx, "app", "t", hlcAt(now, 0)); err != nil {
		t.Fatal(err)
	}
	local, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 3}, map[string]any{"c": 1})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := tn.get(1)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	w.Advance(-time.Hour) // the wall clock went backwards across the restart
	n = open()
	defer n.Close()
	tn.Node = n
	if id2 := n.Identity(); id2.Site != id1.Site || !bytes.Equal(id2.Kid, id1.Kid) {
		t.Fatal("identity changed across restart")
	}
	// No HLC reuse although the wall clock is an hour behind: the clock
	// issues past its persisted high-water mark, which is more than the
	// skew bound ahead of this wall clock, so the node's own chokepoint
	// rejects the write — loudly (ErrNotApplied), never a silent nil.
	if out, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 4}, map[string]any{"c": 2}); !errors.Is(err, ErrNotApplied) || out.Reason != messages.ReasonClockSkew {
		t.Fatalf("write an hour ahead of the wall clock: %v, %v", out, err)
	}
	w.Advance(time.Hour) // back to the time the events were signed at
	next, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 4}, map[string]any{"c": 2})
	if err != nil {
		t.Fatal(err)
	}
	if next.HLC <= local.HLC {
		t.Fatalf("HLC %v issued after restart is not above %v issued before", next.HLC, local.HLC)
	}
	after, ok := tn.get(1)
	if !ok || !sameCell(after.Cells["a"], before.Cells["a"]) || after.Cells["b"].State != Written || !after.Cells["b"].Value.IsNull() || after.Cells["c"].State != Unmaterialized {
		t.Fatalf("row changed across restart:\n%+v\n%+v", before, after)
	}
	if r, _ := tn.get(2); r.Tomb.HLC != hlcAt(now, 2) {
		t.Fatalf("tombstone clock lost: %+v", r)
	}
	if h, _ := n.Horizon(ctx, "app", "t"); h != hlcAt(now, 0) {
		t.Fatalf("horizon lost: %v", h)
	}
	if len(n.TrustedKeys()) != 2 {
		t.Fatalf("keyring lost: %d keys", len(n.TrustedKeys()))
	}
	// The log survived: a duplicate is still a duplicate.
	if out := tn.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "x", "b": nil})); out.Kind != messages.Duplicate {
		t.Fatalf("log lost: %v", out)
	}
	// The held group survived and releases on DefineTable.
	ns := tn.collect()
	tn.define(TableDef{Schema: "app", Table: "later", KeyColumns: []string{"id"}, Columns: []string{"v"}})
	ns.waitFor(t, "released", func(x messages.Notice) bool { _, ok := x.(messages.GroupReleased); return ok })
	r, ok, err := n.Get(ctx, "app", "later", map[string]any{"id": 1})
	if err != nil || !ok {
		t.Fatalf("held event not released after restart: %v", err)
	}
	var v int
	if st, _ := r.Value("v", &v); st != Written || v != 7 {
		t.Fatalf("v = %d (%v)", v, st)
	}
}

// A crash right after a durable commit (failpoint after_commit) loses
// nothing, and a failure before the commit keeps nothing.
func TestFailpointsAroundCommit(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var mu sync.Mutex
	armed := ""
	fp := func(name string) error {
		mu.Lock()
		defer mu.Unlock()
		if name == armed {
			return errors.New("injected at " + name)
		}
		return nil
	}
	arm := func(s string) { mu.Lock(); armed = s; mu.Unlock() }
	w := newWall()
	n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now, Failpoint: fp})
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{Node: n, t: t, wall: w, ctx: ctx}
	tn.define(defT)
	p := newPeer(t, 1)
	tn.trust(p)
	now := w.MS()
	e1 := p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "before-commit"})
	arm("sync.update.before_commit")
	if _, err := n.ApplySigned(ctx, e1); err == nil {
		t.Fatal("expected the injected failure")
	}
	arm("")
	if _, ok := tn.get(1); ok {
		t.Fatal("a failed transaction left a row")
	}
	e2 := p.upsert(hlcAt(now, 2), 2, map[string]any{"a": "after-commit"})
	arm("sync.update.after_commit")
	if _, err := n.ApplySigned(ctx, e2); err == nil {
		t.Fatal("expected the injected failure")
	}
	arm("")
	n.Close()
	n, err = Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	tn.Node = n
	if _, ok := tn.get(2); !ok {
		t.Fatal("a durable commit was lost")
	}
	// The sender's retry of e1 (not retained) applies; of e2, a duplicate.
	if out := tn.apply(e1); out.Kind != messages.Applied {
		t.Fatalf("retry of the failed event: %v", out)
	}
	if out := tn.apply(e2); out.Kind != messages.Duplicate {
		t.Fatalf("retry of the committed event: %v", out)
	}
}

func TestMeshMismatchAndConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, err := Open(ctx, Config{Dir: dir}); !isConfigErr(err, "MeshID") {
		t.Fatalf("create without mesh: %v", err)
	}
	n, err := Open(ctx, Config{Dir: dir, MeshID: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if _, err := Open(ctx, Config{Dir: dir, MeshID: []byte("b")}); !errors.Is(err, ErrMeshMismatch) {
		t.Fatalf("other mesh: %v", err)
	}
	n, err = Open(ctx, Config{Dir: dir}) // an existing node needs no mesh id
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if _, err := Open(ctx, Config{}); !isConfigErr(err, "Dir") {
		t.Fatalf("no dir: %v", err)
	}
	if _, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Scope: []string{"noslash"}}); !isConfigErr(err, "Scope") {
		t.Fatalf("bad scope: %v", err)
	}
}

func isConfigErr(err error, field string) bool {
	var ce *ConfigError
	return errors.As(err, &ce) && ce.Field == field
}

// Concurrent writers and appliers through the group actors converge on one
// state and every outcome is answered (run under -race).
func TestConcurrentApplyAndLocalWrites(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	peers := []*peer{newPeer(t, 1), newPeer(t, 2), newPeer(t, 3)}
	for _, p := range peers {
		n.trust(p)
	}
	now := n.wall.MS()
	var raws [][]byte
	for i, p := range peers {
		for j := 0; j < 60; j++ {
			raws = append(raws, p.upsert(hlcAt(now, uint16(j+1)), j%7, map[string]any{"a": i*100 + j}))
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(raws); i += 8 {
				out, err := n.ApplySigned(n.ctx, raws[i])
				if err != nil || (out.Kind != messages.Applied && out.Kind != messages.Duplicate) {
					errs <- errors.New(out.String())
					return
				}
			}
			for k := 0; k < 10; k++ {
				if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 100 + g}, map[string]any{"b": k}); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Same events applied again to a fresh node in one batch: same rows.
	m := openTestNode(t, Config{})
	m.define(defT)
	for _, p := range peers {
		m.trust(p)
	}
	if _, err := m.ApplySignedBatch(m.ctx, raws); err != nil {
		t.Fatal(err)
	}
	for id := 0; id < 7; id++ {
		a, _ := n.get(id)
		b, _ := m.get(id)
		if !sameCell(a.Cells["a"], b.Cells["a"]) {
			t.Fatalf("row %d differs: %+v vs %+v", id, a.Cells["a"], b.Cells["a"])
		}
	}
}

// Clean restarts do not push the clock ahead of the wall clock: the
// clock resumes from the last HLC it issued, not from its leased mark, so
// a node restarted more often than the skew bound over the lease allows
// keeps accepting its own writes (SSP/1 §12 step 2) and still never
// reissues an HLC (SSP/1 §13.5).
func TestCleanRestartsKeepTheClockAtTheWall(t *testing.T) {
	dir := t.TempDir()
	w := newWall()
	ctx := context.Background()
	var last messages.HLC
	for i := range 40 { // 40 leases of 10 s: beyond the 300 s skew bound
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			(&testNode{Node: n, t: t, wall: w, ctx: ctx}).define(defT)
		}
		out, err := n.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i})
		if err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		if out.HLC <= last {
			t.Fatalf("restart %d: HLC %v issued after %v", i, out.HLC, last)
		}
		if out.HLC.Physical() != w.MS() {
			t.Fatalf("restart %d: HLC physical %d ms, %d ms ahead of the wall clock", i, out.HLC.Physical(), out.HLC.Physical()-w.MS())
		}
		last = out.HLC
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if st := n.RestoreStatus(); st.Suspected {
			t.Fatalf("restart %d: a clean restart looks restored: %s", i, st.Reason)
		}
	}
}
