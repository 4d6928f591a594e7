package runtime

import (
	"testing"
	"time"
)

// waitRows polls until n holds want rows of app.t (reconciliation runs in
// the background), failing after a generous deadline.
func waitRows(t *testing.T, n *testNode, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := rowCount(t, n)
		if c == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d rows, want %d", n.Name(), c, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLateTrustRepairedByTrustAlone: events a
// pushes before b trusts a are dropped and a's cursor moves past them;
// Trust alone — the test never calls Reconcile — brings them back.
func TestLateTrustRepairedByTrustAlone(t *testing.T) {
	a, b, _ := reconPairAuto(t, false, 0)
	for i := 0; i < 20; i++ {
		a.write(i)
	}
	a.syncNow("b")
	if rep := a.syncNow("b"); rep.Offered != 0 || rowCount(t, b) != 0 {
		t.Fatalf("setup: offered %d, b holds %d rows", rep.Offered, rowCount(t, b))
	}
	trustNode(t, b.Node, a.Node)
	waitRows(t, b, 20)
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("not converged:\n%s\n%s", sa, sb)
	}
}

// TestAddPeerReconciles: a node that adds a peer
// fetches what the peer holds, though the peer never pushes to it.
func TestAddPeerReconciles(t *testing.T) {
	net := NewNetwork(1)
	a := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	trustNode(t, b.Node, a.Node)
	for i := 0; i < 10; i++ {
		a.write(i)
	}
	if err := b.AddPeer("a", net.Transport("b"), ""); err != nil {
		t.Fatal(err)
	}
	waitRows(t, b, 10)
}

// TestScheduledReconciliationRepairsWithoutATrigger: with a short
// interval, events a relay skipped (an overstated watermark) reach b
// with no Reconcile call, no Trust and no AddPeer after the loss.
func TestScheduledReconciliationRepairsWithoutATrigger(t *testing.T) {
	a, c, b := reconRelay(t, 20*time.Millisecond)
	overstateAndRelay(t, a, c, b)
	waitRows(t, b, 6)
	// The rows are applied while the reconciliation runs; its metrics are
	// recorded when it returns, so they may trail the rows a little.
	count := func() (runs, missing float64) {
		mfs, err := b.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetName() {
				case "syncmesh_reconcile_total":
					runs += m.GetCounter().GetValue()
				case "syncmesh_reconcile_events_missing_total":
					missing += m.GetCounter().GetValue()
				}
			}
		}
		return runs, missing
	}
	runs, missing := count()
	for deadline := time.Now().Add(30 * time.Second); (runs < 1 || missing < 5) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		runs, missing = count()
	}
	if runs < 1 || missing < 5 {
		t.Fatalf("metrics: %v reconciliations, %v events found missing", runs, missing)
	}
}

// TestOneWayLateTrustRepairedByTrustAlone (regression): b pushes to a over
// a one-way link (b AddPeer a; a only AcceptPeer b). a drops b's pushes
// while b's key is unknown and b's cursor moves past them. Trust alone at
// a — the test never calls Reconcile — brings them back: a pulls from the
// peer it accepts over the Network that delivers b's pushes.
func TestOneWayLateTrustRepairedByTrustAlone(t *testing.T) {
	net := NewNetwork(1)
	a := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	if err := a.AcceptPeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := b.AddPeer("a", net.Transport("b"), ""); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		b.write(i)
	}
	b.syncNow("a")
	if rep := b.syncNow("a"); rep.Offered != 0 || rowCount(t, a) != 0 {
		t.Fatalf("setup: offered %d, a holds %d rows", rep.Offered, rowCount(t, a))
	}
	trustNode(t, a.Node, b.Node)
	waitRows(t, a, 8)
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("not converged:\n%s\n%s", sa, sb)
	}
}

// TestRetireLiftedRepairs (regression): a trusts b's key retired at a
// cutoff below b's writes, so a drops b's pushes (retired) and b's cursor
// moves past them. Lifting the retirement (Retire with cutoff 0) alone —
// no Reconcile call — brings them back, over a one-way link (a only
// accepts b) and over a two-way one.
func TestRetireLiftedRepairs(t *testing.T) {
	for _, oneWay := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-way", false: "two-way"}[oneWay], func(t *testing.T) {
			net := NewNetwork(1)
			a := openTestNode(t, Config{Name: "a", SyncInterval: -1})
			b := openTestNode(t, Config{Name: "b", SyncInterval: -1})
			for _, n := range []*testNode{a, b} {
				n.define(defT)
				net.Register(n.Name(), n.Node)
			}
			id := b.Identity()
			if err := a.Trust(a.ctx, PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey, Cutoff: 1}); err != nil {
				t.Fatal(err)
			}
			var err error
			if oneWay {
				err = a.AcceptPeer("b")
			} else {
				err = a.AddPeer("b", net.Transport("a"), "")
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := b.AddPeer("a", net.Transport("b"), ""); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 8; i++ {
				b.write(i)
			}
			b.syncNow("a")
			if rep := b.syncNow("a"); rep.Offered != 0 || rowCount(t, a) != 0 {
				t.Fatalf("setup: offered %d, a holds %d rows", rep.Offered, rowCount(t, a))
			}
			if err := a.Retire(a.ctx, id.Kid, 0); err != nil {
				t.Fatal(err)
			}
			waitRows(t, a, 8)
		})
	}
}
