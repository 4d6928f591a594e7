package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
)

func upsertN(t *testing.T, n *Node, from, count int, col string) {
	t.Helper()
	for i := from; i < from+count; i++ {
		if _, err := n.Upsert(context.Background(), "app", "t", map[string]any{"id": i}, map[string]any{col: i}); err != nil {
			t.Fatal(err)
		}
	}
}

func peerStatus(t *testing.T, n *Node, peer string) PeerStatus {
	t.Helper()
	ps, err := n.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Peer == peer {
			return p
		}
	}
	t.Fatalf("no peer %s", peer)
	return PeerStatus{}
}

func TestSyncTwoNodesConvergeWithWatermarks(t *testing.T) {
	m := newTestMesh(t, 1, []string{"a", "b"}, nil)
	m.fullMesh()
	a, b := m.nodes["a"].Node, m.nodes["b"].Node
	upsertN(t, a, 0, 5, "a")
	upsertN(t, b, 3, 5, "b")
	if _, err := a.Delete(context.Background(), "app", "t", map[string]any{"id": 4}); err != nil {
		t.Fatal(err)
	}
	m.syncAll(10)
	if sa, sb := state(t, a), state(t, b); sa != sb {
		t.Fatalf("states differ:\n%s\n---\n%s", sa, sb)
	}
	ga := GroupKey{Site: a.Identity().Site, Schema: "app", Table: "t"}
	wb := watermarkMap(t, b)
	if wb[ga] < uint64(a.Clock())-uint64(1<<16) || wb[ga] == 0 {
		t.Fatalf("b's watermark of a's group = %v; a's clock %v", messages.HLC(wb[ga]), a.Clock())
	}
	// a sees how far b is: b reported its watermark of a's group.
	st := peerStatus(t, a, "b")
	if st.Watermarks[ga] != messages.HLC(wb[ga]) || st.Cursor != st.Tail {
		t.Fatalf("a's view of b: %+v; b's watermark %v", st, messages.HLC(wb[ga]))
	}
}

func TestSyncLineConvergesThroughTheMiddle(t *testing.T) {
	m := newTestMesh(t, 2, []string{"a", "b", "c"}, nil)
	m.link("a", "b")
	m.link("b", "a")
	m.link("b", "c")
	m.link("c", "b")
	upsertN(t, m.nodes["a"].Node, 0, 10, "a")
	upsertN(t, m.nodes["c"].Node, 5, 10, "c")
	m.syncAll(10)
	sa, sb, sc := state(t, m.nodes["a"].Node), state(t, m.nodes["b"].Node), state(t, m.nodes["c"].Node)
	if sa != sb || sb != sc {
		t.Fatalf("line a–b–c did not converge:\n%s\n---\n%s\n---\n%s", sa, sb, sc)
	}
	// Only a speaks for a's events (the progress rule): b relays them to
	// c but no claim about them, so c has no watermark of a's group, and
	// b's of a's group and c's of c's own come from their origins.
	ga := GroupKey{Site: m.nodes["a"].Identity().Site, Schema: "app", Table: "t"}
	gc := GroupKey{Site: m.nodes["c"].Identity().Site, Schema: "app", Table: "t"}
	if w := watermarkMap(t, m.nodes["c"].Node)[ga]; w != 0 {
		t.Fatalf("c holds a watermark %v for a's group that only a relay could have claimed", messages.HLC(w))
	}
	if watermarkMap(t, m.nodes["b"].Node)[ga] == 0 || watermarkMap(t, m.nodes["b"].Node)[gc] == 0 {
		t.Fatal("b has no watermark for its neighbours' groups")
	}
}

func TestCursorStartsAtGenesisForAJoiningPeer(t *testing.T) {
	m := newTestMesh(t, 3, []string{"a", "b"}, nil)
	upsertN(t, m.nodes["a"].Node, 0, 30, "a")
	m.link("a", "b")
	rep, err := m.nodes["a"].SyncNow(context.Background(), "b", "")
	if err != nil || rep.Err != nil {
		t.Fatal(err, rep.Err)
	}
	if rep.After != 0 || rep.Offered != 30 || !rep.Done() {
		t.Fatalf("first push to a new peer: %+v; want all 30 from genesis", rep)
	}
	if len(logIDs(t, m.nodes["b"].Node)) != 30 {
		t.Fatal("b did not receive a's history")
	}
}

