package device_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// The receiver crash-window table of docs/protocol.md (commit boundary, "Crash
// windows"), one test per row. The receiver runs on a bbolt file; a crash
// is a failpoint at the named point (the transaction aborts there, or it
// committed and the process "dies" before anything else happens),
// followed by closing everything and reopening the file. Each test then
// asserts the state and the next step the table names.

// Row 1: before the receive transaction commits → nothing persisted; the
// sender's retry (or the same envelope, if the application kept it)
// decrypts again.
func TestCrashBeforeReceiveCommitNothingPersisted(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	a.send(b, "m1")
	env := b.takeOne()
	b.arm(bolt.FailpointDeliveryUpdateBeforeCommit)
	if _, err := b.recv(env); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("Receive with the crash before commit: %v", err)
	}
	b.restart()
	if n := b.pendingCount(); n != 0 {
		t.Fatalf("%d pending after a crash before the receive commit", n)
	}
	r := b.mustRecv(env) // the same envelope, kept by the application
	if r.Kind != device.Delivery || string(r.Message.Plaintext) != "m1" {
		t.Fatalf("same envelope after restart = %+v", r)
	}
}

// Row 2: after the receive commit, before Delivery reached the
// application → pending; pendingReceivedMessages after restart, and every
// sender retry, deliver it again.
func TestCrashAfterReceiveCommitBeforeDeliveryRedelivered(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	var mu sync.Mutex
	var handled []device.ReceivedMessage
	b := ms.addBolt(bobAddr, func(c *device.Config) {
		c.Handler = func(_ context.Context, m device.ReceivedMessage) {
			mu.Lock()
			handled = append(handled, m)
			mu.Unlock()
		}
	})
	sm := a.send(b, "m2")
	b.arm(bolt.FailpointDeliveryUpdateAfterCommit)
	if _, err := b.recv(b.takeOne()); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("Receive with the crash after commit: %v", err)
	}
	mu.Lock()
	if len(handled) != 0 {
		t.Fatal("the application got the Delivery although the process crashed first")
	}
	mu.Unlock()
	b.restart()
	msgs := b.pendingAll()
	if len(msgs) != 1 || msgs[0].ID != sm.ID || string(msgs[0].Plaintext) != "m2" {
		t.Fatalf("pending after restart: %+v", msgs)
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 1 && handled[0].ID == sm.ID && handled[0].Sequence == msgs[0].Sequence
	}, "the handler to get the pending message on Open")
	a.resend(b, sm.ID)
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.Delivery || r.Message.Sequence != msgs[0].Sequence {
		t.Fatalf("sender retry after restart = %+v", r)
	}
}

// Row 3: after Delivery, before the application's own commit → pending;
// delivered again; the application applies it for the first time.
func TestCrashAfterDeliveryBeforeAppCommitRedelivered(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	sm := a.send(b, "m3")
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.Delivery {
		t.Fatal(r)
	}
	b.restart() // the application crashed before applying it
	msgs := b.pendingAll()
	if len(msgs) != 1 || msgs[0].ID != sm.ID || msgs[0].Sequence != r.Message.Sequence || !msgs[0].ReceivedAt.Equal(r.Message.ReceivedAt) {
		t.Fatalf("pending after restart: %+v", msgs)
	}
	// The application's own store never saw it (it crashed before its
	// transaction): the redelivery is its first application.
	applied := map[messages.LogicalMessageID]int{}
	for _, m := range msgs {
		applied[m.ID]++
	}
	if applied[sm.ID] != 1 {
		t.Fatalf("applied %v", applied)
	}
	if c := b.commit(a, sm.ID); c.Status != device.Committed {
		t.Fatalf("commit = %+v", c)
	}
	if b.pendingCount() != 0 || len(b.pendingAll()) != 0 {
		t.Fatal("still pending after the commit")
	}
}

