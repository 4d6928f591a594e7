package device_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// Read-write store commits per committed message (one bbolt commit = two
// fdatasyncs), counted with bolt.DB.Commits over the whole flow: the
// sender stores and encrypts, the receiver receives, the application
// commits (the ACK's ratchet step in the same transaction), the sender
// receives the ACK. Counts, not times.

// gatedStore, while gated, holds every read-write transaction after its
// writes ran and before it commits, until the gate opens, and counts the
// operations those writes hold (a pending sent, received or processed
// entry put, a sent entry cleared): the test lets the work of one phase
// reach the committer before the first transaction ends, so what it
// counts does not depend on the scheduler.
type gatedStore struct {
	persistence.DeliveryStore
	written atomic.Int64
	gate    atomic.Pointer[chan struct{}]
}

func (s *gatedStore) Update(ctx context.Context, fn func(persistence.DeliveryTx) error) error {
	g := s.gate.Load()
	if g == nil {
		return s.DeliveryStore.Update(ctx, fn)
	}
	return s.DeliveryStore.Update(ctx, func(tx persistence.DeliveryTx) error {
		err := fn(&countingTx{DeliveryTx: tx, n: &s.written})
		<-*g
		return err
	})
}

// countingTx counts the operations one item of each phase writes once.
type countingTx struct {
	persistence.DeliveryTx
	n *atomic.Int64
}

func (t *countingTx) PutPendingOutbound(p persistence.PendingOutbound) (uint64, error) {
	t.n.Add(1)
	return t.DeliveryTx.PutPendingOutbound(p)
}

func (t *countingTx) PutPendingInbound(p persistence.PendingInbound) (uint64, error) {
	t.n.Add(1)
	return t.DeliveryTx.PutPendingInbound(p)
}

func (t *countingTx) PutProcessedInbound(p persistence.ProcessedInbound) error {
	t.n.Add(1)
	return t.DeliveryTx.PutProcessedInbound(p)
}

func (t *countingTx) DeletePendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	t.n.Add(1)
	return t.DeliveryTx.DeletePendingOutbound(recipient, id)
}

// commitDev is a bolt-backed device whose store is gated and whose
// mailboxes are measured.
type commitDev struct {
	*dev
	gs  *gatedStore
	reg *prometheus.Registry
}

func addCommitDev(ms *mesh, addr messages.DeviceAddress) *commitDev {
	ms.tb.Helper()
	db, err := bolt.Open(filepath.Join(ms.tb.TempDir(), addr.User+".db"), bolt.Options{NoSync: true})
	if err != nil {
		ms.tb.Fatal(err)
	}
	ms.tb.Cleanup(func() { _ = db.Close() })
	reg := prometheus.NewRegistry()
	depths, err := mailbox.NewDepths(reg)
	if err != nil {
		ms.tb.Fatal(err)
	}
	gs := &gatedStore{DeliveryStore: db.Delivery()}
	v := &dev{ms: ms, addr: addr, store: gs, db: db, tweak: func(c *device.Config) { c.Mailboxes = depths }}
	v.start()
	return &commitDev{dev: v, gs: gs, reg: reg}
}

func (c *commitDev) commits() uint64 { return c.db.Commits().Delivery }

