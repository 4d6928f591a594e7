package session_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// viewCounter counts the read transactions run on a delivery store; while
// damaged is set, every pending inbound entry reads as a record damaged at
// rest (persistence.ErrCorrupt), in read and in read-write transactions.
type viewCounter struct {
	persistence.DeliveryStore
	views   atomic.Int64
	damaged atomic.Bool
}

func (v *viewCounter) View(ctx context.Context, fn func(persistence.DeliveryReader) error) error {
	v.views.Add(1)
	return v.DeliveryStore.View(ctx, func(r persistence.DeliveryReader) error {
		return fn(damagingReader{DeliveryReader: r, v: v})
	})
}

func (v *viewCounter) Update(ctx context.Context, fn func(persistence.DeliveryTx) error) error {
	return v.DeliveryStore.Update(ctx, func(tx persistence.DeliveryTx) error {
		return fn(damagingTx{DeliveryTx: tx, v: v})
	})
}

var errDamaged = fmt.Errorf("test: damaged pending record: %w", persistence.ErrCorrupt)

type damagingReader struct {
	persistence.DeliveryReader
	v *viewCounter
}

func (r damagingReader) PendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingInbound, bool, error) {
	p, ok, err := r.DeliveryReader.PendingInbound(sender, id)
	if ok && r.v.damaged.Load() {
		return persistence.PendingInbound{}, false, errDamaged
	}
	return p, ok, err
}

type damagingTx struct {
	persistence.DeliveryTx
	v *viewCounter
}

func (t damagingTx) PendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingInbound, bool, error) {
	p, ok, err := t.DeliveryTx.PendingInbound(sender, id)
	if ok && t.v.damaged.Load() {
		return persistence.PendingInbound{}, false, errDamaged
	}
	return p, ok, err
}

// pairWithSession returns alice and bob (both stores counting their read
// transactions) with a session established by one committed message.
func pairWithSession(t *testing.T) (ms *mesh, a, b *node, av, bv *viewCounter) {
	t.Helper()
	ms = newMesh(t)
	av = &viewCounter{DeliveryStore: memory.NewDelivery()}
	a = ms.add(aliceAddr, av, nil)
	bv = &viewCounter{DeliveryStore: memory.NewDelivery()}
	b = ms.add(bobAddr, bv, nil)
	id := newID(t)
	if _, err := a.m.SendMessage(bg, b.addr, id, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, b, ms.net.Take(b.addr), 1)
	if _, err := b.m.Finalize(bg, a.addr, id, persistence.FinalizationCommitted, 0); err != nil {
		t.Fatal(err)
	}
	receiveAll(t, a, ms.net.Take(a.addr), 1)
	return ms, a, b, av, bv
}

func send(t *testing.T, a, b *node, body string) messages.LogicalMessageID {
	t.Helper()
	id := newID(t)
	if s, err := a.m.SendMessage(bg, b.addr, id, []byte(body)); err != nil || s.HandOff != nil {
		t.Fatalf("send: %v, hand-off %v", err, s.HandOff)
	}
	return id
}

