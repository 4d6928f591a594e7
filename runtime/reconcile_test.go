package runtime

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// reconPair opens a and b on one network, with defT defined on both and
// each added as the other's peer. b does not trust a unless trust is set.
func reconPair(t *testing.T, trust bool) (a, b *testNode, net *Network) {
	return reconPairAuto(t, trust, -1)
}

// reconPairAuto is reconPair with a reconciliation interval (negative:
// manual only; zero: the default schedule and triggers).
func reconPairAuto(t *testing.T, trust bool, interval time.Duration) (a, b *testNode, net *Network) {
	t.Helper()
	net = NewNetwork(1)
	a = openTestNode(t, Config{Name: "a", SyncInterval: -1, ReconcileInterval: interval})
	b = openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: interval})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	trustNode(t, a.Node, b.Node)
	if trust {
		trustNode(t, b.Node, a.Node)
	}
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	if err := b.AddPeer("a", net.Transport("b"), ""); err != nil {
		t.Fatal(err)
	}
	return a, b, net
}

func (n *testNode) write(id int) {
	n.t.Helper()
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": id}, map[string]any{"a": id}); err != nil {
		n.t.Fatalf("upsert: %v", err)
	}
}

func (n *testNode) reconcile(peer string) ReconcileReport {
	n.t.Helper()
	rep, err := n.Reconcile(n.ctx, peer)
	if err != nil {
		n.t.Fatalf("reconcile %s→%s: %v", n.Name(), peer, err)
	}
	return rep
}

func (n *testNode) syncNow(peer string) CycleReport {
	n.t.Helper()
	rep, err := n.SyncNow(n.ctx, peer, "")
	if err != nil || rep.Err != nil {
		n.t.Fatalf("sync %s→%s: %v %v", n.Name(), peer, err, rep.Err)
	}
	return rep
}

