package device_test

import (
	"errors"
	"os"
	"testing"

	"github.com/syncmesh/syncmesh/actors/session"
)

// The sender's memory of an abandoned id survives a restart: after
// Abandon and a restart, a SendWithID of the id with another body is
// ErrLogicalIDReused and stores nothing, so the receiver's late ACK of
// the first body clears nothing; the first body may go out again.
func TestAbandonedIDReuseRefusedAfterRestart(t *testing.T) {
	ms := newMesh(t)
	a, b := ms.addBolt(aliceAddr, nil), ms.addBolt(bobAddr, nil)
	sm := a.send(b, "first body")
	if r := b.mustRecv(b.takeOne()); r.Message == nil {
		t.Fatalf("receive: %+v", r)
	}
	if ok, err := a.d.Abandon(bg, b.addr, sm.ID); err != nil || !ok {
		t.Fatalf("Abandon = %v %v", ok, err)
	}
	a.restart()
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("second body")); !errors.Is(err, session.ErrLogicalIDReused) {
		t.Fatalf("SendWithID of an abandoned id with another body after a restart: %v, want ErrLogicalIDReused", err)
	}
	if n := len(a.sentPending()); n != 0 {
		t.Fatalf("a refused Send left %d pending", n)
	}
	if r := b.commit(a, sm.ID); !r.AckSent {
		t.Fatalf("commit: %+v", r)
	}
	if acks := a.pump(); len(acks) != 1 || acks[0].Cleared || acks[0].UnknownAck {
		t.Fatalf("the ACK of the abandoned body at the sender: %+v, want one result clearing nothing, not unknown", acks)
	}
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("first body")); err != nil {
		t.Fatalf("re-send of the abandoned body: %v", err)
	}
	a.send(b, "second body")
}

// An id the receiver's ACK finalized is not reused for another body
// either, after a restart: a copy of that ACK (the receiver ACKs every
// retry of a finalized message again) would clear the new body.
func TestAcknowledgedIDReuseRefusedAfterRestart(t *testing.T) {
	ms := newMesh(t)
	a, b := ms.addBolt(aliceAddr, nil), ms.addBolt(bobAddr, nil)
	sm := a.send(b, "first body")
	b.mustRecv(b.takeOne())
	b.commit(a, sm.ID)
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("ACK: %+v", acks)
	}
	a.restart()
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("second body")); !errors.Is(err, session.ErrLogicalIDReused) {
		t.Fatalf("SendWithID of an acknowledged id with another body after a restart: %v, want ErrLogicalIDReused", err)
	}
	if n := len(a.sentPending()); n != 0 {
		t.Fatalf("a refused Send left %d pending", n)
	}
	// The same body again is a retry the receiver answers with an ACK.
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("first body")); err != nil {
		t.Fatalf("re-send of the acknowledged body: %v", err)
	}
}

// A sender whose store is rolled back to a copy taken before it sent a
// message learns of that message when the receiver's ACK of it arrives:
// the ACK names an id the store neither holds pending nor retired, and
// the result says so (UnknownAck), while an ACK of a message the copy
// holds clears it as usual.
func TestAckOfMessageLostByRollbackIsReported(t *testing.T) {
	ms := newMesh(t)
	a, b := ms.addBolt(aliceAddr, nil), ms.addBolt(bobAddr, nil)
	kept := a.send(b, "in the copy")
	backup := a.copyStore()
	lost := a.send(b, "after the copy")
	for _, e := range b.take() {
		b.mustRecv(e)
	}
	b.commit(a, kept.ID)
	b.commit(a, lost.ID)
	a.restoreStore(backup)
	acks := a.pump()
	if len(acks) != 2 {
		t.Fatalf("%d results at the sender, want 2", len(acks))
	}
	for _, r := range acks {
		switch r.ID {
		case kept.ID:
			if !r.Cleared || r.UnknownAck {
				t.Fatalf("ACK of the message the copy holds: %+v", r)
			}
		case lost.ID:
			if r.Cleared || !r.UnknownAck {
				t.Fatalf("ACK of the message the rolled-back store lost: %+v, want UnknownAck", r)
			}
		default:
			t.Fatalf("ACK of %s", r.ID)
		}
	}
	// The id is known now: a copy of the same ACK is not reported again,
	// and the id is not reused for any body (its body is not known).
	if _, err := b.d.CommitReceivedMessage(bg, a.addr, lost.ID); err != nil {
		t.Fatal(err)
	}
	if again := a.pump(); len(again) != 1 || again[0].UnknownAck || again[0].Cleared {
		t.Fatalf("a copy of the ACK of the lost message: %+v, want known", again)
	}
	if _, err := a.d.SendWithID(bg, b.addr, lost.ID, []byte("after the copy")); !errors.Is(err, session.ErrLogicalIDReused) {
		t.Fatalf("SendWithID of the lost id: %v, want ErrLogicalIDReused", err)
	}
}

// copyStore closes v's bolt file, copies it and opens v again; it returns
// the copy's bytes (a backup taken at this moment).
func (v *dev) copyStore() []byte {
	v.ms.tb.Helper()
	_ = v.d.Close()
	_ = v.db.Close()
	raw, err := os.ReadFile(v.path)
	if err != nil {
		v.ms.tb.Fatal(err)
	}
	v.openDB()
	v.start()
	return raw
}

// restoreStore replaces v's bolt file with a copy and opens v again.
func (v *dev) restoreStore(raw []byte) {
	v.ms.tb.Helper()
	_ = v.d.Close()
	_ = v.db.Close()
	if err := os.WriteFile(v.path, raw, 0o600); err != nil {
		v.ms.tb.Fatal(err)
	}
	v.openDB()
	v.start()
}
