package runtime

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// gatedTransport holds a sender's pushes until released, and records,
// for every reconciliation request sent over it, how many events the
// peer's log held at that moment.
type gatedTransport struct {
	inner Transport
	peer  *Node
	gate  chan struct{}
	once  sync.Once

	mu     sync.Mutex
	atCall []uint64
	gated  []bool // the pushes were still held when the request was sent
}

func (g *gatedTransport) release() { g.once.Do(func() { close(g.gate) }) }

func (g *gatedTransport) Push(ctx context.Context, peer string, p *messages.SyncPush) (*messages.PushResult, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.inner.Push(ctx, peer, p)
}

func (g *gatedTransport) reconcileCall(ctx context.Context, from, peer string, kind byte, req []byte) ([]byte, error) {
	held, err := g.peer.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	gated := true
	select {
	case <-g.gate:
		gated = false
	default:
	}
	g.mu.Lock()
	g.atCall = append(g.atCall, held)
	g.gated = append(g.gated, gated)
	g.mu.Unlock()
	g.release() // a reconciliation started: the pushes may go on
	return g.inner.(reconcileTransport).reconcileCall(ctx, from, peer, kind, req)
}

// TestAddPeerReconcilesOnceCaughtUp: a node that adds a peer catching up
// from genesis reconciles with it only once its pushes offered the peer
// the whole log — then the two sets agree in one round — not while the
// pushes are under way, when the sets differ by the whole log and the
// session loads every key of it (on 100 000 events about a third of the
// source's CPU during the catch-up). The pushes wait until a
// reconciliation request is sent or 300 ms passed, so a reconciliation
// started at AddPeer is seen while the peer holds nothing.
func TestAddPeerReconcilesOnceCaughtUp(t *testing.T) {
	const events = 50
	net := NewNetwork(1)
	a := openTestNode(t, Config{Name: "a", SyncInterval: 5 * time.Millisecond, PushBatch: 10}) // reconciles on AddPeer
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	trustNode(t, b.Node, a.Node)
	if err := b.AcceptPeer("a"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < events; i++ {
		a.write(i)
	}
	g := &gatedTransport{inner: net.Transport("a"), peer: b.Node, gate: make(chan struct{})}
	timer := time.AfterFunc(300*time.Millisecond, g.release)
	defer timer.Stop()
	if err := a.AddPeer("b", g, ""); err != nil {
		t.Fatal(err)
	}
	waitRows(t, b, events)
	deadline := time.Now().Add(20 * time.Second)
	var st PeerStatus
	for {
		ps, err := a.Peers(a.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && !ps[0].LastReconcile.At.IsZero() {
			st = ps[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconciliation with b after it caught up: %+v", ps)
		}
		time.Sleep(5 * time.Millisecond)
	}
	g.mu.Lock()
	calls := append([]uint64(nil), g.atCall...)
	g.mu.Unlock()
	if len(calls) == 0 {
		t.Fatal("the reconciliation sent no request over the peer's transport")
	}
	for i, held := range calls {
		if held != events {
			t.Fatalf("reconciliation request %d sent while b held %d of the %d events pushed to it", i, held, events)
		}
	}
	if r := st.LastReconcile; r.Err != nil || r.Rounds != 1 || r.Missing != 0 {
		t.Fatalf("reconciliation after the catch-up: err %v, %d rounds, %d missing; want one agreeing round", r.Err, r.Rounds, r.Missing)
	}
}

// TestRestoredNodeReconcilesAtAddPeerBeforeItsPushes: a node opened from a
// restore (Config.Restored: its log rotated, its clock held) reconciles
// with a peer as AddPeer adds it, before its pushes (held here until a
// reconciliation request is sent or 300 ms passed) offered anything: what
// the copy lost comes back first, and the reconciliation releases the
// clock.
func TestRestoredNodeReconcilesAtAddPeerBeforeItsPushes(t *testing.T) {
	net := NewNetwork(1)
	a := openTestNode(t, Config{Name: "a", Dir: t.TempDir(), NoSync: true, Restored: true, SyncInterval: 5 * time.Millisecond})
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	if err := b.AcceptPeer("a"); err != nil {
		t.Fatal(err)
	}
	// b holds events of the table: a reconciliation with a peer holding
	// nothing would be no evidence for the release (restore.go).
	b.write(1)
	g := &gatedTransport{inner: net.Transport("a"), peer: b.Node, gate: make(chan struct{})}
	timer := time.AfterFunc(300*time.Millisecond, g.release)
	defer timer.Stop()
	if err := a.AddPeer("b", g, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.clock.Released():
	case <-time.After(20 * time.Second):
		t.Fatal("the restored node's clock is still held: no reconciliation completed")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.gated) == 0 || !g.gated[0] {
		t.Fatalf("the first reconciliation request was sent after the pushes went on (held at each request: %v)", g.gated)
	}
}
