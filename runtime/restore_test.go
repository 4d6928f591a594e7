package runtime

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// copyFile copies src to dst (a node's closed bbolt file: a backup).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// ownHLCs returns every HLC of site in n's log, with the ids under each.
func ownHLCs(t *testing.T, n *Node, site messages.SiteID) map[messages.HLC]map[messages.EventID]bool {
	t.Helper()
	out := map[messages.HLC]map[messages.EventID]bool{}
	var after uint64
	for {
		es, err := n.Log(context.Background(), after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			if e.Site == site {
				if out[e.HLC] == nil {
					out[e.HLC] = map[messages.EventID]bool{}
				}
				out[e.HLC][e.ID] = true
			}
			after = e.Seq
		}
	}
}

// TestRestoredCopyNeverReissuesAnHLC (SSP/1 §13.5): a is closed and its
// node.db copied; reopened, it writes more and b receives those events;
// then node.db is replaced by the older copy and a, reopened, writes at
// once — before any contact with a peer, with its wall clock where it was
// or set back before the copy. None of those HLCs may equal one a released
// before (nor be below it), and after reconciliation and sync the pair
// converges with exactly one event per (site, HLC).
func TestRestoredCopyNeverReissuesAnHLC(t *testing.T) {
	for _, tc := range []struct {
		name string
		back time.Duration // how far the wall is set back at the restore
	}{
		{"wall where it was", 0},
		{"wall set back", 3 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			net := NewNetwork(1)
			dir := t.TempDir()
			w := newWall()
			var a *testNode
			open := func(wall *wall) {
				t.Helper()
				n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: wall.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = n.Close() })
				a = &testNode{Node: n, t: t, wall: wall, ctx: ctx}
				net.Register("a", n)
			}
			b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
			b.define(defT)
			net.Register("b", b.Node)
			open(w)
			a.define(defT)
			trustNode(t, a.Node, b.Node)
			trustNode(t, b.Node, a.Node)
			site := a.Identity().Site
			link := func() {
				t.Helper()
				if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
					t.Fatal(err)
				}
				if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(site)); err != nil && !errors.Is(err, ErrPeerExists) {
					t.Fatal(err)
				}
			}
			link()
			for i := 0; i < 3; i++ {
				a.write(i)
			}
			a.syncNow("b")
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			backup := filepath.Join(t.TempDir(), "node.db.bak")
			copyFile(t, filepath.Join(dir, "node.db"), backup)

			// After the backup: more writes, some a lease later, all on b.
			open(w)
			if st := a.RestoreStatus(); st.Suspected {
				t.Fatalf("an ordinary reopen looks like a restore: %+v", st)
			}
			link()
			for i := 10; i < 14; i++ {
				a.write(i)
			}
			w.Advance(time.Minute)
			for i := 14; i < 18; i++ {
				a.write(i)
			}
			a.syncNow("b")
			released := ownHLCs(t, b.Node, site)
			var highest messages.HLC
			for h := range released {
				highest = max(highest, h)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}

			// Restore the older copy; reopen and write before any contact.
			copyFile(t, backup, filepath.Join(dir, "node.db"))
			w2 := newWall()
			w2.Advance(-tc.back)
			open(w2)
			if st := a.RestoreStatus(); !st.Suspected || st.Held || st.FileMark <= st.StoreMark {
				t.Fatalf("restored node.db not reported: %+v", st)
			}
			for i := 20; i < 24; i++ {
				out, err := a.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i})
				if err != nil {
					t.Fatalf("write %d after the restore: %v", i, err)
				}
				if released[out.HLC] != nil {
					t.Fatalf("write %d after the restore reissued HLC %v, already released", i, out.HLC)
				}
				if out.HLC <= highest {
					t.Fatalf("write %d after the restore issued HLC %v, not above the released %v", i, out.HLC, highest)
				}
			}

			// Converge: a takes back its own events, b takes the new ones.
			link()
			a.reconcile("b")
			b.reconcile("a")
			a.syncNow("b")
			b.syncNow("a")
			if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
				t.Fatalf("a and b differ after the restore:\n%s\n---\n%s", sa, sb)
			}
			for _, n := range []*Node{a.Node, b.Node} {
				hs := ownHLCs(t, n, site)
				if len(hs) != 3+8+4 {
					t.Fatalf("%s holds %d of a's HLCs, want 15", n.Name(), len(hs))
				}
				for h, ids := range hs {
					if len(ids) != 1 {
						t.Fatalf("%s holds %d events of a at HLC %v", n.Name(), len(ids), h)
					}
				}
			}
			if got := rowCount(t, a); got != 3+8+4 {
				t.Fatalf("a holds %d rows, want 15", got)
			}
		})
	}
}