func TestFailedPushLeavesCursorAndReoffersTheSameBatch(t *testing.T) {
	m := newTestMesh(t, 4, []string{"a", "b"}, nil)
	m.link("a", "b")
	a := m.nodes["a"].Node
	upsertN(t, a, 0, 7, "a")
	m.net.SetFaults(Faults{Drop: 1})
	rep, _ := a.SyncNow(context.Background(), "b", "")
	if !errors.Is(rep.Err, replicate.ErrUnreachable) {
		t.Fatalf("dropped push: %+v", rep)
	}
	if st := peerStatus(t, a, "b"); st.Cursor != 0 {
		t.Fatalf("cursor moved to %d after a failed push", st.Cursor)
	}
	// The result is lost after the receiver applied: still not advanced.
	m.net.SetFaults(Faults{DropReply: 1})
	rep, _ = a.SyncNow(context.Background(), "b", "")
	if rep.Err == nil || peerStatus(t, a, "b").Cursor != 0 {
		t.Fatalf("lost result: %+v, cursor %d", rep, peerStatus(t, a, "b").Cursor)
	}
	m.net.SetFaults(Faults{})
	rep, _ = a.SyncNow(context.Background(), "b", "")
	if rep.Err != nil || rep.After != 0 || rep.Through != 7 || rep.Offered != 7 {
		t.Fatalf("re-offer: %+v; want the same 7 events from genesis", rep)
	}
	if got := rep.Result.Applied; got != 7 {
		t.Fatalf("re-offered events counted %d done (duplicates count as applied)", got)
	}
}

func TestCursorIsDurableAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	net := NewNetwork(5)
	a := openTestNode(t, Config{Dir: dir, Name: "a", SyncInterval: -1, NoSync: true})
	a.define(defT)
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1})
	b.define(defT)
	trustNode(t, b.Node, a.Node)
	net.Register("b", b.Node)
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	if err := b.AcceptPeer("a"); err != nil {
		t.Fatal(err)
	}
	upsertN(t, a.Node, 0, 12, "a")
	if rep, _ := a.SyncNow(context.Background(), "b", ""); rep.Offered != 12 || rep.Err != nil {
		t.Fatalf("%+v", rep)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a2 := openTestNode(t, Config{Dir: dir, Name: "a", SyncInterval: -1, NoSync: true})
	if err := a2.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	rep, _ := a2.SyncNow(context.Background(), "b", "")
	if rep.Err != nil || rep.After != 12 || rep.Offered != 0 {
		t.Fatalf("after restart: %+v; want the cursor at 12 and nothing offered", rep)
	}
}