// mailbox is the depth of the device's mailboxes of kind (decremented
// after a message was handled).
func (c *commitDev) mailbox(kind string) float64 {
	mfs, err := c.reg.Gather()
	if err != nil {
		c.ms.tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_actor_mailbox_depth_messages" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// phase gates c's store, runs start (which issues n operations that each
// hand one item to the committer), waits until all n were decided and
// handed to the committer, opens the gate and waits for wait. An item is
// handed over when the gated transaction wrote it or it waits in the
// committer's mailbox, whose depth also counts the flush that runs the
// gated transaction.
func (c *commitDev) phase(n int, start func(), wait func()) {
	c.ms.tb.Helper()
	g := make(chan struct{})
	c.gs.gate.Store(&g)
	base := c.gs.written.Load()
	start()
	decided := func() int64 {
		queued := int64(c.mailbox("delivery_committer")) - 1
		return c.gs.written.Load() - base + max(queued, 0)
	}
	deadline := time.Now().Add(20 * time.Second)
	for decided() < int64(n) || c.mailbox("session") != 0 {
		if time.Now().After(deadline) {
			c.ms.tb.Fatalf("%d of %d operations decided", decided(), n)
		}
		time.Sleep(time.Millisecond)
	}
	c.gs.gate.Store(nil)
	close(g)
	wait()
}

// receiveAll hands every queued envelope to c in order without waiting
// (as a pipelining transport does) and returns a wait for their results.
func (c *commitDev) receiveAll(want device.Outcome) (start, wait func()) {
	var wg sync.WaitGroup
	var failed atomic.Pointer[string]
	start = func() {
		for _, e := range c.take() {
			wg.Add(1)
			if err := c.d.ReceiveAsync(bg, e.From, e.Envelope, func(r device.ReceiveResult, err error) {
				defer wg.Done()
				if err != nil || r.Kind != want {
					s := fmt.Sprintf("receive: %+v %v", r, err)
					failed.Store(&s)
				}
			}); err != nil {
				c.ms.tb.Fatal(err)
			}
		}
	}
	wait = func() {
		wg.Wait()
		if s := failed.Load(); s != nil {
			c.ms.tb.Fatal(*s)
		}
	}
	return start, wait
}

func pairCommitDevs(t *testing.T) (*commitDev, *commitDev) {
	ms := newMesh(t)
	a := addCommitDev(ms, aliceAddr)
	b := addCommitDev(ms, bobAddr)
	// Establish the session both ways (no bundle fetch in the counts).
	sm := a.send(b.dev, "hello")
	b.mustRecv(b.takeOne())
	b.commit(a.dev, sm.ID)
	a.pump()
	return a, b
}

// One message at a time: four commits for the pair (send, receive,
// commit with the ACK's step, ACK receive), where there were six.
func TestCommitsPerMessageOneAtATime(t *testing.T) {
	a, b := pairCommitDevs(t)
	const n = 16
	before := a.commits() + b.commits()
	for i := 0; i < n; i++ {
		sm := a.send(b.dev, "m")
		if r := b.mustRecv(b.takeOne()); r.Kind != device.Delivery {
			t.Fatalf("receive = %+v", r)
		}
		if c := b.commit(a.dev, sm.ID); c.Status != device.Committed || !c.AckSent {
			t.Fatalf("commit = %+v", c)
		}
		if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
			t.Fatalf("ack = %+v", acks)
		}
	}
	got := a.commits() + b.commits() - before
	t.Logf("one at a time: %d commits for %d messages (%.2f per message)", got, n, float64(got)/n)
	if got != 4*n {
		t.Fatalf("%d commits for %d messages, want %d (4 per message)", got, n, 4*n)
	}
}

// 64 messages in flight: each step of the flow shares transactions (the
// first one of a phase may hold only the first item; everything decided
// meanwhile shares the next): at most two commits per phase and side.
func TestCommitsPerMessagePipelined(t *testing.T) {
	a, b := pairCommitDevs(t)
	const n = 64
	before := a.commits() + b.commits()

	ids := make([]messages.LogicalMessageID, n)
	var wg sync.WaitGroup
	a.phase(n, func() {
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sm, err := a.d.Send(bg, b.addr, []byte(fmt.Sprint("m", i)))
				if err != nil {
					t.Error(err)
				}
				ids[i] = sm.ID
			}()
		}
	}, wg.Wait)
	start, wait := b.receiveAll(device.Delivery)
	b.phase(n, start, wait)
	b.phase(n, func() {
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c, err := b.d.CommitReceivedMessage(bg, a.addr, id); err != nil || c.Status != device.Committed || !c.AckSent {
					t.Errorf("commit = %+v %v", c, err)
				}
			}()
		}
	}, wg.Wait)
	start, wait = a.receiveAll(device.Acknowledgement)
	a.phase(n, start, wait)

	if p := a.sentPending(); len(p) != 0 {
		t.Fatalf("%d sent messages still pending", len(p))
	}
	got := a.commits() + b.commits() - before
	per := float64(got) / n
	t.Logf("64 in flight: %d commits for %d messages (%.3f per message)", got, n, per)
	// The target is ≤ 0.25 per message for the pair. Each of the four
	// phases is one group commit per side when the gate catches every
	// decision (8 in all); a write that slips past the gate adds one
	// (9 was seen on CI), which the target allows.
	if per > 0.25 {
		t.Fatalf("%d commits for %d messages (%.3f per message), want ≤ 0.25", got, n, per)
	}
}

// noBundle is a transport whose bundle fetches fail while down is set.
type noBundle struct {
	session.Transport
	down *atomic.Bool
}

func (t noBundle) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	if t.down.Load() {
		return nil, errTransportDown
	}
	return t.Transport.FetchBundle(ctx, peer)
}

// The ACK's ratchet step is written in the commit's transaction; an ACK
// that cannot be encrypted (here: no session left and no bundle to start
// one) never fails the commit: COMMITTED, ackSent=false, nothing handed
// over.
func TestCommitAckEncryptionFailureKeepsCommit(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	var down atomic.Bool
	b := ms.add(bobAddr, func(c *device.Config) { c.Transport = noBundle{c.Transport, &down} })
	sm := a.send(b, "x")
	b.mustRecv(b.takeOne())
	if err := b.d.Sessions().ResetSession(bg, a.addr); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	c := b.commit(a, sm.ID)
	if c.Status != device.Committed || c.AckSent {
		t.Fatalf("commit with an ACK that cannot be encrypted = %+v, want COMMITTED, ackSent=false", c)
	}
	if _, ok := b.processed(a, sm.ID); !ok || b.pendingCount() != 0 {
		t.Fatal("the ACK's failure undid the commit")
	}
	if len(a.take()) != 0 || b.session(a.addr) != nil {
		t.Fatal("an ACK was handed over or its step persisted")
	}
}
