package device_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The lifecycle table of the commit boundary (docs/protocol.md), one test per row and
// column (tests named after the row they check), plus the ACK and commit
// rules of "Public API" and "Transactions".

func TestEndToEndSendReceiveCommitAck(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "hello")
	if got := a.sentPending(); len(got) != 1 || got[0].ID != sm.ID || got[0].Attempts != 1 {
		t.Fatalf("sender pending after Send: %+v", got)
	}
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.Delivery || r.Message == nil || string(r.Message.Plaintext) != "hello" || r.Message.Sender != a.addr || r.Message.ID != sm.ID {
		t.Fatalf("Receive = %+v", r)
	}
	if len(a.take()) != 0 {
		t.Fatal("a Delivery was ACKed before the commit")
	}
	c := b.commit(a, sm.ID)
	if c.Status != device.Committed || !c.AckSent {
		t.Fatalf("commit = %+v", c)
	}
	acks := a.pump()
	if len(acks) != 1 || acks[0].Kind != device.Acknowledgement || !acks[0].Cleared || acks[0].ID != sm.ID {
		t.Fatalf("sender got %+v, want one Acknowledgement cleared", acks)
	}
	if got := a.sentPending(); len(got) != 0 {
		t.Fatalf("sender still pending after the ACK: %+v", got)
	}
}

// Row RECEIVED (before the receive transaction commits): nothing stored;
// a copy of the same logical message is decrypted as new.
func TestLifecycleReceivedFailedReceiveStoresNothingRetryIsNew(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.addBolt(bobAddr, nil)
	sm := a.send(b, "m")
	env := b.takeOne()
	b.arm("delivery.update.before_commit")
	if _, err := b.recv(env); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("Receive with a failing transaction: %v", err)
	}
	b.disarm()
	if n := b.pendingCount(); n != 0 {
		t.Fatalf("failed receive left %d pending", n)
	}
	if s := b.session(a.addr); s != nil {
		t.Fatal("failed receive persisted the session")
	}
	a.resend(b, sm.ID)
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.Delivery || string(r.Message.Plaintext) != "m" {
		t.Fatalf("retry after failed receive = %+v", r)
	}
}

// Row PENDING, sender retry: Delivery again, the same ReceivedMessage
// (sequence, receive time), no second row, no ACK: a held receipt.
func TestLifecyclePendingRetryRedeliversSameMessageNoAck(t *testing.T) {
	ms, a, b := pair(t)
	sm := a.send(b, "body")
	env1 := b.takeOne()
	first := b.mustRecv(env1)
	ms.clock.Advance(time.Minute)
	a.resend(b, sm.ID)
	env2 := b.takeOne()
	if bytes.Equal(env1.Envelope, env2.Envelope) {
		t.Fatal("Resend replayed the old ciphertext instead of a fresh encryption")
	}
	again := b.mustRecv(env2)
	if again.Kind != device.Delivery || again.Message.Sequence != first.Message.Sequence ||
		!again.Message.ReceivedAt.Equal(first.Message.ReceivedAt) || string(again.Message.Plaintext) != "body" {
		t.Fatalf("redelivery %+v, first %+v", again.Message, first.Message)
	}
	if n := b.pendingCount(); n != 1 {
		t.Fatalf("%d pending rows, want 1", n)
	}
	if again.AckSent || !again.HeldSent {
		t.Fatalf("a retry of a pending message: AckSent %v, HeldSent %v; want a held receipt, no ACK", again.AckSent, again.HeldSent)
	}
	// The sender reads the reply as a held receipt, never as an ACK.
	if rs := a.pump(); len(rs) != 1 || rs[0].Kind != device.Held || !rs[0].Held || rs[0].Cleared {
		t.Fatalf("the sender got %+v, want one held receipt", rs)
	}
	if got := a.sentPending(); len(got) != 1 || got[0].Attempts != 2 {
		t.Fatalf("sender pending %+v, want attempts 2", got)
	}
}