func TestHeldGroupIsReportedAndReoffered(t *testing.T) {
	m := newTestMesh(t, 6, []string{"a", "b"}, nil)
	m.link("a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	defU := TableDef{Schema: "app", Table: "u", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	a.define(defU)
	if _, err := a.Upsert(context.Background(), "app", "u", map[string]any{"id": 1}, map[string]any{"v": "x"}); err != nil {
		t.Fatal(err)
	}
	upsertN(t, a.Node, 0, 2, "a")
	rep, _ := a.SyncNow(context.Background(), "b", "")
	gu := messages.Group{Site: a.Identity().Site, Schema: "app", Table: "u"}
	if rep.Err != nil || len(rep.Result.Held) != 1 || rep.Result.Held[0] != gu || len(rep.Result.Retry) != 1 || rep.Retry != 1 {
		t.Fatalf("push with a missing table: %+v result %+v", rep, rep.Result)
	}
	ku := GroupKey{Site: gu.Site, Schema: "app", Table: "u"}
	if _, ok := watermarkMap(t, b.Node)[ku]; ok {
		t.Fatal("watermark of a held group advanced")
	}
	// Re-offered next cycle while the table is still missing.
	rep, _ = a.SyncNow(context.Background(), "b", "")
	if rep.Offered != 1 || rep.Retry != 1 {
		t.Fatalf("re-offer while held: %+v", rep)
	}
	b.define(defU)
	rep, _ = a.SyncNow(context.Background(), "b", "")
	if rep.Err != nil || rep.Retry != 0 || rep.Result.Applied != 1 {
		t.Fatalf("re-offer after DefineTable: %+v %+v", rep, rep.Result)
	}
	if _, ok := watermarkMap(t, b.Node)[ku]; !ok {
		t.Fatal("watermark of the released group did not advance")
	}
}

func TestFarFutureEventAppliesOnceReceiverClockCatchesUp(t *testing.T) {
	m := newTestMesh(t, 7, []string{"a", "b"}, nil)
	m.link("a", "b")
	a, b := m.nodes["a"], m.nodes["b"]
	a.wall.Advance(20 * time.Minute) // a's clock runs 20 min ahead of b's
	upsertN(t, a.Node, 0, 1, "a")
	rep, _ := a.SyncNow(context.Background(), "b", "")
	if rep.Err != nil || rep.Result.Rejected != 1 || rep.Retry != 1 {
		t.Fatalf("far-future push: %+v %+v", rep, rep.Result)
	}
	if len(logIDs(t, b.Node)) != 0 {
		t.Fatal("the receiver stored a far-future event")
	}
	b.wall.Advance(10 * time.Minute) // still more than 300 000 ms behind
	if rep, _ = a.SyncNow(context.Background(), "b", ""); rep.Result.Rejected != 1 || len(logIDs(t, b.Node)) != 0 {
		t.Fatalf("still skewed: %+v", rep.Result)
	}
	b.wall.Advance(6 * time.Minute)
	rep, _ = a.SyncNow(context.Background(), "b", "")
	if rep.Err != nil || rep.Retry != 0 || rep.Result.Applied != 1 {
		t.Fatalf("after the clock caught up: %+v %+v", rep, rep.Result)
	}
	if state(t, a.Node) != state(t, b.Node) {
		t.Fatal("not converged after the far-future event applied")
	}
}

func TestWatermarksLetSendersSkipWhatPeersHave(t *testing.T) {
	m := newTestMesh(t, 8, []string{"a", "b", "c"}, nil)
	m.fullMesh()
	ctx := context.Background()
	a, b, c := m.nodes["a"].Node, m.nodes["b"].Node, m.nodes["c"].Node
	push := func(from *Node, to string) CycleReport {
		t.Helper()
		rep, err := from.SyncNow(ctx, to, "")
		if err != nil || rep.Err != nil {
			t.Fatal(err, rep.Err)
		}
		return rep
	}
	upsertN(t, a, 0, 40, "a")
	push(a, "c") // c has a's 40 events directly
	push(b, "c") // b learns c's watermarks from the result
	push(a, "b") // b now holds the same 40
	rep := push(b, "c")
	if rep.Skipped != 40 || rep.Offered != 0 {
		t.Fatalf("b relayed to c what c's watermark covers: %+v", rep)
	}
	if state(t, b) != state(t, c) {
		t.Fatal("b and c differ")
	}
}

func TestSenderIgnoringWatermarksStillConverges(t *testing.T) {
	m := newTestMesh(t, 9, []string{"a", "b", "c"}, func(string) Config { return Config{IgnorePeerWatermarks: true} })
	m.fullMesh()
	m.net.SetFaults(Faults{Drop: 0.2, DropReply: 0.2, Duplicate: 0.2, Reorder: 0.3})
	for i, name := range m.names {
		upsertN(t, m.nodes[name].Node, i*3, 6, name)
	}
	for r := 0; r < 5; r++ {
		for _, a := range m.names {
			for _, b := range m.links[a] {
				_, _ = m.nodes[a].SyncNow(context.Background(), b, "")
			}
		}
	}
	m.net.SetFaults(Faults{})
	m.syncAll(20)
	s0 := state(t, m.nodes["a"].Node)
	for _, name := range m.names[1:] {
		if s := state(t, m.nodes[name].Node); s != s0 {
			t.Fatalf("%s differs:\n%s\n---\n%s", name, s, s0)
		}
	}
}

func TestHostilePushIsRefusedAndChangesNothing(t *testing.T) {
	n := openTestNode(t, Config{Name: "n", SyncInterval: -1})
	n.define(defT)
	if err := n.AcceptPeer("evil"); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t, 9)
	n.trust(p)
	good := p.upsert(hlcAt(n.wall.MS(), 0), 1, map[string]any{"a": "x"})
	forged := append([]byte(nil), good...)
	forged[len(forged)-3] ^= 0xff
	log := make([]byte, 16)
	bad := &messages.SyncPush{V: messages.SyncVersion, From: "evil", Log: log, After: 5, Through: 2, Tail: 9}
	if _, err := n.HandlePush(context.Background(), bad); !errors.Is(err, messages.ErrSyncInvalid) {
		t.Fatalf("invalid range: %v", err)
	}
	push := &messages.SyncPush{V: messages.SyncVersion, From: "evil", Log: log, After: 0, Through: 3, Tail: 3,
		Events: []messages.PushedEvent{{Seq: 1, Raw: forged}, {Seq: 2, Raw: []byte{0xff, 0x00}}, {Seq: 3, Raw: good}}}
	res, err := n.HandlePush(context.Background(), push)
	if err != nil {
		t.Fatal(err)
	}
	// Forged and garbage events are dropped for good (not re-offered);
	// the good one behind them applied.
	if res.Applied != 3 || len(res.Retry) != 0 {
		t.Fatalf("result %+v", res)
	}
	if _, ok := n.get(1); !ok {
		t.Fatal("the valid event behind forged ones did not apply")
	}
}