func rowCount(t *testing.T, n *testNode) int {
	t.Helper()
	c := 0
	if err := n.Scan(n.ctx, "app", "t", ScanOptions{}, func(Row) bool { c++; return true }); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReconcileLateTrustOverNetwork: events pushed before b trusts a are
// dropped and a's cursor moves past them; reconciliation before Trust
// fetches them once, drops them and remembers it (the next round fetches
// nothing); after Trust they arrive and b converges to a. Reconciliation
// moves no cursor and no watermark.
func TestReconcileLateTrustOverNetwork(t *testing.T) {
	a, b, _ := reconPair(t, false)
	for i := 0; i < 20; i++ {
		a.write(i)
	}
	a.syncNow("b")
	if rep := a.syncNow("b"); rep.Offered != 0 {
		t.Fatalf("second push offered %d: the cursor should be past the dropped events", rep.Offered)
	}
	if c := rowCount(t, b); c != 0 {
		t.Fatalf("b holds %d rows before trusting a", c)
	}
	rep := b.reconcile("a")
	if rep.Missing != 20 || rep.Outcomes[messages.Dropped] != 20 {
		t.Fatalf("before trust: %+v", rep)
	}
	if rep = b.reconcile("a"); rep.Missing != 0 || rep.Fetched != 0 || rep.Rounds != 1 {
		t.Fatalf("dropped events fetched again: %+v", rep)
	}

	peersBefore, err := a.Peers(a.ctx)
	if err != nil {
		t.Fatal(err)
	}
	wmBefore, err := b.Watermarks(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	trustNode(t, b.Node, a.Node)
	rep = b.reconcile("a")
	if rep.Missing != 20 || rep.Outcomes[messages.Applied] != 20 {
		t.Fatalf("after trust: %+v", rep)
	}
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("not converged:\n%s\n%s", sa, sb)
	}
	peersAfter, err := a.Peers(a.ctx)
	if err != nil {
		t.Fatal(err)
	}
	wmAfter, err := b.Watermarks(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if peersBefore[0].Cursor != peersAfter[0].Cursor || !reflect.DeepEqual(wmBefore, wmAfter) {
		t.Fatalf("reconciliation moved a cursor or a watermark: %+v → %+v, %v → %v", peersBefore, peersAfter, wmBefore, wmAfter)
	}
}

// TestReconcileConvergedPairTransfersNothing: once two nodes hold the same
// events, reconciliation in either direction is one round trip of a few
// hundred bytes and fetches no event.
func TestReconcileConvergedPairTransfersNothing(t *testing.T) {
	a, b, _ := reconPair(t, true)
	for i := 0; i < 300; i++ {
		a.write(i)
		if i%3 == 0 {
			b.write(1000 + i)
		}
	}
	if rep := b.reconcile("a"); rep.Missing != 300 || rep.PeerLacks != 100 {
		t.Fatalf("b from a: %+v", rep)
	}
	if rep := a.reconcile("b"); rep.Missing != 100 || rep.PeerLacks != 0 {
		t.Fatalf("a from b: %+v", rep)
	}
	for _, pr := range [][2]*testNode{{a, b}, {b, a}} {
		rep := pr[0].reconcile(pr[1].Name())
		if rep.Missing != 0 || rep.PeerLacks != 0 || rep.Fetched != 0 || rep.Rounds != 1 || rep.BytesSent+rep.BytesReceived > 400 {
			t.Fatalf("%s from %s after convergence: %+v", pr[0].Name(), pr[1].Name(), rep)
		}
		t.Logf("converged pair: %d round trip, %d bytes", rep.Rounds, rep.BytesSent+rep.BytesReceived)
	}
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("not converged:\n%s\n%s", sa, sb)
	}
}

// reconRelay is a line a → c → b with reconciliation at the given
// interval: a's events reach b only through c.
func reconRelay(t *testing.T, interval time.Duration) (a, c, b *testNode) {
	t.Helper()
	net := NewNetwork(1)
	a = openTestNode(t, Config{Name: "a", SyncInterval: -1, ReconcileInterval: -1})
	c = openTestNode(t, Config{Name: "c", SyncInterval: -1, ReconcileInterval: -1})
	b = openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: interval})
	nodes := []*testNode{a, c, b}
	for _, n := range nodes {
		n.define(defT)
		net.Register(n.Name(), n.Node)
		for _, p := range nodes {
			if p != n {
				trustNode(t, n.Node, p.Node)
			}
		}
	}
	for _, l := range [][2]*testNode{{a, c}, {c, a}, {c, b}, {b, c}} {
		if err := l[0].AddPeer(l[1].Name(), net.Transport(l[0].Name()), ""); err != nil {
			t.Fatal(err)
		}
	}
	return a, c, b
}

// overstateAndRelay makes b's watermark for a's group maximal (through its
// store, a test-only hook: the progress rule refuses such a claim on the
// wire), then relays a's six events through c. c skips every event b's
// reported watermark covers and moves its cursor past them: b holds only
// what c pushed before it learned the watermark.
func overstateAndRelay(t *testing.T, a, c, b *testNode) {
	t.Helper()
	g := persistence.GroupKey{Site: a.Identity().Site, Schema: "app", Table: "t"}
	if err := b.store.Update(b.ctx, func(tx persistence.SyncTx) error {
		return tx.PutWatermark(g, persistence.Watermark{HLC: hlcAt(messages.MaxPhysicalMS, 0)})
	}); err != nil {
		t.Fatal(err)
	}
	a.write(0)
	a.syncNow("c")
	c.syncNow("b") // b applies it and reports the overstated watermark
	for i := 1; i < 6; i++ {
		a.write(i)
	}
	a.syncNow("c")
	c.syncNow("b")
	if rep := c.syncNow("b"); rep.Offered != 0 {
		t.Fatalf("c still offers %d events", rep.Offered)
	}
}