// Row PENDING, same logical id with another body: LogicalMessageConflict;
// nothing changes (pending body kept, no ACK, ratchet step rolled back).
func TestLifecyclePendingConflictChangesNothing(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "original")
	b.mustRecv(b.takeOne())
	before := b.session(a.addr)
	a.sendRaw(b, sm.ID, "tampered")
	_, err := b.recv(b.takeOne())
	var ce *inbound.ConflictError
	if !errors.Is(err, inbound.ErrLogicalMessageConflict) || !errors.As(err, &ce) || ce.Finalized {
		t.Fatalf("conflicting copy: %v, want a pending LogicalMessageConflict", err)
	}
	if after := b.session(a.addr); !bytes.Equal(before, after) {
		t.Fatal("the conflicting envelope's ratchet step was persisted")
	}
	msgs := b.pendingAll()
	if len(msgs) != 1 || string(msgs[0].Plaintext) != "original" {
		t.Fatalf("pending after conflict: %+v", msgs)
	}
	if _, ok := b.processed(a, sm.ID); ok || len(a.take()) != 0 {
		t.Fatal("conflict processed or acknowledged something")
	}
	// The session still works: the sender's next message decrypts.
	a.send(b, "next")
	if r := b.mustRecv(b.takeOne()); r.Kind != device.Delivery || string(r.Message.Plaintext) != "next" {
		t.Fatalf("after conflict: %+v", r)
	}
}

// Row PROCESSED, sender retry: AlreadyCommitted, no plaintext, ACK again.
func TestLifecycleProcessedRetryAlreadyCommittedAckedAgain(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	b.mustRecv(b.takeOne())
	b.commit(a, sm.ID)
	// The ACK is lost: the sender keeps the message pending.
	a.take()
	a.resend(b, sm.ID)
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.AlreadyCommitted || r.Message != nil || !r.AckSent || r.ID != sm.ID {
		t.Fatalf("retry of a committed message = %+v", r)
	}
	acks := a.pump()
	if len(acks) != 1 || acks[0].Kind != device.Acknowledgement || !acks[0].Cleared {
		t.Fatalf("sender got %+v", acks)
	}
	if n := b.pendingCount(); n != 0 {
		t.Fatalf("%d pending after retry of a committed message", n)
	}
}

// Row PROCESSED, another body: LogicalMessageConflict, no ACK.
func TestLifecycleProcessedConflictNoAck(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	b.mustRecv(b.takeOne())
	b.commit(a, sm.ID)
	a.take()
	before := b.session(a.addr)
	a.sendRaw(b, sm.ID, "y")
	_, err := b.recv(b.takeOne())
	var ce *inbound.ConflictError
	if !errors.As(err, &ce) || !ce.Finalized {
		t.Fatalf("conflict after commit: %v", err)
	}
	if len(a.take()) != 0 {
		t.Fatal("conflict after commit was ACKed")
	}
	if after := b.session(a.addr); !bytes.Equal(before, after) {
		t.Fatal("the conflicting envelope's ratchet step was persisted")
	}
}

// Row PROCESSED, legacy entry without digest: a copy counts as committed
// and is ACKed whatever its body. The entry is written the only way a
// legacy entry can be, through the migration importer that writes the
// legacy marker (persistence.LegacyImporter).
func TestLifecycleProcessedLegacyWithoutDigestAcksAnyBody(t *testing.T) {
	_, a, b := pair(t)
	a.send(b, "warm-up")
	b.mustRecv(b.takeOne())
	var id messages.LogicalMessageID
	id[0] = 0x42
	if err := b.store.(persistence.LegacyImporter).ImportLegacyProcessed(bg, []persistence.LegacyProcessed{{Sender: a.addr, ID: id, FinalizedAt: 1}}); err != nil {
		t.Fatal(err)
	}
	a.sendRaw(b, id, "any body at all")
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.AlreadyCommitted || !r.AckSent {
		t.Fatalf("copy of a legacy entry = %+v", r)
	}
}