func TestSyncCyclesRunOnTheirOwn(t *testing.T) {
	m := newTestMesh(t, 10, []string{"a", "b", "c"}, func(string) Config { return Config{SyncInterval: 20 * time.Millisecond, PushBatch: 7} })
	m.fullMesh()
	m.net.SetFaults(Faults{Drop: 0.2, DropReply: 0.1, Duplicate: 0.1, Reorder: 0.2, Delay: 2 * time.Millisecond})
	for i, name := range m.names {
		upsertN(t, m.nodes[name].Node, i*10, 25, name)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sa := state(t, m.nodes["a"].Node)
		if sa == state(t, m.nodes["b"].Node) && sa == state(t, m.nodes["c"].Node) && len(logIDs(t, m.nodes["a"].Node)) == 75 {
			// Pipelined pushes (several in flight while catching up) still
			// end with every watermark covering every writer's events.
			m.net.SetFaults(Faults{})
			done := true
			for _, w := range m.names {
				g := GroupKey{Site: m.nodes[w].Identity().Site, Schema: "app", Table: "t"}
				for _, r := range m.names {
					if r != w && watermarkMap(t, m.nodes[r].Node)[g] < newestOwn(t, m.nodes[w].Node) {
						done = false
					}
				}
			}
			if done {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("timer-driven cycles did not converge within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatermarkNeverCoversMissingEventsUnderConcurrentWrites pushes while
// many goroutines write: whenever the receiver's watermark of the
// writer's group is h, it holds every one of the writer's events at or
// below h (SSP/1 §14.2: no progress it cannot demonstrate).
func TestWatermarkNeverCoversMissingEventsUnderConcurrentWrites(t *testing.T) {
	m := newTestMesh(t, 11, []string{"a", "b"}, func(string) Config { return Config{Dir: t.TempDir(), NoSync: true, PushBatch: 4000} })
	m.link("a", "b")
	a, b := m.nodes["a"].Node, m.nodes["b"].Node
	ga := GroupKey{Site: a.Identity().Site, Schema: "app", Table: "t"}
	ctx := context.Background()
	stop := make(chan struct{})
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		go func(w int) {
			for k := 0; ; k++ {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": w*1000 + k}, map[string]any{"a": k}); err != nil {
					errc <- err
					return
				}
			}
		}(w)
	}
	check := func() {
		h := messages.HLC(watermarkMap(t, b)[ga])
		have := logIDs(t, b)
		var after uint64
		for {
			es, err := a.Log(ctx, after, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) == 0 {
				return
			}
			for _, e := range es {
				if e.HLC <= h && !have[e.ID.String()] {
					t.Fatalf("b's watermark %v covers a's event %v it does not hold", h, e.HLC)
				}
				after = e.Seq
			}
		}
	}
	for i := 0; i < 60; i++ {
		if _, err := a.SyncNow(ctx, "b", ""); err != nil {
			t.Fatal(err)
		}
		check()
	}
	close(stop)
	for w := 0; w < 8; w++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	m.syncAll(1000)
	check()
	if state(t, a) != state(t, b) {
		t.Fatal("not converged")
	}
}

// newestOwn is the highest HLC of the node's own events in its log.
func newestOwn(t *testing.T, n *Node) uint64 {
	t.Helper()
	var newest, after uint64
	for {
		es, err := n.Log(context.Background(), after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			return newest
		}
		for _, e := range es {
			if e.Site == n.Identity().Site && uint64(e.HLC) > newest {
				newest = uint64(e.HLC)
			}
			after = e.Seq
		}
	}
}
