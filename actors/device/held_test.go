package device_test

import (
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
)

// sendFrame encrypts an arbitrary SecurePayload frame from v to to.
func (v *dev) sendFrame(to *dev, frame []byte) {
	v.ms.tb.Helper()
	if _, err := v.d.Sessions().Send(bg, to.addr, frame); err != nil {
		v.ms.tb.Fatalf("raw send: %v", err)
	}
}

func heldFrame(t *testing.T, id messages.LogicalMessageID, d [32]byte) []byte {
	t.Helper()
	f, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadHeld, ID: id, Digest: d})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestHeldReceiptIsNeverAnAck: whatever a held receipt names — the
// pending body, another body, an id not pending — the sent message stays
// pending; only a receipt naming the pending body holds it.
func TestHeldReceiptIsNeverAnAck(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "body")
	b.mustRecv(b.takeOne())
	for _, c := range []struct {
		name string
		id   messages.LogicalMessageID
		body string
		held bool
	}{
		{"the pending body", sm.ID, "body", true},
		{"another body", sm.ID, "other", false},
		{"an id not pending", messages.LogicalMessageID{0xee}, "body", false},
	} {
		b.sendFrame(a, heldFrame(t, c.id, digest.ApplicationMessage([]byte(c.body))))
		r := a.mustRecv(a.takeOne())
		if r.Kind != device.Held || r.Held != c.held || r.Cleared || r.ID != c.id {
			t.Fatalf("%s: %+v, want Kind HELD, Held %v", c.name, r, c.held)
		}
		if got := a.sentPending(); len(got) != 1 || got[0].ID != sm.ID {
			t.Fatalf("%s: sender pending %+v, want the message still pending", c.name, got)
		}
	}
}

// TestHeldReceiptsOffSendsNone: with Session NoHeldReceipts (a rolling
// upgrade) a copy of a pending message is delivered and answered with
// nothing, as before.
func TestHeldReceiptsOffSendsNone(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) {
		c.Session = func(sc *session.Config) { sc.NoHeldReceipts = true }
	})
	sm := a.send(b, "body")
	b.mustRecv(b.takeOne())
	a.resend(b, sm.ID)
	if r := b.mustRecv(b.takeOne()); r.Kind != device.Delivery || r.HeldSent || r.AckSent {
		t.Fatalf("copy = %+v, want a Delivery and no reply", r)
	}
	if n := len(a.take()); n != 0 {
		t.Fatalf("%d envelopes to the sender, want none", n)
	}
}

// TestUnknownFrameTypeChangesNothing is what a build that does not know a
// frame type does with it (a v0.1.0 peer and a held receipt): the frame
// is refused as malformed, the ratchet step rolls back, nothing is
// stored, and the sender's next message still decrypts.
func TestUnknownFrameTypeChangesNothing(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "first")
	b.mustRecv(b.takeOne())
	before := a.session(b.addr)
	var id messages.LogicalMessageID
	unknown := append([]byte{0x83, 0x01, 0x04, 0xa1, 0x62, 'i', 'd', 0x50}, id[:]...)
	b.sendFrame(a, unknown)
	if _, err := a.recv(a.takeOne()); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("unknown frame type: %v, want ErrMalformed", err)
	}
	if after := a.session(b.addr); string(after) != string(before) {
		t.Fatal("the refused frame's ratchet step was stored")
	}
	if got := a.sentPending(); len(got) != 1 || got[0].ID != sm.ID {
		t.Fatalf("sender pending %+v", got)
	}
	if c := b.commit(a, sm.ID); c.Status != device.Committed || !c.AckSent {
		t.Fatalf("commit = %+v", c)
	}
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("the ACK after the refused frame: %+v", acks)
	}
}
