package ratchet

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// pairRecorder records every (key, nonce) the ratchet seals under (the
// soak hook) and counts the pairs seen more than once.
type pairRecorder struct {
	mu     sync.Mutex
	seen   map[[44]byte]int
	seals  int
	reused int
}

func recordSeals(t testing.TB) *pairRecorder {
	t.Helper()
	r := &pairRecorder{seen: map[[44]byte]int{}}
	f := func(key [32]byte, nonce [12]byte) {
		var k [44]byte
		copy(k[:32], key[:])
		copy(k[32:], nonce[:])
		r.mu.Lock()
		defer r.mu.Unlock()
		r.seals++
		if r.seen[k]++; r.seen[k] == 2 {
			r.reused++
		}
	}
	if !sealObserver.CompareAndSwap(nil, &f) {
		t.Fatal("another seal observer is installed")
	}
	t.Cleanup(func() { sealObserver.Store(nil) })
	return r
}

// cloneRun: a device's record is copied and both copies (original and
// clone) keep sending on it, interleaved with the peer's answers to the
// original, for rounds rounds. It returns how many envelopes were sealed.
func cloneRun(t *testing.T, cfg Config, rounds int) int {
	a, b := established(t, cfg)
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("warm")), nil) // the copy is taken mid-chain
	clone := &device{name: a.name, id: a.id, prekeys: a.prekeys, recs: map[string]SessionRecord{b.name: a.recs[b.name]}}
	sent := 1
	for i := range rounds {
		pa := []byte{'a', byte(i), byte(i >> 8)}
		pc := []byte{'c', byte(i), byte(i >> 8)}
		b.mustRecv(t, cfg, a, a.send(t, cfg, b, pa), pa)
		clone.send(t, cfg, b, pc) // the peer refuses or takes it; its keys are what matters
		sent += 2
		if i%7 == 0 {
			a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("ok")), nil)
			sent++
		}
	}
	return sent
}

// TestCloneNeverReusesKeyAndNonce: a clone running beside its original
// (the case no restore mark can see) seals every envelope under a (key,
// nonce) pair no other envelope used. Under LegacyEnvelopes the same run
// reuses pairs, which shows the recorder sees reuse when it happens.
func TestCloneNeverReusesKeyAndNonce(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.LegacyEnvelopes = legacy
		rec := recordSeals(t)
		sent := cloneRun(t, cfg, 60)
		sealObserver.Store(nil)
		t.Logf("legacy %v: %d seals (%d envelopes of this run), %d distinct pairs, %d reused", legacy, rec.seals, sent, len(rec.seen), rec.reused)
		if rec.seals < sent {
			t.Fatalf("legacy %v: the recorder saw %d seals of %d envelopes", legacy, rec.seals, sent)
		}
		switch {
		case !legacy && rec.reused != 0:
			t.Fatalf("%d (key, nonce) pairs reused by a clone", rec.reused)
		case legacy && rec.reused == 0:
			t.Fatal("version-1 envelopes of a clone reused no pair: the recorder does not see reuse")
		}
	}
}

// A hedged salt: with the random source stuck (a cloned generator state),
// two different plaintexts at one chain position still get different
// salts, so different keys and nonces; the same plaintext gets the same
// envelope (nothing leaks but equality).
func TestSaltIsHedgedAgainstARepeatedRandomSource(t *testing.T) {
	old := saltRandom
	t.Cleanup(func() { saltRandom = old })
	saltRandom = func(b []byte) error { clear(b); return nil }
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("warm")), nil)
	saved := a.recs[b.name]
	x, y := []byte("the first plaintext"), []byte("the other plaintext")
	envX := a.send(t, cfg, b, x)
	a.recs[b.name] = saved
	envY := a.send(t, cfg, b, y)
	a.recs[b.name] = saved
	envX2 := a.send(t, cfg, b, x)
	hx, ksX := keystream(t, envX, x)
	hy, ksY := keystream(t, envY, y)
	if *hx.Salt == *hy.Salt || bytes.Equal(ksX, ksY) {
		t.Fatal("a stuck random source gave two plaintexts one salt")
	}
	if !bytes.Equal(envX, envX2) {
		t.Fatal("the same plaintext at the same position under a stuck random source: not the same envelope")
	}
}

// Mixed versions: by default every envelope is version 2; under
// LegacyEnvelopes a session sends version 1 until the peer sent version 2
// on it, then version 2. A receiver reads both, whatever its setting.
func TestEnvelopeVersionUpgradeRule(t *testing.T) {
	version := func(env []byte) byte { return env[1] }
	legacy := DefaultConfig()
	legacy.LegacyEnvelopes = true
	current := DefaultConfig()

	// Both legacy (a rolling upgrade in progress): version 1 both ways.
	a, b := established(t, legacy)
	if v := version(a.send(t, legacy, b, []byte("x"))); v != messages.EnvelopeVersion {
		t.Fatalf("legacy sender wrote version %d", v)
	}
	// b is switched to the default: it sends version 2; a reads it and
	// answers in version 2 from then on.
	env := b.send(t, current, a, []byte("v2"))
	if version(env) != messages.EnvelopeVersionSalted {
		t.Fatalf("default sender wrote version %d", version(env))
	}
	a.mustRecv(t, legacy, b, env, []byte("v2"))
	for i := range 3 {
		env := a.send(t, legacy, b, []byte{byte(i)})
		if version(env) != messages.EnvelopeVersionSalted {
			t.Fatalf("legacy sender did not upgrade after the peer's version 2 (message %d: version %d)", i, version(env))
		}
		b.mustRecv(t, legacy, a, env, []byte{byte(i)})
	}

	// A fresh pair on defaults: version 2 from the prekey envelope on.
	c, d := newDevice(t, "carol"), newDevice(t, "dave")
	c.initiate(t, current, d)
	env = c.send(t, current, d, []byte("hello"))
	if version(env) != messages.EnvelopeVersionSalted {
		t.Fatalf("prekey envelope of version %d", version(env))
	}
	d.mustRecv(t, legacy, c, env, []byte("hello"))
	if version(d.send(t, legacy, c, []byte("hi"))) != messages.EnvelopeVersionSalted {
		t.Fatal("a legacy responder answers a version-2 initiator in version 1")
	}
}

