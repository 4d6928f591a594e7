package ratchet

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"testing"
)

// hmacKDFCK is KDF_CK as it was computed before the allocation-free
// version: crypto/hmac keyed by the chain key.
func hmacKDFCK(ck [32]byte) (mk, next [32]byte) {
	m := hmac.New(sha256.New, ck[:])
	m.Write([]byte{0x01})
	m.Sum(mk[:0])
	m.Reset()
	m.Write([]byte{0x02})
	m.Sum(next[:0])
	return mk, next
}

// TestKDFCKVectors: kdfCK gives today's outputs — fixed vectors computed
// with crypto/hmac before the change, and agreement with crypto/hmac over
// random chain keys and a 1 000-step chain walk.
func TestKDFCKVectors(t *testing.T) {
	var ck [32]byte
	for i := range ck {
		ck[i] = byte(i)
	}
	vectors := []struct {
		steps    int
		mk, next string
	}{
		{1, "9b4c8120a4823a95f47cde17a244f4507244ee6e3957d1fab9fa29b44d3829b7", "4304c22c84a53755ab08ead8d97a8d429be5efa480682d7ad1da27f73e1fbe1d"},
		{1000, "4056faa31f51d289496a075977788dddc4e01f9114ebee7a3bd8b74de5175c6a", "920814f61d9ca1c82f9ac558762609e9f50fa172e49bda91d6f39d7b17acdc4c"},
	}
	for _, v := range vectors {
		c := ck
		var mk [32]byte
		for range v.steps {
			mk, c = kdfCK(c)
		}
		if got := hex.EncodeToString(mk[:]); got != v.mk {
			t.Errorf("%d steps: message key %s, want %s", v.steps, got, v.mk)
		}
		if got := hex.EncodeToString(c[:]); got != v.next {
			t.Errorf("%d steps: chain key %s, want %s", v.steps, got, v.next)
		}
	}
	for range 200 {
		if _, err := rand.Read(ck[:]); err != nil {
			t.Fatal(err)
		}
		mk, next := kdfCK(ck)
		wmk, wnext := hmacKDFCK(ck)
		if mk != wmk || next != wnext {
			t.Fatalf("chain key %x: kdfCK differs from HMAC-SHA256", ck)
		}
	}
}

// TestKDFCKDoesNotAllocate: a chain walk allocates nothing per step
// (hmac.New per step churned ~40 MiB in the worst case).
func TestKDFCKDoesNotAllocate(t *testing.T) {
	var ck [32]byte
	allocs := testing.AllocsPerRun(100, func() {
		for range 64 {
			_, ck = kdfCK(ck)
		}
	})
	if allocs != 0 {
		t.Fatalf("kdfCK allocates %.1f times per 64 steps", allocs)
	}
}

func BenchmarkKDFCK(b *testing.B) {
	var ck [32]byte
	b.ReportAllocs()
	for b.Loop() {
		_, ck = kdfCK(ck)
	}
}

func BenchmarkKDFCKHMAC(b *testing.B) {
	var ck [32]byte
	b.ReportAllocs()
	for b.Loop() {
		_, ck = hmacKDFCK(ck)
	}
}

// TestHKDFMatchesCryptoHKDF: the stack HKDF gives RFC 5869's test case 1
// and crypto/hkdf's output for every size the ratchet uses (message keys:
// 44 bytes under a zero salt; root steps: 64 bytes under the root key) and
// for random inputs within its bounds.
func TestHKDFMatchesCryptoHKDF(t *testing.T) {
	ikm, _ := hex.DecodeString("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b")
	salt, _ := hex.DecodeString("000102030405060708090a0b0c")
	info, _ := hex.DecodeString("f0f1f2f3f4f5f6f7f8f9")
	out := make([]byte, 42)
	if err := hkdfSHA256(out, ikm, salt, string(info)); err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(out), "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"; got != want {
		t.Fatalf("RFC 5869 A.1: %s, want %s", got, want)
	}
	check := func(secret, salt []byte, info string, n int) {
		t.Helper()
		want, err := hkdf.Key(sha256.New, secret, salt, info, n)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := hkdfSHA256(got, secret, salt, info); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("secret %x salt %x info %q, %d bytes: %x, want %x", secret, salt, info, n, got, want)
		}
	}
	rnd := func(n int) []byte {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for range 200 {
		check(rnd(32), make([]byte, 32), infoMessage, 44)
		check(rnd(32), rnd(32), infoRoot, 64)
		check(rnd(mrand.IntN(hmacMaxMsg+1)), rnd(mrand.IntN(65)), string(rnd(mrand.IntN(hmacMaxMsg-32))), 1+mrand.IntN(64))
	}
}