// TestRestoredDirectoryWaitsForReconciliation: the whole directory (node.db
// and its clock mark file) restored from an older copy cannot be told
// from the original; with Config.Restored the node issues no HLC — a
// write fails with ErrAwaitingReconcile after RestoreWait, NextHLC at
// once — until a reconciliation it starts has applied its own released
// events from a peer; the next write is above all of them, also with the
// wall clock set back, and the pair converges.
func TestRestoredDirectoryWaitsForReconciliation(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	var a *testNode
	open := func(w *wall, restored bool, wait time.Duration) {
		t.Helper()
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1, Restored: restored, RestoreWait: wait})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		a = &testNode{Node: n, t: t, wall: w, ctx: ctx}
		net.Register("a", n)
	}
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	b.define(defT)
	net.Register("b", b.Node)
	w := newWall()
	open(w, false, 0)
	a.define(defT)
	trustNode(t, a.Node, b.Node)
	trustNode(t, b.Node, a.Node)
	site := a.Identity().Site
	if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(site)); err != nil {
		t.Fatal(err)
	}
	link := func() {
		t.Helper()
		if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
	}
	link()
	a.write(1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	for _, f := range []string{"node.db", "storage.key", clockMarkName} {
		copyFile(t, filepath.Join(dir, f), filepath.Join(backup, f))
	}
	open(w, false, 0)
	link()
	for i := 10; i < 14; i++ {
		a.write(i)
	}
	w.Advance(time.Minute)
	a.write(14)
	a.syncNow("b")
	released := ownHLCs(t, b.Node, site)
	var highest messages.HLC
	for h := range released {
		highest = max(highest, h)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node.db", "storage.key", clockMarkName} {
		copyFile(t, filepath.Join(backup, f), filepath.Join(dir, f))
	}

	w2 := newWall() // set back to before the writes
	open(w2, true, 20*time.Millisecond)
	if st := a.RestoreStatus(); !st.Held || st.Suspected {
		t.Fatalf("restore status %+v: want held (the copy looks original)", st)
	}
	if _, err := a.NextHLC(); !errors.Is(err, ErrAwaitingReconcile) {
		t.Fatalf("NextHLC while held: %v", err)
	}
	if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 20}, map[string]any{"a": 20}); !errors.Is(err, ErrAwaitingReconcile) {
		t.Fatalf("write while held: %v", err)
	}
	if got := gaugeValue(t, a, "syncmesh_restore_writes_held_since_timestamp_seconds"); got <= 0 {
		t.Fatalf("held gauge %v", got)
	}
	link()
	a.reconcile("b")
	if st := a.RestoreStatus(); st.Held {
		t.Fatalf("still held after a reconciliation: %+v", st)
	}
	if got := gaugeValue(t, a, "syncmesh_restore_writes_held_since_timestamp_seconds"); got != 0 {
		t.Fatalf("held gauge %v after the reconciliation", got)
	}
	for i := 20; i < 23; i++ {
		out, err := a.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i})
		if err != nil {
			t.Fatalf("write %d after the reconciliation: %v", i, err)
		}
		if out.HLC <= highest {
			t.Fatalf("write %d issued HLC %v, not above the released %v", i, out.HLC, highest)
		}
	}
	a.syncNow("b")
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("a and b differ:\n%s\n---\n%s", sa, sb)
	}
	for h, ids := range ownHLCs(t, b.Node, site) {
		if len(ids) != 1 {
			t.Fatalf("b holds %d events of a at HLC %v", len(ids), h)
		}
	}
}

