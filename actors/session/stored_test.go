package session_test

import (
	"sync/atomic"
	"testing"
	"time"

	"context"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// viewCounter counts the read transactions run on a delivery store.
type viewCounter struct {
	persistence.DeliveryStore
	views atomic.Int64
}

func (v *viewCounter) View(ctx context.Context, fn func(persistence.DeliveryReader) error) error {
	v.views.Add(1)
	return v.DeliveryStore.View(ctx, fn)
}

// pairWithSession returns alice and bob (bob's store counting its read
// transactions) with a session established by one committed message.
func pairWithSession(t *testing.T) (*mesh, *node, *node, *viewCounter) {
	t.Helper()
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	vc := &viewCounter{DeliveryStore: memory.NewDelivery()}
	b := ms.add(bobAddr, vc, nil)
	id := newID(t)
	if _, err := a.m.SendMessage(bg, b.addr, id, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, b, ms.net.Take(b.addr), 1)
	if _, err := b.m.Finalize(bg, a.addr, id, persistence.FinalizationCommitted, 0); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, a, ms.net.Take(a.addr), 1)
	return ms, a, b, vc
}

func send(t *testing.T, ms *mesh, a, b *node, body string) messages.LogicalMessageID {
	t.Helper()
	id := newID(t)
	if s, err := a.m.SendMessage(bg, b.addr, id, []byte(body)); err != nil || s.HandOff != nil {
		t.Fatalf("send: %v, hand-off %v", err, s.HandOff)
	}
	return id
}

func commit(t *testing.T, b *node, from messages.DeviceAddress, id messages.LogicalMessageID, want inbound.Outcome) {
	t.Helper()
	f, err := b.m.Finalize(bg, from, id, persistence.FinalizationCommitted, 0)
	if err != nil || f.Outcome != want || !f.AckSent {
		t.Fatalf("commit: %v, outcome %v (want %v), AckSent %v", err, f.Outcome, want, f.AckSent)
	}
}

// A peer actor remembers the pending entries it made durable (at most
// MaxStoredPending of them, the oldest forgotten first): committing a
// message received moments ago decides without a read transaction; an
// entry it forgot, or a finalized one, is read from the store.
func TestCommitOfAJustReceivedMessageReadsNoTransaction(t *testing.T) {
	ms, a, b, vc := pairWithSession(t)
	n := session.MaxStoredPending + 8
	ids := make([]messages.LogicalMessageID, n)
	for i := range ids {
		ids[i] = send(t, ms, a, b, "m")
	}
	for i, r := range receiveAll(t, b, ms.net.Take(b.addr), n) {
		if r.Outcome != inbound.OutcomeDelivery || !r.New || r.Message == nil || r.Message.ID != ids[i] {
			t.Fatalf("receive %d: %+v", i, r)
		}
	}
	v := vc.views.Load()
	commit(t, b, a.addr, ids[n-1], inbound.OutcomeCommitted)
	if got := vc.views.Load() - v; got != 0 {
		t.Fatalf("the commit of a remembered entry ran %d read transactions, want 0", got)
	}
	v = vc.views.Load()
	commit(t, b, a.addr, ids[0], inbound.OutcomeCommitted)
	if got := vc.views.Load() - v; got != 1 {
		t.Fatalf("the commit of a forgotten entry ran %d read transactions, want 1", got)
	}
	// Finalized entries are not remembered: committing again reads the
	// processed entry.
	v = vc.views.Load()
	commit(t, b, a.addr, ids[n-1], inbound.OutcomeAlreadyCommitted)
	if got := vc.views.Load() - v; got != 1 {
		t.Fatalf("a second commit ran %d read transactions, want 1", got)
	}
	for _, id := range ids[1 : n-1] {
		commit(t, b, a.addr, id, inbound.OutcomeCommitted)
	}
	if c := pendingCount(t, b); c != 0 {
		t.Fatalf("%d still pending", c)
	}
}

func pendingCount(t *testing.T, n *node) int {
	t.Helper()
	var c int
	if err := n.store.View(bg, func(r persistence.DeliveryReader) error {
		var err error
		c, err = r.PendingInboundCount(nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// What a remembered entry answers is what the store holds: a copy of a
// pending message (a resend) is the same delivery — same sequence and
// receive time — with the stored delivery count, after CountDeliveries
// raised it behind the actor's back; a message whose processed entry was
// pruned is new again, as the store says.
func TestRememberedPendingEntryAnswersAsTheStore(t *testing.T) {
	ms, a, b, _ := pairWithSession(t)
	id := send(t, ms, a, b, "body")
	first := receiveAll(t, b, ms.net.Take(b.addr), 1)[0]
	if first.Message == nil || first.Message.Deliveries != 1 {
		t.Fatalf("first delivery: %+v", first.Message)
	}
	counted, err := b.m.CountDeliveries(bg, []inbound.ReceivedMessage{*first.Message})
	if err != nil || len(counted) != 1 || counted[0].Deliveries != 2 {
		t.Fatalf("CountDeliveries: %+v %v", counted, err)
	}
	ms.clock.Advance(time.Second)
	if s, err := a.m.Resend(bg, b.addr, id); err != nil || s.HandOff != nil {
		t.Fatalf("resend: %v %v", err, s.HandOff)
	}
	again := receiveAll(t, b, ms.net.Take(b.addr), 1)[0]
	m := again.Message
	if again.Outcome != inbound.OutcomeDelivery || again.New || m == nil || m.Sequence != first.Message.Sequence ||
		!m.ReceivedAt.Equal(first.Message.ReceivedAt) || m.Deliveries != 3 || string(m.Plaintext) != "body" {
		t.Fatalf("redelivery: %+v (first %+v)", again, first.Message)
	}
	// Committed; the ACK is not delivered, so alice's message stays pending.
	commit(t, b, a.addr, id, inbound.OutcomeCommitted)
	ms.net.Take(a.addr)
	ms.clock.Advance(time.Hour)
	if n, err := b.m.Prune(bg, inbound.RetentionPolicy{MaxAge: time.Minute}); err != nil || n < 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if _, err := a.m.Resend(bg, b.addr, id); err != nil {
		t.Fatal(err)
	}
	if r := receiveAll(t, b, ms.net.Take(b.addr), 1)[0]; r.Outcome != inbound.OutcomeDelivery || !r.New {
		t.Fatalf("after the prune: %v, new %v (want a new delivery, as the store says)", r.Outcome, r.New)
	}
}
