package runtime

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/persistence"
)

// waitingInApplyWith counts the goroutines blocked in
// syncgroup.Router.ApplyWith's wait for the committer: each has handed
// its push's work to the committer's mailbox (Send returned).
func waitingInApplyWith() int {
	got := 0
	for _, g := range goroutineStacks() { // closers_test.go
		if strings.Contains(g, "[select") && strings.Contains(g, "syncgroup.(*Router).ApplyWith(") {
			got++
		}
	}
	return got
}

// countRows counts n's rows of defT with an id in [from, from+count).
func countRows(t *testing.T, n *Node, from, count int) int {
	t.Helper()
	got := 0
	err := n.Scan(context.Background(), "app", "t", ScanOptions{}, func(r Row) bool {
		var id int
		if err := r.Key["id"].Decode(&id); err != nil {
			t.Error(err)
		}
		if id >= from && id < from+count {
			got++
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestOneFailingPushNeverFailsThePushesRecordedWithIt: two pushes (from a
// and from b) wait for r's committer while it is held inside a third
// push's transaction, so they run in ONE committer transaction; b's
// record fails with a storage error (injected). a's push still commits
// and reports success; nothing of b's push is stored (no event, no row,
// no progress), and b's next push applies all of it.
func TestOneFailingPushNeverFailsThePushesRecordedWithIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stall, failB atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	fp := func(name string) error {
		switch name {
		case replicate.FailpointRecordPush + ":c":
			if stall.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
		case replicate.FailpointRecordPush + ":b":
			if failB.Load() {
				return persistence.ErrInjected
			}
		}
		return nil
	}
	rDir := t.TempDir()
	m := newTestMesh(t, 41, []string{"a", "b", "c", "r"}, func(name string) Config {
		if name == "r" {
			return Config{Dir: rDir, NoSync: true, Failpoint: fp}
		}
		return Config{}
	})
	for _, s := range []string{"a", "b", "c"} {
		m.link(s, "r")
	}
	a, b, c, r := m.nodes["a"], m.nodes["b"], m.nodes["c"], m.nodes["r"]
	upsertN(t, a.Node, 0, 5, "a")
	upsertN(t, b.Node, 100, 5, "b")
	upsertN(t, c.Node, 200, 1, "c")
	seq0, err := r.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}

	type pushed struct {
		rep CycleReport
		err error
	}
	push := func(n *testNode) chan pushed {
		ch := make(chan pushed, 1)
		go func() {
			rep, err := n.SyncNow(ctx, "r", "")
			ch <- pushed{rep, err}
		}()
		return ch
	}
	// c's push holds r's committer inside its transaction ...
	stall.Store(true)
	fromC := push(c)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("c's push never reached r's committer")
	}
	// ... while a's and b's pushes queue behind it (both are in the
	// committer's mailbox once their goroutines wait for its answer, as
	// c's does), so both run in the next transaction.
	fromA, fromB := push(a), push(b)
	for waitingInApplyWith() < 3 {
		if ctx.Err() != nil {
			t.Fatalf("%d pushes wait for r's committer, want 3 (c, a, b)", waitingInApplyWith())
		}
		time.Sleep(time.Millisecond)
	}
	failB.Store(true)
	close(release)

	if p := <-fromC; p.err != nil || p.rep.Err != nil || p.rep.Result == nil || p.rep.Result.Applied != 1 {
		t.Fatalf("c's push: %+v %v", p.rep, p.err)
	}
	if p := <-fromA; p.err != nil || p.rep.Err != nil || p.rep.Result == nil || p.rep.Result.Applied != 5 {
		t.Fatalf("a's push, recorded with b's failing one: %+v %v", p.rep, p.err)
	}
	if p := <-fromB; p.err != nil || p.rep.Err == nil || !strings.Contains(p.rep.Err.Error(), persistence.ErrInjected.Error()) {
		t.Fatalf("b's push with an injected storage failure: %+v %v", p.rep, p.err)
	}
	if got := countRows(t, r.Node, 0, 5); got != 5 {
		t.Fatalf("r has %d of a's 5 rows", got)
	}
	if got := countRows(t, r.Node, 100, 5); got != 0 {
		t.Fatalf("r kept %d rows of b's failed push", got)
	}
	if seq, err := r.LastSeq(ctx); err != nil || seq != seq0+6 {
		t.Fatalf("r's log grew by %d events (%v), want a's 5 and c's 1 only", seq-seq0, err)
	}
	err = r.store.View(ctx, func(tx persistence.SyncReader) error {
		for _, s := range []string{"a", "b"} {
			_, ok, err := tx.(persistence.SyncTx).PeerProgress(s)
			if err != nil {
				return err
			}
			if ok != (s == "a") {
				t.Errorf("r's stored progress for %s: %v", s, ok)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// b offers the push again next cycle: all of it applies.
	failB.Store(false)
	p := <-push(b)
	if p.err != nil || p.rep.Err != nil || p.rep.Result == nil || p.rep.Result.Applied != 5 {
		t.Fatalf("b's push again: %+v %v", p.rep, p.err)
	}
	if got := countRows(t, r.Node, 100, 5); got != 5 {
		t.Fatalf("r has %d of b's 5 rows", got)
	}
}
