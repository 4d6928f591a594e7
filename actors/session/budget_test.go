package session_test

import (
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
)

// TestAttackForgedInitiationsSpendOnlyTheirSendersBudget:
// mallory sends bob 200 forged initiations (a real one with its
// ciphertext flipped: each costs bob the full DH/KEM agreement before the
// AEAD fails). bob runs at most FailedDecryptBurst of them (the clock
// stands still: no refill) and refuses the rest before any cryptography;
// alice's messages, decided meanwhile, all decrypt; a success gives its
// token back, so an honest sender never runs dry.
func TestAttackForgedInitiationsSpendOnlyTheirSendersBudget(t *testing.T) {
	ms := newMesh(t)
	const burst = 8
	b := ms.add(bobAddr, nil, func(c *session.Config) { c.FailedDecryptBurst = burst })
	a := ms.add(aliceAddr, nil, nil)
	mallory := ms.add(messages.DeviceAddress{User: "mallory", Device: 1}, nil, nil)
	forged := mustEncrypt(t, mallory, b.addr, "hello")
	forged[len(forged)-1] ^= 0xff
	refused := 0
	for i := 0; i < 200; i++ {
		_, err := b.m.Decrypt(bg, mallory.addr, forged)
		switch {
		case err == nil:
			t.Fatal("a forged initiation decrypted")
		case errors.Is(err, session.ErrDecryptBudget):
			refused++
		}
		if i%10 == 0 {
			mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "alice"), "alice")
		}
	}
	c := b.m.DecryptCounters()
	if c.Failures != burst || refused != 200-burst || c.Refused != uint64(200-burst) {
		t.Fatalf("bob ran %d failing decrypts and refused %d (counters %+v); want %d run, the rest refused", c.Failures, refused, c, burst)
	}
	if c.Attempts != burst+20 || c.Initiations != burst+1 {
		t.Fatalf("counters %+v: want %d attempts (%d forged, 20 of alice's), %d initiations", c, burst+20, burst, burst+1)
	}
	// Past the flood, alice still has her whole budget.
	for i := 0; i < 2*burst; i++ {
		mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "more"), "more")
	}
}
