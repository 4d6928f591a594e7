package runtime

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
)

// burstOverLink is larger than a link's queue and window together.
const burstOverLink = maxLinkQueue + linkWindow + 200

// committedSet records the ids a receiver's application committed.
type committedSet struct {
	mu  sync.Mutex
	ids map[MessageID]bool
	wg  sync.WaitGroup
}

// handler commits every delivery (beside the Handler, as an application
// applying messages would) and records the ids it committed.
func (c *committedSet) handler(node func() *Node) func(context.Context, ReceivedMessage) {
	return func(ctx context.Context, m ReceivedMessage) {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			res, err := node().CommitMessage(ctx, m)
			if err == nil && res.Status == Committed {
				c.mu.Lock()
				c.ids[m.ID] = true
				c.mu.Unlock()
			}
		}()
	}
}

func (c *committedSet) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

func droppedCount(t *testing.T, reg *prometheus.Registry, side string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_delivery_envelopes_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "side" && l.GetValue() == side {
					v += m.GetCounter().GetValue()
				}
			}
		}
	}
	return v
}

// burstUntilCommitted sends burstOverLink messages from alice to bob while
// bob's link is held (gate shut: the receiver is slower than its
// sender), releases it, and waits until bob's application committed every
// one and alice holds none pending — with the default configuration
// (DeviceConfig.Retry zero), within a bound far above the retry schedule.
func burstUntilCommitted(t *testing.T, alice, bob *Node, gate *linkGate, got *committedSet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The session first (its initiation and the ACK that completes it).
	if _, err := alice.Send(ctx, bob.DeviceAddress(), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for got.count() < 1 {
		if ctx.Err() != nil {
			t.Fatal("the first message was never committed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	gate.shut()
	refused := 0
	for i := 0; i < burstOverLink; i++ {
		if _, err := alice.Send(ctx, bob.DeviceAddress(), []byte("burst")); err != nil {
			if !errors.Is(err, ErrNotHandedOff) {
				gate.open()
				t.Fatal(err)
			}
			refused++ // pending: the retry schedule carries it
		}
	}
	gate.open()
	want := burstOverLink + 1
	for {
		p, err := alice.PendingSentMessages(ctx, 0, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.count() == want && len(p.Messages) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d messages committed by the receiver, %d refused at the hand-off; sender still has pending: %v",
				got.count(), want, refused, len(p.Messages) > 0)
		case <-time.After(20 * time.Millisecond):
		}
	}
	got.wg.Wait()
}

// A burst larger than a link's queue over the in-process Network, default
// configuration: the envelopes past the bound are refused at the hand-off
// (counted at the sender, with a notice), and the default retry schedule
// carries them: every message is committed by the receiver.
func TestBurstPastTheLinkQueueIsRetriedAndVisibleOverNetwork(t *testing.T) {
	net := NewNetwork(7)
	var gate linkGate
	net.linkHold = gate.wait
	got := &committedSet{ids: map[MessageID]bool{}}
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	aReg, bReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	ctx := context.Background()
	alice, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "alice", SyncInterval: -1, Registerer: aReg,
		Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Close() })
	var bob *Node
	bob, err = Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "bob", SyncInterval: -1, Registerer: bReg,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Handler: got.handler(func() *Node { return bob })}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { got.wg.Wait(); _ = bob.Close() })
	var notices sync.Map
	cancel := alice.Subscribe(func(x messages.Notice) {
		if d, ok := x.(messages.EnvelopeDropped); ok && d.Sent && d.Peer == bAddr {
			notices.Store(d.ID, true)
		}
	})
	defer cancel()
	for _, n := range []*Node{alice, bob} {
		net.RegisterDevice(n.Name(), n)
	}
	burstUntilCommitted(t, alice, bob, &gate, got)
	if d := droppedCount(t, aReg, "sent"); d == 0 {
		t.Fatal("no refused hand-off counted in syncmesh_delivery_envelopes_dropped_total{side=sent}")
	}
	deadline := time.Now().Add(10 * time.Second)
	seen := 0
	for seen == 0 && time.Now().Before(deadline) {
		notices.Range(func(any, any) bool { seen++; return true })
		time.Sleep(5 * time.Millisecond)
	}
	if seen == 0 {
		t.Fatal("no EnvelopeDropped notice for a refused hand-off")
	}
}

// The same over the remote: its inbound link queue is at the receiver, so
// the receiver counts and notices the drop, and the sender's default
// retry schedule carries the message.
func TestBurstPastTheLinkQueueIsRetriedAndVisibleOverRemote(t *testing.T) {
	ctx := context.Background()
	sys := actortest.System(t)
	rem, err := StartRemote(sys, RemoteConfig{Plaintext: true, RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rem.Close()
	var gate linkGate
	rem.dev.linkHold = gate.wait
	got := &committedSet{ids: map[MessageID]bool{}}
	regs := map[string]*prometheus.Registry{}
	var bob *Node
	open := func(name string, h func(context.Context, ReceivedMessage)) *Node {
		addr := DeviceAddress{User: name, Device: 1}
		regs[name] = prometheus.NewRegistry()
		n, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: name, System: sys, SyncInterval: -1, Registerer: regs[name],
			Device: &DeviceConfig{Address: addr, Transport: rem.DeviceTransport(addr), Handler: h}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { got.wg.Wait(); _ = n.Close() })
		rem.Host(n)
		return n
	}
	alice := open("alice", nil)
	bob = open("bob", got.handler(func() *Node { return bob }))
	addDevicePeers(t, rem, alice, bob)
	var noticed sync.WaitGroup
	noticed.Add(1)
	var once sync.Once
	cancel := bob.Subscribe(func(x messages.Notice) {
		if d, ok := x.(messages.EnvelopeDropped); ok && !d.Sent && d.Peer == alice.DeviceAddress() && d.Reason == "link_queue_full" {
			once.Do(noticed.Done)
		}
	})
	defer cancel()
	burstUntilCommitted(t, alice, bob, &gate, got)
	if d := droppedCount(t, regs["bob"], "received"); d == 0 {
		t.Fatal("no drop counted in syncmesh_delivery_envelopes_dropped_total{side=received}")
	}
	done := make(chan struct{})
	go func() { noticed.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no EnvelopeDropped notice at the receiver")
	}
}

// linkGate holds a link's deliveries while shut.
type linkGate struct {
	mu sync.Mutex
	ch chan struct{} // nil: open
}

func (g *linkGate) wait() {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (g *linkGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
}

func (g *linkGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}
