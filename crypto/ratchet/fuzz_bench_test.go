package ratchet

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/rand"
	"testing"
)

// FuzzDecrypt feeds arbitrary bytes to Decrypt on a real responder state
// and a real established state: it must never panic, and on error neither
// the record nor the prekey store may change.
func FuzzDecrypt(f *testing.F) {
	cfg := DefaultConfig()
	a, b := newDevice(f, "alice"), newDevice(f, "bob")
	a.initiate(f, cfg, b)
	prekeyEnv := a.send(f, cfg, b, []byte("first"))
	fresh := b.recs["alice"] // empty: prekey envelopes establish
	b.mustRecv(f, cfg, a, prekeyEnv, nil)
	a.mustRecv(f, cfg, b, b.send(f, cfg, a, []byte("ack")), nil)
	env := a.send(f, cfg, b, []byte("second"))
	f.Add(prekeyEnv)
	f.Add(env)
	f.Add([]byte{})
	f.Add([]byte{0x84, 0x01, 0xf6, 0xf6, 0x40})
	recs := []SessionRecord{fresh, b.recs["alice"]}
	encs := [][]byte{mustState(f, fresh), mustState(f, b.recs["alice"])}
	pkEnc := mustPrekeys(f, b.prekeys)
	f.Fuzz(func(t *testing.T, in []byte) {
		for i, rec := range recs {
			res, err := cfg.Decrypt(rec, b.id, b.prekeys, in, routeOf(a, b), t0)
			if err != nil && (res.Plaintext != nil || !res.Record.IsEmpty()) {
				t.Fatal("error with a non-zero result")
			}
			if !bytes.Equal(encs[i], mustState(t, rec)) || !bytes.Equal(pkEnc, mustPrekeys(t, b.prekeys)) {
				t.Fatal("Decrypt modified its input state")
			}
		}
	})
}

func BenchmarkRoundTrip(b *testing.B) {
	cfg := DefaultConfig()
	x, y := established(b, cfg)
	msg := bytes.Repeat([]byte{0x5a}, 256)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		y.mustRecv(b, cfg, x, x.send(b, cfg, y, msg), nil)
		x.mustRecv(b, cfg, y, y.send(b, cfg, x, msg), nil)
	}
}

// BenchmarkBareX25519AESGCM is the floor BenchmarkRoundTrip is compared
// with: one X25519 shared secret plus an AES-256-GCM seal and open of 256
// bytes.
func BenchmarkBareX25519AESGCM(b *testing.B) {
	k1, _ := ecdh.X25519().GenerateKey(rand.Reader)
	k2, _ := ecdh.X25519().GenerateKey(rand.Reader)
	msg := bytes.Repeat([]byte{0x5a}, 256)
	nonce := make([]byte, 12)
	b.ReportAllocs()
	for b.Loop() {
		ss, err := k1.ECDH(k2.PublicKey())
		if err != nil {
			b.Fatal(err)
		}
		blk, _ := aes.NewCipher(ss)
		g, _ := cipher.NewGCM(blk)
		ct := g.Seal(nil, nonce, msg, nil)
		if _, err := g.Open(nil, nonce, ct, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInitiation: issue a bundle, initiate, encrypt the first message
// and accept it on the responder.
func BenchmarkInitiation(b *testing.B) {
	cfg := DefaultConfig()
	x, y := newDevice(b, "alice"), newDevice(b, "bob")
	b.ReportAllocs()
	for b.Loop() {
		pk, bundle, err := y.prekeys.IssueBundle(y.id.Public())
		if err != nil {
			b.Fatal(err)
		}
		if pk.UnissuedOneTimeCount() == 0 {
			b.StopTimer()
			pk, _, _ = pk.Refresh(y.id, t0)
			b.StartTimer()
		}
		y.prekeys = pk
		rec, _, err := cfg.Initiate(SessionRecord{}, x.id, &bundle, routeOf(x, y))
		if err != nil {
			b.Fatal(err)
		}
		_, env, err := cfg.Encrypt(rec, []byte("hello"))
		if err != nil {
			b.Fatal(err)
		}
		res, err := cfg.Decrypt(SessionRecord{}, y.id, y.prekeys, env, routeOf(x, y), t0)
		if err != nil {
			b.Fatal(err)
		}
		y.prekeys = res.Prekeys
	}
}