func commitWant(t *testing.T, b *node, from messages.DeviceAddress, id messages.LogicalMessageID, want inbound.Outcome) {
	t.Helper()
	f, err := b.m.Finalize(bg, from, id, persistence.FinalizationCommitted, 0)
	if err != nil || f.Outcome != want || !f.AckSent {
		t.Fatalf("commit: %v, outcome %v (want %v), AckSent %v", err, f.Outcome, want, f.AckSent)
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

// A peer actor remembers the pending entries it made durable (at most
// MaxStoredPending of them, the oldest forgotten first): committing a
// message received moments ago decides without a read transaction; an
// entry it forgot, or a finalized one, is read from the store. The
// processed entry holds the digest of the body either way.
func TestCommitOfAJustReceivedMessageReadsNoTransaction(t *testing.T) {
	ms, a, b, _, vc := pairWithSession(t)
	n := session.MaxStoredPending + 8
	ids := make([]messages.LogicalMessageID, n)
	for i := range ids {
		ids[i] = send(t, a, b, fmt.Sprint("m", i))
	}
	for i, r := range receiveAll(t, b, ms.net.Take(b.addr), n) {
		if r.Outcome != inbound.OutcomeDelivery || !r.New || r.Message == nil || r.Message.ID != ids[i] {
			t.Fatalf("receive %d: %+v", i, r)
		}
	}
	v := vc.views.Load()
	commitWant(t, b, a.addr, ids[n-1], inbound.OutcomeCommitted)
	if got := vc.views.Load() - v; got != 0 {
		t.Fatalf("the commit of a remembered entry ran %d read transactions, want 0", got)
	}
	v = vc.views.Load()
	commitWant(t, b, a.addr, ids[0], inbound.OutcomeCommitted)
	if got := vc.views.Load() - v; got != 1 {
		t.Fatalf("the commit of a forgotten entry ran %d read transactions, want 1", got)
	}
	// Finalized entries are not remembered: committing again reads the
	// processed entry.
	v = vc.views.Load()
	commitWant(t, b, a.addr, ids[n-1], inbound.OutcomeAlreadyCommitted)
	if got := vc.views.Load() - v; got != 1 {
		t.Fatalf("a second commit ran %d read transactions, want 1", got)
	}
	for _, id := range ids[1 : n-1] {
		commitWant(t, b, a.addr, id, inbound.OutcomeCommitted)
	}
	if c := pendingCount(t, b); c != 0 {
		t.Fatalf("%d still pending", c)
	}
	// The digest kept is the one of each body (remembered or read).
	if err := b.store.View(bg, func(r persistence.DeliveryReader) error {
		for _, i := range []int{0, 1, n - 1} {
			p, ok, err := r.ProcessedInbound(a.addr, ids[i])
			if err != nil || !ok || p.Digest == nil {
				return fmt.Errorf("processed %d: %+v %v %v", i, p, ok, err)
			}
			body := fmt.Sprint("m", i)
			d := inbound.DecideFinalize(inbound.State{Pending: &persistence.PendingInbound{Sender: a.addr, ID: ids[i], Frame: frameOf(t, ids[i], body)}},
				inbound.FinalizeInput{Sender: a.addr, ID: ids[i], Finalization: persistence.FinalizationCommitted})
			if d.Err != nil || *d.Effects.PutProcessed.Digest != *p.Digest {
				return fmt.Errorf("message %d: stored digest %x, want the digest of %q (%v)", i, *p.Digest, body, d.Err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func frameOf(t *testing.T, id messages.LogicalMessageID, body string) []byte {
	t.Helper()
	f, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: id, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// What a remembered entry answers is what the store holds: a copy of a
// pending message (a resend) is the same delivery — same sequence and
// receive time — with the stored delivery count, after CountDeliveries
// raised it behind the actor's back; a message whose processed entry was
// pruned is new again, as the store says.
func TestRememberedPendingEntryAnswersAsTheStore(t *testing.T) {
	ms, a, b, _, _ := pairWithSession(t)
	id := send(t, a, b, "body")
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
	commitWant(t, b, a.addr, id, inbound.OutcomeCommitted)
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

// The commit of a remembered entry runs no read transaction, but its item
// reads the entry inside its own transaction: an entry damaged at rest
// after it was received is an error (ErrCorrupt), never finalized nor
// acknowledged; once readable again it commits.
func TestCommitOfARememberedEntryDamagedAtRestIsCorrupt(t *testing.T) {
	ms, a, b, _, vc := pairWithSession(t)
	id := send(t, a, b, "secret")
	receiveAll(t, b, ms.net.Take(b.addr), 1)
	vc.damaged.Store(true)
	v := vc.views.Load()
	if _, err := b.m.Finalize(bg, a.addr, id, persistence.FinalizationCommitted, 0); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("commit of a damaged remembered entry: %v, want ErrCorrupt", err)
	}
	if got := vc.views.Load() - v; got != 0 {
		t.Fatalf("the commit ran %d read transactions: the entry was not the remembered one", got)
	}
	if acks := ms.net.Take(a.addr); len(acks) != 0 {
		t.Fatalf("%d ACKs handed over for a damaged record", len(acks))
	}
	vc.damaged.Store(false)
	if err := b.store.View(bg, func(r persistence.DeliveryReader) error {
		if _, ok, err := r.ProcessedInbound(a.addr, id); err != nil || ok {
			return fmt.Errorf("processed entry of the damaged record: %v %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c := pendingCount(t, b); c != 1 {
		t.Fatalf("%d pending after the refused commit, want 1", c)
	}
	commitWant(t, b, a.addr, id, inbound.OutcomeCommitted)
	ackWant(t, a, ms.net.Take(a.addr), true)
}

// A received ACK decides on what its own transaction's delete finds: no
// read transaction; Cleared for the pending message it names, not for a
// copy of the same ACK (nothing left to clear), nor for an ACK of an id
// alice never sent.
func TestAckDecidesOnItsOwnDeleteWithoutARead(t *testing.T) {
	ms, a, b, av, _ := pairWithSession(t)
	id := send(t, a, b, "x")
	receiveAll(t, b, ms.net.Take(b.addr), 1)
	commitWant(t, b, a.addr, id, inbound.OutcomeCommitted)
	ack := ms.net.Take(a.addr)
	v := av.views.Load()
	ackWant(t, a, ack, true)
	if got := av.views.Load() - v; got != 0 {
		t.Fatalf("the ACK ran %d read transactions, want 0", got)
	}
	// The same id committed again: bob ACKs again, nothing is cleared.
	commitWant(t, b, a.addr, id, inbound.OutcomeAlreadyCommitted)
	ackWant(t, a, ms.net.Take(a.addr), false)
	var p int
	if err := a.store.View(bg, func(r persistence.DeliveryReader) error {
		var err error
		p, err = r.PendingOutboundCount()
		return err
	}); err != nil || p != 0 {
		t.Fatalf("alice's pending sent messages: %d %v", p, err)
	}
}

// ackWant has a receive the one envelope of envs, an ACK, and checks
// whether it cleared a pending sent message.
func ackWant(t *testing.T, a *node, envs []session.Delivered, cleared bool) {
	t.Helper()
	if r := receiveAll(t, a, envs, 1)[0]; r.Outcome != inbound.OutcomeAcknowledgement || r.Cleared != cleared {
		t.Fatalf("ACK: %v, cleared %v, want cleared %v", r.Outcome, r.Cleared, cleared)
	}
}

func sendWant(t *testing.T, a, b *node, id messages.LogicalMessageID, want error) {
	t.Helper()
	_, err := a.m.SendMessage(bg, b.addr, id, []byte("m"))
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("send %s: %v, want %v", id, err, want)
	}
}

// A peer actor keeps the ids of its peer's pending outbound rows, read
// once by the first Send: a Send of a new id reads no transaction, one of
// an id already pending is refused (ErrAlreadyPending) without a read
// either, and an id cleared by its ACK or abandoned can be sent again.
func TestSendOfANewIDReadsNoTransaction(t *testing.T) {
	ms, a, b, av, _ := pairWithSession(t)
	first := send(t, a, b, "m") // builds the set: one read
	v := av.views.Load()
	ids := []messages.LogicalMessageID{first}
	for i := 0; i < 5; i++ {
		ids = append(ids, send(t, a, b, "m"))
	}
	if got := av.views.Load() - v; got != 0 {
		t.Fatalf("5 sends of new ids ran %d read transactions, want 0", got)
	}
	for _, id := range ids {
		sendWant(t, a, b, id, outbound.ErrAlreadyPending)
	}
	if got := av.views.Load() - v; got != 0 {
		t.Fatalf("refusing pending ids ran %d read transactions, want 0", got)
	}
	// ids[0] is acknowledged, ids[1] abandoned: both can be sent again.
	for _, r := range receiveAll(t, b, ms.net.Take(b.addr), len(ids)) {
		if r.Message == nil || r.Message.ID != ids[0] {
			continue
		}
		commitWant(t, b, a.addr, ids[0], inbound.OutcomeCommitted)
	}
	if r := receiveAll(t, a, ms.net.Take(a.addr), 1)[0]; !r.Cleared {
		t.Fatalf("ACK: %+v", r)
	}
	if ok, err := a.m.Abandon(bg, b.addr, ids[1]); err != nil || !ok {
		t.Fatalf("abandon: %v %v", ok, err)
	}
	v = av.views.Load()
	sendWant(t, a, b, ids[0], nil)
	sendWant(t, a, b, ids[1], nil)
	sendWant(t, a, b, ids[2], outbound.ErrAlreadyPending)
	if got := av.views.Load() - v; got != 0 {
		t.Fatalf("sends after an ACK and an abandon ran %d read transactions, want 0", got)
	}
}

// Past MaxKnownSent pending rows the actor stops keeping their ids and
// reads the store for each Send, refusing pending ids all the same; a
// device holding more pending rows than that when the first Send comes
// reads the store from the start.
func TestSendPastTheKeptIDsReadsTheStore(t *testing.T) {
	ms, a, b, av, _ := pairWithSession(t)
	ids := make([]messages.LogicalMessageID, session.MaxKnownSent+2)
	for i := range ids {
		ids[i] = send(t, a, b, "m")
	}
	v := av.views.Load()
	send(t, a, b, "m")
	if got := av.views.Load() - v; got != 1 {
		t.Fatalf("a send past the kept ids ran %d read transactions, want 1", got)
	}
	for _, id := range []messages.LogicalMessageID{ids[0], ids[len(ids)-1]} {
		sendWant(t, a, b, id, outbound.ErrAlreadyPending)
	}

	// A new actor for carol on alice's device (more than MaxKnownSent rows
	// pending for bob): every send reads.
	c := ms.add(carolAddr, nil, nil)
	id := send(t, a, c, "m")
	v = av.views.Load()
	sendWant(t, a, c, id, outbound.ErrAlreadyPending)
	send(t, a, c, "m")
	if got := av.views.Load() - v; got != 2 {
		t.Fatalf("two sends to a new peer of a device with %d pending rows ran %d read transactions, want one each", len(ids)+1, got)
	}
}