// Row pruned (after retention): nothing stored; a copy is decrypted as new.
func TestLifecyclePrunedRetryDecryptsAsNew(t *testing.T) {
	ms, a, b := pair(t)
	sm := a.send(b, "old")
	b.mustRecv(b.takeOne())
	b.commit(a, sm.ID)
	a.take()
	ms.clock.Advance(time.Hour)
	n, err := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: time.Hour})
	if err != nil || n != 1 {
		t.Fatalf("prune = %d, %v", n, err)
	}
	a.resend(b, sm.ID)
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.Delivery || string(r.Message.Plaintext) != "old" {
		t.Fatalf("retry after prune = %+v", r)
	}
}

// Discard counterpart of the PROCESSED row: AlreadyDiscarded and ACK; the
// reason is stored locally and never sent.
func TestLifecycleDiscardedRetryAlreadyDiscardedReasonKept(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "junk")
	b.mustRecv(b.takeOne())
	c, err := b.d.DiscardReceivedMessage(bg, a.addr, sm.ID, persistence.DiscardMalformed)
	if err != nil || c.Status != device.Discarded || !c.AckSent {
		t.Fatalf("discard = %+v, %v", c, err)
	}
	acks := a.pump()
	if len(acks) != 1 || acks[0].Kind != device.Acknowledgement || !acks[0].Cleared {
		t.Fatalf("sender got %+v (a discard ACKs like a commit)", acks)
	}
	p, ok := b.processed(a, sm.ID)
	if !ok || p.Finalization != persistence.FinalizationDiscarded || p.Reason != persistence.DiscardMalformed || p.Digest == nil {
		t.Fatalf("processed entry = %+v", p)
	}
	// The sender re-sends a copy anyway (it raced the ACK).
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("junk")); err != nil {
		t.Fatal(err)
	}
	r := b.mustRecv(b.takeOne())
	if r.Kind != device.AlreadyDiscarded || !r.AckSent {
		t.Fatalf("retry of a discarded message = %+v", r)
	}
	if c = b.commit(a, sm.ID); c.Status != device.AlreadyDiscarded {
		t.Fatalf("commit of a discarded message = %+v", c)
	}
	c, err = b.d.DiscardReceivedMessage(bg, a.addr, sm.ID, persistence.DiscardOther)
	if err != nil || c.Status != device.AlreadyDiscarded {
		t.Fatalf("second discard = %+v %v", c, err)
	}
	if _, err := b.d.DiscardReceivedMessage(bg, a.addr, sm.ID, 0); !errors.Is(err, inbound.ErrInvalidDiscardReason) {
		t.Fatalf("discard reason 0: %v", err)
	}
}

func TestCommitOfUnknownIDIsNotPendingAndChangesNothing(t *testing.T) {
	_, a, b := pair(t)
	var id messages.LogicalMessageID
	id[3] = 9
	_, err := b.d.CommitReceivedMessage(bg, a.addr, id)
	var np *inbound.NotPendingError
	if !errors.Is(err, inbound.ErrReceivedMessageNotPending) || !errors.As(err, &np) || np.ID != id {
		t.Fatalf("commit of an unknown id: %v", err)
	}
	if _, ok := b.processed(a, id); ok {
		t.Fatal("commit of an unknown id wrote a processed entry")
	}
	if len(a.take()) != 0 {
		t.Fatal("commit of an unknown id sent an ACK")
	}
}

func TestCommitTwiceIsIdempotentAndAcksAgain(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	r := b.mustRecv(b.takeOne())
	c1, err := b.d.CommitMessage(bg, *r.Message)
	if err != nil || c1.Status != device.Committed {
		t.Fatalf("first commit = %+v %v", c1, err)
	}
	c2 := b.commit(a, sm.ID)
	if c2.Status != device.AlreadyCommitted || !c2.AckSent {
		t.Fatalf("second commit = %+v", c2)
	}
	acks := a.pump()
	if len(acks) != 2 || !acks[0].Cleared || acks[1].Cleared || acks[1].Kind != device.Acknowledgement {
		t.Fatalf("sender got %+v, want a clearing ACK then a no-op ACK", acks)
	}
}