// TestClockMarkFileChecks: a missing clock mark file beside an existing
// store is reported as a possible restore (and written again); a corrupt
// one fails Open with ErrClockMark, changing nothing.
func TestClockMarkFileChecks(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := newWall()
	open := func() (*Node, error) {
		return Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
	}
	n, err := open()
	if err != nil {
		t.Fatal(err)
	}
	if st := n.RestoreStatus(); st.Suspected {
		t.Fatalf("a new node looks restored: %+v", st)
	}
	if _, err := n.NextHLC(); err != nil {
		t.Fatal(err)
	}
	_ = n.Close()
	mark := filepath.Join(dir, clockMarkName)
	if err := os.Remove(mark); err != nil {
		t.Fatal(err)
	}
	if n, err = open(); err != nil {
		t.Fatal(err)
	}
	if st := n.RestoreStatus(); !st.Suspected || st.FileMark != 0 {
		t.Fatalf("missing clock mark not reported: %+v", st)
	}
	_ = n.Close()
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("clock mark not written again: %v", err)
	}
	good, err := os.ReadFile(mark)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"empty":    {},
		"short":    good[:len(good)-1],
		"checksum": append(append([]byte{}, good[:len(good)-1]...), good[len(good)-1]^1),
		"magic":    append([]byte("xxxxxxxx"), good[8:]...),
	} {
		if err := os.WriteFile(mark, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if n, err := open(); !errors.Is(err, ErrClockMark) {
			if err == nil {
				_ = n.Close()
			}
			t.Fatalf("%s clock mark: Open %v", name, err)
		}
		if got, _ := os.ReadFile(mark); !bytes.Equal(got, bad) {
			t.Fatalf("%s clock mark changed by a refused Open", name)
		}
	}
}

func FuzzDecodeClockMark(f *testing.F) {
	f.Add(encodeClockMark(hlcAt(1_800_000_000_000, 3), messages.SiteID{1}))
	f.Add([]byte("smclock1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, site, err := decodeClockMark(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeClockMark(h, site), b) {
			t.Fatalf("decoded %v %x does not encode back to the input", h, site)
		}
	})
}

func gaugeValue(t *testing.T, n *testNode, name string) float64 {
	t.Helper()
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

// TestRestoredNodeRetriesItsFirstReconciliation (regression): a node
// opened with Config.Restored whose peer does not answer when AddPeer
// starts its reconciliation retries it with backoff, not on the 10-minute
// schedule: once the peer answers, the hold is released and a write that
// was already waiting succeeds — the test never calls Reconcile.
func TestRestoredNodeRetriesItsFirstReconciliation(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	b.define(defT)
	net.Register("b", b.Node)
	w := newWall()
	a1, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ta := &testNode{Node: a1, t: t, wall: w, ctx: ctx}
	ta.define(defT)
	trustNode(t, a1, b.Node)
	trustNode(t, b.Node, a1)
	ta.write(1)
	if err := a1.Close(); err != nil {
		t.Fatal(err)
	}
	// b holds a's events (as if pushed before the restore).
	b.write(2)
	a, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1,
		Restored: true, RestoreWait: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	net.Register("a", a)
	net.Cut("a", "b") // the peer does not answer at Open
	if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 3}, map[string]any{"a": 3})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && counterValue(t, &testNode{Node: a, t: t}, "syncmesh_reconcile_total") < 1 {
		time.Sleep(10 * time.Millisecond)
	}
	if st := a.RestoreStatus(); !st.Held {
		t.Fatalf("released while the peer did not answer: %+v", st)
	}
	net.Heal()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write after the peer answered: %v", err)
		}
	case <-time.After(70 * time.Second):
		t.Fatal("write still waiting")
	}
	if st := a.RestoreStatus(); st.Held {
		t.Fatalf("still held: %+v", st)
	}
}

