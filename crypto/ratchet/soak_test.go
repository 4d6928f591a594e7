package ratchet

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestRestoreAndCloneSoak is the short restore-and-clone soak: two devices
// exchange a few thousand messages while the sender's stored record is
// restored from copies taken at random earlier moments, and for a while a
// clone runs beside it. Every (key, nonce) the ratchet seals under is
// recorded: none may be used twice. The counts are printed.
func TestRestoreAndCloneSoak(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.LegacyEnvelopes = legacy
		reused := restoreAndCloneSoak(t, cfg)
		switch {
		case !legacy && reused != 0:
			t.Fatalf("%d (key, nonce) pairs reused", reused)
		case legacy && reused == 0:
			t.Fatal("version-1 envelopes reused no pair in the soak: it cannot see reuse")
		}
	}
}

// restoreAndCloneSoak runs the soak under cfg and returns how many pairs
// were reused. The receiver repairs the session (a fresh initiation the
// sender accepts, as the session layer does) after three refused
// envelopes in a row, so the exchange goes on after each restore.
func restoreAndCloneSoak(t *testing.T, cfg Config) int {
	rec := recordSeals(t)
	defer sealObserver.Store(nil)
	a, b := established(t, cfg)
	rng := rand.New(rand.NewPCG(25, 1))
	var snaps []SessionRecord
	var clone *device
	var sent, delivered, refused, restores, clones, cloneSent, repairs, streak int
	const rounds = 3000
	for i := range rounds {
		switch r := rng.IntN(100); {
		case r < 10:
			snaps = append(snaps, a.recs[b.name])
		case r < 13 && len(snaps) > 0:
			a.recs[b.name] = snaps[rng.IntN(len(snaps))] // a restore from an earlier copy
			restores++
		case r < 14 && clone == nil:
			clone = &device{name: a.name, id: a.id, prekeys: a.prekeys, recs: map[string]SessionRecord{b.name: a.recs[b.name]}}
			clones++
		case r < 16 && clone != nil:
			clone = nil
		}
		pt := []byte{byte(i), byte(i >> 8), 'a'}
		env := a.send(t, cfg, b, pt)
		sent++
		if clone != nil {
			clone.send(t, cfg, b, []byte{byte(i), byte(i >> 8), 'c'})
			cloneSent++
		}
		if _, err := b.recv(cfg, a, env, t0); err != nil {
			if !errors.Is(err, ErrReplay) && !errors.Is(err, ErrTampered) && !errors.Is(err, ErrTooManySkipped) && !errors.Is(err, ErrUnknownSession) {
				t.Fatalf("round %d: %v", i, err)
			}
			refused++
			if streak++; streak == 3 || errors.Is(err, ErrUnknownSession) {
				streak = 0
				b.initiate(t, cfg, a)
				a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("repair")), nil)
				repairs++
			}
		} else {
			delivered++
			streak = 0
		}
		if i%5 == 0 {
			// b answers; a takes it when a's state still holds the chain.
			if _, err := a.recv(cfg, b, b.send(t, cfg, a, []byte("ok")), t0); err == nil {
				sent++
			}
		}
	}
	t.Logf("legacy %v, %d rounds: %d seals, %d distinct (key, nonce) pairs, %d reused; %d restores from %d copies, %d clones sending %d; %d delivered, %d refused (rolled-back positions), %d repairs",
		cfg.LegacyEnvelopes, rounds, rec.seals, len(rec.seen), rec.reused, restores, len(snaps), clones, cloneSent, delivered, refused, repairs)
	if restores == 0 || clones == 0 || refused == 0 || repairs == 0 {
		t.Fatalf("the soak restored %d times, cloned %d times, refused %d, repaired %d: it tested nothing", restores, clones, refused, repairs)
	}
	if sent < rounds {
		t.Fatalf("%d sent", sent)
	}
	return rec.reused
}