// An ACK failure never undoes the commit: ackSent=false, the processed
// entry stays, the pending entry stays removed.
func TestCommitAckFailureKeepsCommit(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	b.mustRecv(b.takeOne())
	b.tr.fail.Store(true)
	c := b.commit(a, sm.ID)
	b.tr.fail.Store(false)
	if c.Status != device.Committed || c.AckSent {
		t.Fatalf("commit with the transport down = %+v, want COMMITTED, ackSent=false", c)
	}
	if _, ok := b.processed(a, sm.ID); !ok || b.pendingCount() != 0 {
		t.Fatal("an ACK failure undid the commit")
	}
	// The sender's retry is answered with AlreadyCommitted and a new ACK.
	a.resend(b, sm.ID)
	if r := b.mustRecv(b.takeOne()); r.Kind != device.AlreadyCommitted || !r.AckSent {
		t.Fatalf("retry = %+v", r)
	}
}

func TestAbandonStopsWaitingForAck(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	ok, err := a.d.Abandon(bg, b.addr, sm.ID)
	if err != nil || !ok {
		t.Fatalf("Abandon = %v %v", ok, err)
	}
	if err := a.d.Resend(bg, b.addr, sm.ID); !errors.Is(err, outbound.ErrNotPending) {
		t.Fatalf("Resend of an abandoned message: %v", err)
	}
	b.mustRecv(b.takeOne())
	b.commit(a, sm.ID)
	if acks := a.pump(); len(acks) != 1 || acks[0].Cleared {
		t.Fatalf("late ACK of an abandoned message = %+v", acks)
	}
}

func TestSendWithDuplicateIDIsRefused(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("x")); !errors.Is(err, outbound.ErrAlreadyPending) {
		t.Fatalf("second SendWithID: %v", err)
	}
}

// Send stores the message before the hand-off: a transport failure leaves
// it pending (ErrNotHandedOff) and Resend delivers it.
func TestSendStoresBeforeHandoff(t *testing.T) {
	_, a, b := pair(t)
	a.tr.fail.Store(true)
	sm, err := a.d.Send(bg, b.addr, []byte("x"))
	a.tr.fail.Store(false)
	if !errors.Is(err, device.ErrNotHandedOff) || sm.Sequence == 0 {
		t.Fatalf("Send with the transport down = %+v, %v", sm, err)
	}
	if got := a.sentPending(); len(got) != 1 {
		t.Fatalf("pending after failed hand-off: %+v", got)
	}
	a.resend(b, sm.ID)
	if r := b.mustRecv(b.takeOne()); r.Kind != device.Delivery {
		t.Fatalf("resend = %+v", r)
	}
}

// A malformed frame rolls its ratchet step back.
func TestMalformedFrameRollsBackRatchetStep(t *testing.T) {
	_, a, b := pair(t)
	a.send(b, "x")
	b.mustRecv(b.takeOne())
	before := b.session(a.addr)
	if _, err := a.d.Sessions().Send(bg, b.addr, []byte{0x01, 0x02}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.recv(b.takeOne()); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("malformed frame: %v", err)
	}
	if !bytes.Equal(before, b.session(a.addr)) {
		t.Fatal("malformed frame persisted its ratchet step")
	}
}

// A replayed envelope is rejected by the ratchet (used message key),
// whatever the commit state.
func TestReplayedEnvelopeIsRejectedByRatchet(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "x")
	env := b.takeOne()
	b.mustRecv(env)
	b.commit(a, sm.ID)
	if _, err := b.recv(env); err == nil || !errors.Is(err, ratchet.ErrReplay) {
		t.Fatalf("replayed envelope: %v, want ratchet.ErrReplay", err)
	}
}
