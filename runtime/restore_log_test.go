package runtime

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// TestRestoredNodeRotatesItsLogAndWatermarksRiseAgain: a node restored
// from an older copy of node.db gives its log a new id, so the watermarks
// rise again on both sides once they synced:
//   - b's record of a's log under the old id (how far it applied it, its
//     gaps) says nothing about the restored log, which reuses sequences;
//     under a new id b starts it afresh and a's cursor toward b starts
//     at genesis (a new cursor epoch), so a's claims raise b's
//     watermark of a's group to a's newest event;
//   - a's record of b's log went back to the copy's while b's cursor
//     toward a did not: b's pushes no longer extended it and a's
//     watermark of b's group stayed where the copy left it. Seeing a's
//     new log id, b rewinds its cursor toward a and offers it everything
//     again (more bytes, never a skip), and a's watermark of b rises.
//
// The pair also converges (reconciliation takes back a's lost events).
func TestRestoredNodeRotatesItsLogAndWatermarksRiseAgain(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	w := newWall()
	var a *testNode
	open := func() {
		t.Helper()
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
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
	open()
	a.define(defT)
	trustNode(t, a.Node, b.Node)
	trustNode(t, b.Node, a.Node)
	siteA, siteB := a.Identity().Site, b.Identity().Site
	link := func() {
		t.Helper()
		if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(siteB)); err != nil {
			t.Fatal(err)
		}
		if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(siteA)); err != nil && !errors.Is(err, ErrPeerExists) {
			t.Fatal(err)
		}
	}
	// syncBoth runs push cycles both ways until both report done.
	syncBoth := func() {
		t.Helper()
		for round := 0; round < 20; round++ {
			ra, rb := a.syncNow("b"), b.syncNow("a")
			if ra.Done() && rb.Done() && ra.Offered == 0 && rb.Offered == 0 {
				return
			}
		}
		t.Fatal("a and b not done after 20 rounds")
	}
	writeB := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := b.Upsert(ctx, "app", "t", map[string]any{"id": 1000 + i}, map[string]any{"b": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	link()
	for i := 0; i < 3; i++ {
		a.write(i)
	}
	writeB(0, 3)
	syncBoth()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "node.db.bak")
	copyFile(t, filepath.Join(dir, "node.db"), backup)

	open()
	link()
	for i := 10; i < 16; i++ {
		a.write(i)
	}
	writeB(3, 9)
	syncBoth()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	copyFile(t, backup, filepath.Join(dir, "node.db"))
	open()
	if st := a.RestoreStatus(); !st.Suspected || !st.LogRotated {
		t.Fatalf("restored node.db: %+v, want a suspected restore with a rotated log", st)
	}
	for i := 20; i < 22; i++ {
		a.write(i)
	}
	writeB(9, 11)
	link()
	a.reconcile("b")
	b.reconcile("a")
	syncBoth()
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("a and b differ after the restore:\n%s\n---\n%s", sa, sb)
	}
	newest := func(n *Node, site messages.SiteID) uint64 {
		var h messages.HLC
		for x := range ownHLCs(t, n, site) {
			h = max(h, x)
		}
		return uint64(h)
	}
	for _, c := range []struct {
		at     *Node
		of     messages.SiteID
		origin *Node
	}{{b.Node, siteA, a.Node}, {a.Node, siteB, b.Node}} {
		g := GroupKey{Site: c.of, Schema: "app", Table: "t"}
		got, want := watermarkMap(t, c.at)[g], newest(c.origin, c.of)
		if got < want {
			t.Errorf("%s's watermark of %s's group is %v, below its newest event %v", c.at.Name(), c.origin.Name(), messages.HLC(got), messages.HLC(want))
		}
	}
	// A second restart is no restore: the log keeps its new id.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	open()
	if st := a.RestoreStatus(); st.Suspected || st.LogRotated {
		t.Fatalf("an ordinary reopen after the restore rotated the log: %+v", st)
	}
}