// TestReconcileRepairsOverstatedWatermark: b reports a watermark for a's
// group far above what it applied; its relay c then skips a's later events
// and moves its cursor past them. Reconciliation still brings them.
func TestReconcileRepairsOverstatedWatermark(t *testing.T) {
	a, c, b := reconRelay(t, -1)
	overstateAndRelay(t, a, c, b)
	if n := rowCount(t, b); n != 1 {
		t.Fatalf("b holds %d rows: the overstated watermark did not make a skip", n)
	}
	if rep := b.reconcile("c"); rep.Missing != 5 || rep.Outcomes[messages.Applied] != 5 {
		t.Fatalf("reconcile: %+v", rep)
	}
	if sa, sb := state(t, a.Node), state(t, b.Node); sa != sb {
		t.Fatalf("not converged:\n%s\n%s", sa, sb)
	}
}

// TestReconcileBadRequestIsThatPeersError: a malformed, oversized or
// protocol-breaking request fails with a typed error for its sender and
// changes nothing; other peers reconcile as before.
func TestReconcileBadRequestIsThatPeersError(t *testing.T) {
	a, b, _ := reconPair(t, true)
	a.write(1)
	cases := map[string]struct {
		kind byte
		req  []byte
		is   error
	}{
		"garbage":      {reconcileKindRange, []byte{0xff, 0x00}, messages.ErrMalformed},
		"oversized":    {reconcileKindRange, make([]byte, messages.MaxReconcileBytes+1), messages.ErrTooLarge},
		"fetch":        {reconcileKindFetch, []byte{0xa0}, messages.ErrMalformed},
		"unknown kind": {9, []byte{0xa0}, ErrReconcilePeer},
		"id reply to responder": {reconcileKindRange, mustEncode(t, &messages.Reconcile{Groups: []messages.ReconcileGroup{
			{Schema: "app", Table: "t", Ranges: []messages.ReconcileRange{{Mode: messages.RangeIDReply}}}}}), ErrReconcilePeer},
	}
	for name, c := range cases {
		_, err := a.handleReconcile(a.ctx, "mallory", c.kind, c.req)
		if !errors.Is(err, ErrReconcilePeer) || !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want ErrReconcilePeer and %v", name, err, c.is)
		}
	}
	if rep := b.reconcile("a"); rep.Missing != 1 || rep.Outcomes[messages.Applied] != 1 {
		t.Fatalf("honest peer after the bad requests: %+v", rep)
	}
}

func mustEncode(t *testing.T, m *messages.Reconcile) []byte {
	t.Helper()
	b, err := messages.EncodeReconcile(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReconcileServesOnlySyncedGroups: a peer cannot make a node enumerate
// or send events outside the tables it syncs: groups out of its scope or
// undefined are left out of the answer, and a fetch naming another
// table's key, or a table out of scope, gets nothing.
func TestReconcileServesOnlySyncedGroups(t *testing.T) {
	n := openTestNode(t, Config{Name: "n", SyncInterval: -1, ReconcileInterval: -1, Scope: []string{"app/t"}})
	n.define(defT)
	local := TableDef{Schema: "app", Table: "local", KeyColumns: []string{"id"}, Columns: []string{"a"}}
	n.define(local)
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": 1}); err != nil {
		t.Fatal(err)
	}
	var tKeys []messages.ReconcileKey
	if err := n.store.View(n.ctx, func(tx persistence.SyncReader) error {
		return tx.TableEventKeys(persistence.TableKey{Schema: "app", Table: "t"}, 0, func(k persistence.EventKey) (bool, error) {
			tKeys = append(tKeys, messages.NewReconcileKey(k.Site, k.HLC, k.ID))
			return true, nil
		})
	}); err != nil || len(tKeys) != 1 {
		t.Fatalf("keys of app.t: %v %v", tKeys, err)
	}
	// A range message over an out-of-scope and an undefined table.
	req := mustEncode(t, &messages.Reconcile{Groups: []messages.ReconcileGroup{
		{Schema: "app", Table: "local", Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}},
		{Schema: "app", Table: "nope", Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}},
	}})
	raw, err := n.handleReconcile(n.ctx, "mallory", reconcileKindRange, req)
	if err != nil {
		t.Fatal(err)
	}
	if ans, err := messages.DecodeReconcile(raw); err != nil || len(ans.Groups) != 0 {
		t.Fatalf("answer about tables it does not sync: %+v %v", ans, err)
	}
	// A fetch of app.t's key under other tables gets nothing; under app.t
	// it gets the event (the control that the fetch works at all).
	for _, table := range []string{"local", "nope", "t"} {
		req, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: "app", Table: table, Keys: tKeys}}})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := n.handleReconcile(n.ctx, "mallory", reconcileKindFetch, req)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := messages.DecodeReconcileEvents(raw)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 1, false: 0}[table == "t"]; len(evs.Events) != want {
			t.Fatalf("fetch under %s served %d events, want %d", table, len(evs.Events), want)
		}
	}
}

