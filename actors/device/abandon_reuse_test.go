package device_test

import (
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/session"
)

// An ACK never clears a body the receiver did not finalize: the sender
// abandons a message the receiver already holds, sends the same logical
// id with another body (which the receiver would refuse as a conflict),
// and the receiver then commits the first body and ACKs the id. The ACK
// names only the id, so it must not find the second body pending under
// it: the sender refuses the reuse (ErrLogicalIDReused) and stores
// nothing.
func TestAckOfAbandonedBodyNeverClearsAnother(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "first body")
	if r := b.mustRecv(b.takeOne()); r.Message == nil {
		t.Fatalf("receive: %+v", r)
	}
	if ok, err := a.d.Abandon(bg, b.addr, sm.ID); err != nil || !ok {
		t.Fatalf("Abandon = %v %v", ok, err)
	}
	_, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("second body"))
	stored := err == nil
	if err != nil && !errors.Is(err, session.ErrLogicalIDReused) {
		t.Fatalf("SendWithID of an abandoned id with another body: %v", err)
	}
	if stored {
		// The receiver refuses the second body as a conflict.
		if _, err := b.recv(b.takeOne()); !errors.Is(err, inbound.ErrLogicalMessageConflict) {
			t.Fatalf("receiver took the second body: %v", err)
		}
	} else if n := len(a.sentPending()); n != 0 {
		t.Fatalf("a refused Send left %d pending", n)
	}
	if r := b.commit(a, sm.ID); !r.AckSent {
		t.Fatalf("commit: %+v", r)
	}
	acks := a.pump()
	if len(acks) != 1 {
		t.Fatalf("%d results at the sender", len(acks))
	}
	if acks[0].Cleared {
		t.Fatalf("the receiver's ACK of the first body cleared the second body at the sender (id %s)", sm.ID)
	}
	// The same body may go out again under the id (its ACK is the right
	// one), and another body under a new id.
	if _, err := a.d.SendWithID(bg, b.addr, sm.ID, []byte("first body")); err != nil {
		t.Fatalf("re-send of the abandoned body: %v", err)
	}
	a.send(b, "second body")
}
