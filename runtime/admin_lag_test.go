package runtime

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdminPeersLagOnIdleMesh: two nodes over a Network, each writing its
// own rows and pushing on a schedule; a restarts; once they converged
// and went idle, /admin/peers reports them caught up with no time lag on
// either side.
func TestAdminPeersLagOnIdleMesh(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	net := NewNetwork(1)
	open := func(name string) *Node {
		n, err := Open(ctx, Config{Dir: filepath.Join(dir, name), MeshID: testMesh, Name: name, SyncInterval: 100 * time.Millisecond, ReconcileInterval: -1, MetricsAddr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		if err := n.DefineTable(ctx, defT); err != nil {
			t.Fatal(err)
		}
		net.Register(name, n)
		return n
	}
	link := func(a, b *Node) {
		trustNode(t, a, b)
		if err := a.AddPeer(b.Name(), net.Transport(a.Name()), "", PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
		if err := a.AcceptPeer(b.Name(), PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
	}
	a, b := open("a"), open("b")
	link(a, b)
	link(b, a)
	upsertN(t, a, 0, 10, "a")
	upsertN(t, b, 100, 10, "b")
	converge := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for state(t, a) != state(t, b) {
			if time.Now().After(deadline) {
				t.Fatal("no convergence")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	converge()
	// a restarts (its clock resumes from its persisted mark).
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = open("a")
	link(a, b)
	converge()
	// Idle: wait (generously) until every link reports itself caught up
	// with a time lag under a second; the persisted clock mark sits a
	// lease (10 s) ahead of the last write, and reading the own groups'
	// watermark from it read as that much lag, for as long as the mesh
	// stayed idle.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var bad []string
		for _, n := range []*Node{a, b} {
			for _, p := range adminGet[[]PeerReport](t, n, "/admin/peers") {
				if p.LagEvents != 0 || p.GroupsWithoutWatermark != 0 || p.LagMS > 1000 {
					bad = append(bad, fmt.Sprintf("%s reports %s %d ms behind (%d events, %d groups without watermark)", n.Name(), p.Peer, p.LagMS, p.LagEvents, p.GroupsWithoutWatermark))
				}
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("on an idle, converged mesh: %s", strings.Join(bad, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