// Row 4: after the application's commit, before commitReceivedMessage →
// pending; delivered again; the application must recognize (sender, id).
func TestCrashAfterAppCommitBeforeLibraryCommitRedelivered(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	sm := a.send(b, "m4")
	r := b.mustRecv(b.takeOne())
	type key struct {
		from messages.DeviceAddress
		id   messages.LogicalMessageID
	}
	appDB := map[key]int{} // the application's own durable state
	appDB[key{r.Message.Sender, r.Message.ID}]++
	b.restart() // crash between the application's commit and the library's
	msgs := b.pendingAll()
	if len(msgs) != 1 || msgs[0].ID != sm.ID {
		t.Fatalf("pending after restart: %+v", msgs)
	}
	k := key{msgs[0].Sender, msgs[0].ID}
	if appDB[k] != 1 {
		t.Fatal("the redelivered message is not recognizable by (sender, id)")
	}
	// Recognized as applied: not applied again, just committed.
	if c := b.commit(a, sm.ID); c.Status != device.Committed || !c.AckSent {
		t.Fatalf("commit = %+v", c)
	}
	if appDB[k] != 1 {
		t.Fatal("applied twice")
	}
}

// Row 5: after the library commit, before the ACK was handed off (or the
// ACK is lost) → processed; no redelivery; the sender keeps the message
// pending, its retry is answered with AlreadyCommitted and a new ACK.
func TestCrashAfterLibraryCommitBeforeAckNoRedelivery(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	sm := a.send(b, "m5")
	b.mustRecv(b.takeOne())
	b.arm(bolt.FailpointDeliveryUpdateAfterCommit)
	if _, err := b.d.CommitReceivedMessage(bg, a.addr, sm.ID); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("commit with the crash after its transaction: %v", err)
	}
	b.restart()
	if len(a.take()) != 0 {
		t.Fatal("an ACK was handed off although the process crashed before")
	}
	if n := b.pendingCount(); n != 0 {
		t.Fatalf("%d pending after a crash after the library commit: redelivery", n)
	}
	if p, ok := b.processed(a, sm.ID); !ok || p.Finalization != persistence.FinalizationCommitted {
		t.Fatalf("processed entry after restart: %+v %v", p, ok)
	}
	if got := a.sentPending(); len(got) != 1 {
		t.Fatalf("sender pending: %+v", got)
	}
	a.resend(b, sm.ID)
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.AlreadyCommitted || !r.AckSent {
		t.Fatalf("retry after restart = %+v", r)
	}
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("sender got %+v", acks)
	}
}

// Atomicity: a failure injected inside the commit transaction leaves the
// message pending and unprocessed (also after reopening the file).
func TestCommitFailureInsideTransactionKeepsMessagePending(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	sm := a.send(b, "atomic")
	b.mustRecv(b.takeOne())
	b.arm(bolt.FailpointDeliveryUpdateBeforeCommit)
	if _, err := b.d.CommitReceivedMessage(bg, a.addr, sm.ID); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("commit with a failing transaction: %v", err)
	}
	b.disarm()
	check := func(when string) {
		t.Helper()
		if msgs := b.pendingAll(); len(msgs) != 1 || msgs[0].ID != sm.ID {
			t.Fatalf("%s: pending = %+v", when, msgs)
		}
		if _, ok := b.processed(a, sm.ID); ok {
			t.Fatalf("%s: the failed commit left a processed entry", when)
		}
	}
	check("before restart")
	if len(a.take()) != 0 {
		t.Fatal("a failed commit sent an ACK")
	}
	b.restart()
	check("after restart")
	if c := b.commit(a, sm.ID); c.Status != device.Committed {
		t.Fatalf("commit after restart = %+v", c)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Sender side: a message stored as pending survives a restart of the
// sender (it was stored before the hand-off) and is resent from there.
func TestSenderPendingSurvivesRestart(t *testing.T) {
	ms := newMesh(t)
	a := ms.addBolt(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	a.tr.fail.Store(true)
	sm, err := a.d.Send(bg, b.addr, []byte("durable"))
	if !errors.Is(err, device.ErrNotHandedOff) {
		t.Fatalf("Send with the transport down: %v", err)
	}
	a.restart()
	got := a.sentPending()
	if len(got) != 1 || got[0].ID != sm.ID || string(got[0].Body) != "durable" {
		t.Fatalf("sender pending after restart: %+v", got)
	}
	a.resend(b, sm.ID)
	if r := b.mustRecv(b.takeOne()); r.Kind != device.Delivery || string(r.Message.Plaintext) != "durable" {
		t.Fatalf("resent after restart = %+v", r)
	}
	b.commit(a, sm.ID)
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("ACK after restart = %+v", acks)
	}
}
