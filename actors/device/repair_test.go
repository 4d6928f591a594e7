package device_test

import (
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
)

// A one-sided ResetSession heals by itself: after bob resets his session
// with alice, alice's next message names a session bob no longer holds.
// Bob, who has alice's identity pinned, starts a fresh authenticated
// initiation to her; alice accepts it, and the message still pending at
// alice goes out again on the new session and decrypts at bob — without
// bob's application sending anything and without a manual reset at alice.
func TestOneSidedResetHealsWithoutTheResettingSideSending(t *testing.T) {
	ms, a, b := pair(t)
	first := a.send(b, "before the reset")
	b.pump()
	b.commit(a, first.ID)
	a.pump() // the ACK: both sides hold the session

	if err := b.d.Sessions().ResetSession(bg, a.addr); err != nil {
		t.Fatal(err)
	}
	lost := a.send(b, "after the reset")
	_, err := b.recv(b.takeOne())
	if !errors.Is(err, ratchet.ErrUnknownSession) {
		t.Fatalf("first envelope after the reset: %v", err)
	}
	// Alice takes whatever bob sent back (nothing on the old code).
	var replaced bool
	for _, r := range a.pump() {
		if r.SessionReplaced && r.Resent == 1 && r.Kind == device.Acknowledgement && !r.Cleared {
			replaced = true
		}
	}
	var got bool
	for _, r := range b.pump() {
		if r.Message != nil && r.Message.ID == lost.ID && string(r.Message.Plaintext) == "after the reset" {
			got = true
		}
	}
	if !got {
		t.Fatalf("after ResetSession on bob, alice's pending message never decrypted at bob (alice saw a session replacement: %v)", replaced)
	}
	if !replaced {
		t.Fatal("alice's side did not report the replaced session and the resend")
	}
	// Both directions work on the new session.
	if r := b.commit(a, lost.ID); !r.AckSent {
		t.Fatalf("commit: %+v", r)
	}
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("ACK on the new session: %+v", acks)
	}
	back := b.send(a, "bob answers")
	if rs := a.pump(); len(rs) != 1 || rs[0].Message == nil || rs[0].Message.ID != back.ID {
		t.Fatalf("bob → alice on the new session: %+v", rs)
	}
	_ = ms
}

// Repairs are rate-limited per peer: a burst of undecryptable envelopes
// from a pinned peer starts one repair per interval, not one per envelope.
func TestSessionRepairIsRateLimited(t *testing.T) {
	ms, a, b := pair(t)
	first := a.send(b, "x")
	b.pump()
	b.commit(a, first.ID)
	a.pump()
	if err := b.d.Sessions().ResetSession(bg, a.addr); err != nil {
		t.Fatal(err)
	}
	// Alice's envelopes on the old session, never delivered to alice's
	// own actor in between (so she does not switch sessions).
	for range 5 {
		a.send(b, "old session")
	}
	for _, e := range b.take() {
		if _, err := b.recv(e); !errors.Is(err, ratchet.ErrUnknownSession) {
			t.Fatalf("receive: %v", err)
		}
	}
	if n := len(a.take()); n != 1 {
		t.Fatalf("%d repair initiations for 5 undecryptable envelopes in one interval, want 1", n)
	}
	ms.clock.Advance(time.Minute)
	a.send(b, "later")
	if _, err := b.recv(b.takeOne()); !errors.Is(err, ratchet.ErrUnknownSession) {
		t.Fatalf("receive: %v", err)
	}
	if n := len(a.take()); n != 1 {
		t.Fatalf("%d repair initiations after the interval, want 1", n)
	}
}