// TestReconcileUnknownPeer: Reconcile needs a peer added with AddPeer.
func TestReconcileUnknownPeer(t *testing.T) {
	a, _, _ := reconPair(t, true)
	if _, err := a.Reconcile(context.Background(), "zed"); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
}

// A session that began before a Trust and dropped an event (unknown kid)
// must not remember the drop: the reconciliation Trust starts would count
// the event as held and never fetch it (a race of a background session
// with Trust; the late-trust tests over the remote could hit it under
// load).
func TestDropDecidedBeforeTrustIsNotRemembered(t *testing.T) {
	var r reconState
	g := reconcile.Group{Schema: "app", Table: "t"}
	k := droppedKey{group: g, key: messages.NewReconcileKey(messages.SiteID{1}, 5, messages.EventID{2})}
	before := r.generation()
	r.forgetDrops() // Trust
	r.drop("p", before, k)
	if got := r.droppedIn("p", g, 0); len(got) != 0 {
		t.Fatalf("a drop decided before Trust was remembered: %v", got)
	}
	r.drop("p", r.generation(), k)
	if got := r.droppedIn("p", g, 0); len(got) != 1 {
		t.Fatalf("a drop after Trust was not remembered: %v", got)
	}
}

// The schedule reconciles every ReconcileInterval, again and again, and an
// open node waiting for its next run holds no goroutine for it (a timer:
// hosting 10 000 idle devices must not cost 10 000 stacks).
func TestReconcileScheduleRunsRepeatedlyOnATimer(t *testing.T) {
	a, b, _ := reconPairAuto(t, true, 20*time.Millisecond)
	for round, id := range []int{1, 2, 3} {
		a.write(id) // never pushed (SyncInterval < 0): only the schedule moves it
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, ok := b.get(id); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: row %d never reached b by the reconciliation schedule", round, id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// No goroutine waits between runs: one parked (not runnable or
	// running) with the schedule's own function on top is what a
	// goroutine per node looked like. A timer callback caught while it
	// runs is the schedule working, not one.
	buf := make([]byte, 1<<22)
	for _, g := range bytes.Split(buf[:goruntime.Stack(buf, true)], []byte("\n\n")) {
		if parkedIn(g, "startReconcile") {
			t.Fatalf("a goroutine of the reconciliation schedule:\n%s", g)
		}
	}
}

// parkedIn reports whether the goroutine trace g is parked (its state is
// neither runnable nor running) in a function whose name contains fn.
func parkedIn(g []byte, fn string) bool {
	lines := bytes.SplitN(g, []byte("\n"), 3)
	if len(lines) < 2 {
		return false
	}
	state := lines[0]
	if bytes.Contains(state, []byte("[runnable")) || bytes.Contains(state, []byte("[running")) {
		return false
	}
	return bytes.Contains(lines[1], []byte(fn))
}

func TestParkedInReadsTheStateAndTheTopFrame(t *testing.T) {
	for _, c := range []struct {
		trace string
		want  bool
	}{
		{"goroutine 7 [select]:\ngithub.com/x/runtime.(*Node).startReconcile.func1()\n\t/r.go:1", true},
		{"goroutine 7 [chan receive, 2 minutes]:\ngithub.com/x/runtime.(*Node).startReconcile.func1()\n\t/r.go:1", true},
		{"goroutine 7 [runnable]:\ngithub.com/x/runtime.(*Node).startReconcile.func1()\n\t/r.go:1", false},
		{"goroutine 7 [running]:\ngithub.com/x/runtime.(*Node).startReconcile.func1()\n\t/r.go:1", false},
		{"goroutine 7 [select]:\ngithub.com/x/runtime.(*Node).reconcileWith()\n\t/r.go:1\ngithub.com/x/runtime.(*Node).startReconcile.func1()", false},
		{"goroutine 7 [select]:", false},
	} {
		if got := parkedIn([]byte(c.trace), "startReconcile"); got != c.want {
			t.Errorf("parkedIn(%q) = %v, want %v", c.trace, got, c.want)
		}
	}
}

// TestMixedVersionPeersConverge: a (version 3), b (a build that speaks
// only versions 1 and 2) and c (version 3) each hold events the others
// lack. Every pair reconciles, in both directions: a and c fall back to
// version 2 with b (b refuses their first version-3 round with an
// unsupported version and is spoken to in version 2 from then on), speak
// version 3 with each other, and all three converge.
func TestMixedVersionPeersConverge(t *testing.T) {
	net := NewNetwork(1)
	nodes := map[string]*testNode{}
	for _, name := range []string{"a", "b", "c"} {
		n := openTestNode(t, Config{Name: name, SyncInterval: -1, ReconcileInterval: -1})
		n.define(defT)
		net.Register(name, n.Node)
		nodes[name] = n
	}
	nodes["b"].recon.mu.Lock()
	nodes["b"].recon.v2Only = true
	nodes["b"].recon.mu.Unlock()
	for x, nx := range nodes {
		for y, ny := range nodes {
			if x != y {
				trustNode(t, nx.Node, ny.Node)
				if err := nx.AddPeer(y, net.Transport(x), ""); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for i, name := range []string{"a", "b", "c"} {
		for j := 0; j < 60; j++ {
			nodes[name].write(1000*i + j)
		}
	}
	for _, p := range [][2]string{{"a", "b"}, {"b", "a"}, {"c", "b"}, {"b", "c"}, {"a", "c"}, {"c", "a"}} {
		if rep := nodes[p[0]].reconcile(p[1]); rep.Missing == 0 && rep.PeerLacks == 0 && p[0] != "c" {
			t.Fatalf("%s→%s found nothing: %+v", p[0], p[1], rep)
		}
	}
	sa := state(t, nodes["a"].Node)
	for _, name := range []string{"b", "c"} {
		if s := state(t, nodes[name].Node); s != sa {
			t.Fatalf("%s differs from a:\n%s\n%s", name, s, sa)
		}
	}
	if c := rowCount(t, nodes["a"]); c != 180 {
		t.Fatalf("a holds %d rows, want 180", c)
	}
	for _, name := range []string{"a", "c"} {
		if v := nodes[name].recon.peerVersion("b"); v != messages.ReconcileSumVersion {
			t.Errorf("%s speaks version %d to b, want %d after its refusal", name, v, messages.ReconcileSumVersion)
		}
	}
	if v := nodes["a"].recon.peerVersion("c"); v != messages.ReconcileRangeSumVersion {
		t.Errorf("a speaks version %d to c, want %d", v, messages.ReconcileRangeSumVersion)
	}
	// Converged: one round trip each way, whatever the version.
	for _, p := range [][2]string{{"a", "b"}, {"b", "a"}, {"a", "c"}} {
		if rep := nodes[p[0]].reconcile(p[1]); rep.Rounds != 1 || rep.Missing != 0 {
			t.Errorf("%s→%s after convergence: %+v", p[0], p[1], rep)
		}
	}
}