// TestRestoreHoldNotReleasedBySilence (regression): a node opened with
// Config.Restored reconciles first with a peer that does not sync its
// table (an empty new node: it leaves the group out of its answers) and
// with one that syncs it but holds nothing of it. Neither is evidence of
// what the node released before the restore: writes stay held. A
// reconciliation with a peer that holds the node's events releases them,
// and the next write is above every HLC released before.
func TestRestoreHoldNotReleasedBySilence(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	var a *testNode
	open := func(w *wall, restored bool) {
		t.Helper()
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1,
			Restored: restored, RestoreWait: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		a = &testNode{Node: n, t: t, wall: w, ctx: ctx}
		net.Register("a", n)
	}
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	b.define(defT)
	e := openTestNode(t, Config{Name: "e", SyncInterval: -1, ReconcileInterval: -1}) // no table
	z := openTestNode(t, Config{Name: "z", SyncInterval: -1, ReconcileInterval: -1}) // the table, empty
	z.define(defT)
	for _, n := range []*testNode{b, e, z} {
		net.Register(n.Name(), n.Node)
	}
	w := newWall()
	open(w, false)
	a.define(defT)
	trustNode(t, b.Node, a.Node)
	if err := b.AcceptPeer("a"); err != nil {
		t.Fatal(err)
	}
	site := a.Identity().Site
	link := func(peer string) {
		t.Helper()
		if err := a.AddPeer(peer, net.Transport("a"), ""); err != nil {
			t.Fatal(err)
		}
	}
	a.write(1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	for _, f := range []string{"node.db", "storage.key", clockMarkName} {
		copyFile(t, filepath.Join(dir, f), filepath.Join(backup, f))
	}
	open(w, false)
	link("b")
	for i := 10; i < 14; i++ {
		a.write(i)
	}
	a.syncNow("b")
	var highest messages.HLC
	for h := range ownHLCs(t, b.Node, site) {
		highest = max(highest, h)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node.db", "storage.key", clockMarkName} {
		copyFile(t, filepath.Join(backup, f), filepath.Join(dir, f))
	}
	open(newWall(), true)
	for _, p := range []string{"e", "z"} {
		link(p)
		a.reconcile(p)
		if st := a.RestoreStatus(); !st.Held {
			t.Fatalf("hold released by a reconciliation with %s, which holds none of a's events: %+v", p, st)
		}
		if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 20}, map[string]any{"a": 20}); !errors.Is(err, ErrAwaitingReconcile) {
			t.Fatalf("write after reconciling with %s: %v", p, err)
		}
	}
	link("b")
	a.reconcile("b")
	if st := a.RestoreStatus(); st.Held {
		t.Fatalf("still held after reconciling with b, which holds a's events: %+v", st)
	}
	out, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 20}, map[string]any{"a": 20})
	if err != nil {
		t.Fatal(err)
	}
	if out.HLC <= highest {
		t.Fatalf("write issued HLC %v, not above the released %v", out.HLC, highest)
	}
}

// TestReleaseRestoreHold: the operator's explicit release lets writes
// resume without a reconciliation.
func TestReleaseRestoreHold(t *testing.T) {
	a := openTestNode(t, Config{Name: "a", Restored: true, RestoreWait: 20 * time.Millisecond})
	a.define(defT)
	if _, err := a.Upsert(a.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": 1}); !errors.Is(err, ErrAwaitingReconcile) {
		t.Fatalf("write while held: %v", err)
	}
	a.ReleaseRestoreHold()
	if st := a.RestoreStatus(); st.Held {
		t.Fatalf("held after ReleaseRestoreHold: %+v", st)
	}
	if got := gaugeValue(t, a, "syncmesh_restore_writes_held_since_timestamp_seconds"); got != 0 {
		t.Fatalf("held gauge %v after the release", got)
	}
	a.write(1)
	a.ReleaseRestoreHold() // a no-op now
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestClockBehindMarkIsLoud (regression): a node reopened with its wall
// clock set back 10 minutes (past the 300 s skew bound) below its clock
// mark refuses local writes as clock skew; Open says so in a warning with
// how long writes will be refused, a gauge reports the lag and the health
// check fails — until the wall clock catches up.
func TestClockBehindMarkIsLoud(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := newWall()
	n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &testNode{Node: n, t: t, wall: w, ctx: ctx}
	a.define(defT)
	a.write(1)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	w.Advance(-10 * time.Minute)
	var logs syncBuffer
	n, err = Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now, NoSync: true,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	a = &testNode{Node: n, t: t, wall: w, ctx: ctx}
	if !strings.Contains(logs.String(), "wall clock is behind the clock mark") || !strings.Contains(logs.String(), "writes_refused_for=") {
		t.Fatalf("no warning at Open:\n%s", logs.String())
	}
	if got := gaugeValue(t, a, "syncmesh_clock_behind_mark_seconds"); got < 590 {
		t.Fatalf("clock-behind gauge %v, want about 600", got)
	}
	rec := httptest.NewRecorder()
	n.serveHealth(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "refused") {
		t.Fatalf("health %d %q", rec.Code, rec.Body.String())
	}
	if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 2}, map[string]any{"a": 2}); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("write with the wall clock behind: %v", err)
	}
	w.Advance(10 * time.Minute)
	rec = httptest.NewRecorder()
	n.serveHealth(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Fatalf("health after the wall clock caught up: %d %q", rec.Code, rec.Body.String())
	}
	a.write(3)
}