// Any change of the salt fails authentication (it is in the associated
// data and in the key derivation); nothing changes on the receiver.
func TestSaltTamperingIsRefused(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	env := a.send(t, cfg, b, []byte("payload"))
	e, err := messages.DecodeEnvelope(env)
	if err != nil {
		t.Fatal(err)
	}
	before := mustState(t, b.recs[a.name])
	for i := range messages.HeaderSaltSize {
		s := *e.Header.Salt
		s[i] ^= 0x80
		m := *e
		m.Header.Salt = &s
		mut, err := messages.EncodeEnvelope(&m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.recv(cfg, a, mut, t0); !errors.Is(err, ErrTampered) {
			t.Fatalf("salt byte %d flipped: %v", i, err)
		}
	}
	if !bytes.Equal(before, mustState(t, b.recs[a.name])) {
		t.Fatal("a refused envelope changed the record")
	}
	b.mustRecv(t, cfg, a, env, []byte("payload"))
}

// envelopeVectors is testdata/envelope_v2_vectors.json: fixed session
// values, R and plaintext in; every intermediate value and the envelope
// out (docs/protocol.md, "Envelope version 2").
type envelopeVector struct {
	Name      string `json:"name"`
	Salted    bool   `json:"salted"`
	Session   string `json:"session"`
	LocalSign string `json:"local_sign"`
	LocalDH   string `json:"local_dh"`
	PeerSign  string `json:"peer_sign"`
	PeerDH    string `json:"peer_dh"`
	DHs       string `json:"dhs_pub"`
	CKs       string `json:"chain_key"`
	N         uint32 `json:"n"`
	PN        uint32 `json:"pn"`
	R         string `json:"r"`
	Plaintext string `json:"plaintext"`

	MK       string `json:"message_key"`
	Salt     string `json:"salt"`
	Key      string `json:"aead_key"`
	Nonce    string `json:"aead_nonce"`
	Envelope string `json:"envelope"`
}

func unhex32(t *testing.T, s string) (b [32]byte) {
	t.Helper()
	v, err := hex.DecodeString(s)
	if err != nil || len(v) != 32 {
		t.Fatalf("bad 32-byte hex %q", s)
	}
	copy(b[:], v)
	return b
}

// TestEnvelopeVectors: the frozen vectors of both envelope versions. The
// sender's session is built from the vector's values and R is fixed; the
// envelope must be byte for byte the vector's, and a receiver holding the
// same chain key decrypts it.
func TestEnvelopeVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "envelope_v2_vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []envelopeVector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 3 {
		t.Fatalf("%d vectors", len(vs))
	}
	old := saltRandom
	t.Cleanup(func() { saltRandom = old })
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			r := unhex32(t, v.R)
			saltRandom = func(b []byte) error { copy(b, r[:]); return nil }
			pt, err := hex.DecodeString(v.Plaintext)
			if err != nil {
				t.Fatal(err)
			}
			s := &session{
				id: unhex32(t, v.Session), local: IdentityPublic{Sign: unhex32(t, v.LocalSign), DH: unhex32(t, v.LocalDH)},
				remote: IdentityPublic{Sign: unhex32(t, v.PeerSign), DH: unhex32(t, v.PeerDH)},
				dhsPub: unhex32(t, v.DHs), cks: unhex32(t, v.CKs), hasCKs: true, hasDHr: true, ns: v.N, pn: v.PN,
			}
			ns, env, err := s.encrypt(pt, !v.Salted)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(env); got != v.Envelope {
				t.Fatalf("envelope\n got %s\nwant %s", got, v.Envelope)
			}
			if ns.ns != v.N+1 {
				t.Fatalf("chain position %d after the step", ns.ns)
			}
			mk, _ := kdfCK(s.cks)
			if hex.EncodeToString(mk[:]) != v.MK {
				t.Fatalf("message key %x", mk)
			}
			e, err := messages.DecodeEnvelope(env)
			if err != nil {
				t.Fatal(err)
			}
			if v.Salted != (e.Header.Salt != nil) {
				t.Fatalf("salted %v, header salt %v", v.Salted, e.Header.Salt)
			}
			saltHex := ""
			if e.Header.Salt != nil {
				saltHex = hex.EncodeToString(e.Header.Salt[:])
			}
			okm, err := messageKeyNonce(mk, e.Header.Salt)
			if err != nil {
				t.Fatal(err)
			}
			if saltHex != v.Salt || hex.EncodeToString(okm[:32]) != v.Key || hex.EncodeToString(okm[32:]) != v.Nonce {
				t.Fatalf("salt %s key %x nonce %x", saltHex, okm[:32], okm[32:])
			}
			// The receiver: the same chain at the same position.
			rcv := &session{
				id: s.id, local: s.remote, remote: s.local,
				dhr: s.dhsPub, hasDHr: true, ckr: s.cks, hasCKr: true, nr: v.N,
			}
			hdrEnc, _ := messages.EncodeRatchetHeader(&e.Header)
			_, got, err := rcv.decrypt(DefaultConfig(), e, hdrEnc, nil, t0.UnixNano())
			if err != nil || !bytes.Equal(got, pt) {
				t.Fatalf("receiver: %q, %v", got, err)
			}
		})
	}
}