// TestMessageKeyDerivationAllocatesOnlyTheCipher: deriving a message's
// key and nonce allocates only the AES block and the GCM state (crypto/hkdf
// allocated two hash states per HMAC, about 20 % of a delivery's allocated
// bytes).
func TestMessageKeyDerivationAllocatesOnlyTheCipher(t *testing.T) {
	var mk [32]byte
	floor := testing.AllocsPerRun(100, func() {
		b, _ := aes.NewCipher(mk[:])
		if _, err := cipher.NewGCM(b); err != nil {
			t.Fatal(err)
		}
	})
	var salt [32]byte
	for _, s := range []*[32]byte{nil, &salt} {
		got := testing.AllocsPerRun(100, func() {
			if _, _, err := messageAEAD(mk, s, false); err != nil {
				t.Fatal(err)
			}
		})
		if got > floor {
			t.Fatalf("messageAEAD (salted %v) allocates %.0f times, AES-GCM construction alone %.0f", s != nil, got, floor)
		}
	}
	rk := testing.AllocsPerRun(100, func() {
		if _, _, err := kdfRK(mk, mk[:]); err != nil {
			t.Fatal(err)
		}
	})
	if rk != 0 {
		t.Fatalf("kdfRK allocates %.0f times", rk)
	}
}

// BenchmarkChainMessage is the per-message cost of a busy one-way chain:
// 64 envelopes encrypted, then decrypted in order by the peer (no DH
// ratchet step in between), per envelope.
func BenchmarkChainMessage(b *testing.B) {
	cfg := DefaultConfig()
	x, y := established(b, cfg)
	msg := bytes.Repeat([]byte{0x5a}, 256)
	envs := make([][]byte, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		j := i % len(envs)
		envs[j] = x.send(b, cfg, y, msg)
		if j == len(envs)-1 {
			for _, e := range envs {
				y.mustRecv(b, cfg, x, e, nil)
			}
		}
	}
}

// TestKDFHelpersRefuseOutOfRange: the stack HMAC and HKDF compute exactly
// crypto/hmac's and crypto/hkdf's output at each bound and refuse with
// errKDFRange one byte past it (a key longer than a block was silently
// cut to 64 bytes, a message to 96, and an info over 63 bytes indexed
// past the expand buffer and panicked).
func TestKDFHelpersRefuseOutOfRange(t *testing.T) {
	fill := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	wantHMAC := func(key, msg []byte) []byte {
		m := hmac.New(sha256.New, key)
		m.Write(msg)
		return m.Sum(nil)
	}
	for _, c := range []struct {
		name     string
		key, msg []byte
		ok       bool
	}{
		{"key at a block", fill(hmacMaxKey, 1), fill(10, 2), true},
		{"key past a block", fill(hmacMaxKey+1, 1), fill(10, 2), false},
		{"message at the bound", fill(32, 1), fill(hmacMaxMsg, 2), true},
		{"message past the bound", fill(32, 1), fill(hmacMaxMsg+1, 2), false},
		{"empty key and message", nil, nil, true},
	} {
		got, err := hmacSHA256(c.key, c.msg)
		if !c.ok {
			if !errors.Is(err, errKDFRange) {
				t.Errorf("HMAC %s: err %v, want errKDFRange", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("HMAC %s: %v", c.name, err)
		} else if !bytes.Equal(got[:], wantHMAC(c.key, c.msg)) {
			t.Errorf("HMAC %s: %x differs from crypto/hmac", c.name, got)
		}
	}
	for _, c := range []struct {
		name         string
		secret, salt []byte
		info         string
		n            int
		ok           bool
	}{
		{"info at the bound", fill(32, 1), fill(32, 2), string(fill(hkdfMaxInfo, 'i')), 64, true},
		{"info past the bound", fill(32, 1), fill(32, 2), string(fill(hkdfMaxInfo+1, 'i')), 64, false},
		{"salt at a block", fill(32, 1), fill(hmacMaxKey, 2), "x", 32, true},
		{"salt past a block", fill(32, 1), fill(hmacMaxKey+1, 2), "x", 32, false},
		{"secret at the bound", fill(hmacMaxMsg, 1), nil, "x", 32, true},
		{"secret past the bound", fill(hmacMaxMsg+1, 1), nil, "x", 32, false},
		{"output at RFC 5869's limit", fill(32, 1), nil, "x", hkdfMaxOut, true},
		{"output past RFC 5869's limit", fill(32, 1), nil, "x", hkdfMaxOut + 1, false},
	} {
		got := make([]byte, c.n)
		err := hkdfSHA256(got, c.secret, c.salt, c.info)
		if !c.ok {
			if !errors.Is(err, errKDFRange) {
				t.Errorf("HKDF %s: err %v, want errKDFRange", c.name, err)
			}
			if !bytes.Equal(got, make([]byte, c.n)) {
				t.Errorf("HKDF %s: refused, but wrote output", c.name)
			}
			continue
		}
		want, werr := hkdf.Key(sha256.New, c.secret, c.salt, c.info, c.n)
		if werr != nil {
			t.Fatal(werr)
		}
		if err != nil {
			t.Errorf("HKDF %s: %v", c.name, err)
		} else if !bytes.Equal(got, want) {
			t.Errorf("HKDF %s: differs from crypto/hkdf", c.name)
		}
	}
}
