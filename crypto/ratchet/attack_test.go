package ratchet

import (
	"errors"
	"testing"
)

// Regression tests of session-cryptography attacks by hostile peers
// (record inflation, a borrowed signing key).

// TestAttackInitiatorCannotBorrowASigningKey: an initiation presenting
// {victim's signing key, attacker's DH key} must be refused, so nothing can
// pin the victim's signing key to a DH key the victim never held.
func TestAttackInitiatorCannotBorrowASigningKey(t *testing.T) {
	cfg := DefaultConfig()
	victim, bob, mallory := newDevice(t, "victim"), newDevice(t, "bob"), newDevice(t, "mallory")
	// Mallory presents the victim's public signing key beside her own DH key;
	// she holds no signing seed of the victim.
	forged := mallory.id
	forged.pub.Sign = victim.id.Public().Sign
	rec, _, err := cfg.Initiate(SessionRecord{}, forged, bob.bundle(t), routeOf(mallory, bob))
	if err != nil {
		t.Fatal(err)
	}
	mallory.recs[bob.name] = rec
	env := mallory.send(t, cfg, bob, []byte("I am the victim"))
	res, err := bob.recv(cfg, mallory, env, t0)
	if err == nil {
		t.Fatalf("initiation with a borrowed signing key accepted: remote %s would be pinned", res.Session.Remote)
	}
	if !errors.Is(err, ErrTampered) {
		t.Fatalf("refused with %v, want ErrTampered", err)
	}
	if !bob.recs[mallory.name].IsEmpty() {
		t.Fatal("a session was kept")
	}
}

// TestAttackHostilePeerCannotInflateItsRecord: 41 prekey envelopes from a
// pinned but hostile peer, each starting a session and skipping many keys,
// cannot grow the record past the skipped-key cap (uncapped, a
// 5.4 MiB record made every receive and commit 200 times slower).
func TestAttackHostilePeerCannotInflateItsRecord(t *testing.T) {
	cfg := DefaultConfig()
	bob, mallory := newDevice(t, "bob"), newDevice(t, "mallory")
	const maxRecord = 200 << 10
	for _, skip := range []uint32{2000, 200} {
		for range 41 {
			rec, _, err := cfg.Initiate(mallory.recs[bob.name], mallory.id, bob.bundle(t), routeOf(mallory, bob))
			if err != nil {
				t.Fatal(err)
			}
			// Mallory jumps her first chain ahead by skip messages.
			s := *rec.sessions[0]
			s.cks, _ = skipKeys(s.cks, s.dhsPub, 0, skip, 0, 0)
			s.ns = skip
			mallory.recs[bob.name] = rec.withReplaced(0, &s)
			env := mallory.send(t, cfg, bob, []byte("x"))
			_, _ = bob.recv(cfg, mallory, env, t0) // refused or accepted: the record must stay bounded
		}
		n := len(mustState(t, bob.recs[mallory.name]))
		if n > maxRecord {
			t.Fatalf("skip %d: record of the hostile peer is %d bytes after 41 envelopes, cap %d", skip, n, maxRecord)
		}
		t.Logf("skip %d: record %d bytes after 41 envelopes", skip, n)
	}
}
