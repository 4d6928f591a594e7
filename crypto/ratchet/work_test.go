package ratchet

import (
	"testing"
)

// TestDecryptCountsItsWork: Decrypt adds the operations it performs to
// Config.Work — exactly, on the common paths — and a forged initiation
// (ciphertext flipped: the whole agreement runs before the AEAD fails)
// stays within MaxInitiationWork.
func TestDecryptCountsItsWork(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	a.initiate(t, cfg, b)
	first := a.send(t, cfg, b, []byte("hello"))

	// A forged copy: the same initiation, the ciphertext's last byte flipped.
	forged := append([]byte(nil), first...)
	forged[len(forged)-1] ^= 0xff
	var w Work
	c := cfg
	c.Work = &w
	if _, err := c.Decrypt(b.recs["alice"], b.id, b.prekeys, forged, routeOf(a, b), t0); err == nil {
		t.Fatal("forged initiation accepted")
	}
	// Signature, four DH + the one-time key object, one KEM, PQXDH's
	// HKDF; the ratchet step (one DH, KDF_RK), the message's chain step
	// and its HKDF (N = 0: no skipped steps). The signed prekey's key
	// object was built when the store was made.
	if want := (Work{DH: 4 + 1 + 1, KEM: 1, KDF: 1 + 1 + 1 + 1, Verify: 1}); w != want {
		t.Fatalf("forged initiation: work %+v, want %+v", w, want)
	}
	if max := cfg.MaxInitiationWork(); w.DH > max.DH || w.KEM > max.KEM || w.KDF > max.KDF || w.Verify > max.Verify {
		t.Fatalf("forged initiation: work %+v beyond MaxInitiationWork %+v", w, max)
	}

	// The genuine one costs the same, then one message on the chain: its
	// step and HKDF, a gap of 3 skipped steps on top.
	w = Work{}
	res, err := c.Decrypt(b.recs["alice"], b.id, b.prekeys, first, routeOf(a, b), t0)
	if err != nil {
		t.Fatal(err)
	}
	b.recs["alice"], b.prekeys = res.Record, res.Prekeys
	if want := (Work{DH: 6, KEM: 1, KDF: 4, Verify: 1}); w != want {
		t.Fatalf("initiation: work %+v, want %+v", w, want)
	}
	for range 3 {
		a.send(t, cfg, b, []byte("lost"))
	}
	w = Work{}
	if _, err := c.Decrypt(b.recs["alice"], b.id, b.prekeys, a.send(t, cfg, b, []byte("5th")), routeOf(a, b), t0); err != nil {
		t.Fatal(err)
	}
	if want := (Work{KDF: 3 + 2}); w != want {
		t.Fatalf("gap of 3: work %+v, want %+v", w, want)
	}
	// Without Config.Work nothing is counted and nothing fails.
	if _, err := cfg.Decrypt(b.recs["alice"], b.id, b.prekeys, forged, routeOf(a, b), t0); err == nil {
		t.Fatal("forged initiation accepted")
	}
	if got := b.prekeys.LoadWork(); got.DH == 0 || got.KEM == 0 || got.KDF != 0 {
		t.Fatalf("LoadWork %+v: one DH per signed prekey, one KEM per KEM prekey", got)
	}
}
