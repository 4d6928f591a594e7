package sign

import (
	"crypto/ed25519"
	"crypto/rand"
	"math/big"
	"testing"
)

// The cached verification agrees with crypto/ed25519 on valid signatures,
// every single-bit corruption, non-canonical S, the reserved top bits,
// wrong lengths, and keys that are not curve points.
func TestVerifyKeyMatchesCryptoEd25519(t *testing.T) {
	check := func(pub ed25519.PublicKey, msg, sig []byte, what string) {
		t.Helper()
		want := len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, msg, sig)
		if got := newVerifyKey(pub).verify(msg, sig); got != want {
			t.Fatalf("%s: verify = %v, crypto/ed25519 = %v", what, got, want)
		}
	}
	for i := 0; i < 20; i++ {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		msg := make([]byte, i*7)
		_, _ = rand.Read(msg)
		sig := ed25519.Sign(priv, msg)
		check(pub, msg, sig, "valid")
		for bit := 0; bit < len(sig)*8; bit += 5 {
			bad := append([]byte(nil), sig...)
			bad[bit/8] ^= 1 << (bit % 8)
			check(pub, msg, bad, "corrupted signature")
		}
		for bit := 0; bit < len(pub)*8; bit += 11 {
			badPub := append(ed25519.PublicKey(nil), pub...)
			badPub[bit/8] ^= 1 << (bit % 8)
			check(badPub, msg, sig, "corrupted key")
		}
		if len(msg) > 0 {
			check(pub, msg[1:], sig, "other message")
		}
		// S + L: the same scalar, not canonical: must fail.
		l, _ := new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
		s := new(big.Int).SetBytes(reverse(sig[32:]))
		s.Add(s, l)
		nonCanon := append([]byte(nil), sig[:32]...)
		nonCanon = append(nonCanon, reverse(leftPad(s.Bytes(), 32))...)
		check(pub, msg, nonCanon, "non-canonical S")
		check(pub, msg, sig[:63], "short signature")
		check(pub, msg, append(sig, 0), "long signature")
	}
	// Encodings that are not points, and the identity / small-order point.
	notPoint := make(ed25519.PublicKey, 32)
	for i := range notPoint {
		notPoint[i] = 0xff
	}
	check(notPoint, []byte("m"), make([]byte, 64), "not a point")
	identity := make(ed25519.PublicKey, 32)
	identity[0] = 1
	sig := make([]byte, 64)
	sig[0] = 1
	check(identity, []byte("m"), sig, "identity key")
	check(ed25519.PublicKey{1, 2, 3}, []byte("m"), sig, "short key")
}

func reverse(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[len(b)-1-i] = b[i]
	}
	return out
}

func leftPad(b []byte, n int) []byte {
	if len(b) >= n {
		return b[len(b)-n:]
	}
	return append(make([]byte, n-len(b)), b...)
}

// FuzzVerifyKeyMatchesCryptoEd25519: on any key, message and signature the
// cached verification says what crypto/ed25519 says.
func FuzzVerifyKeyMatchesCryptoEd25519(f *testing.F) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg := []byte("event")
	f.Add([]byte(pub), msg, ed25519.Sign(priv, msg))
	f.Add(make([]byte, 32), msg, make([]byte, 64))
	f.Fuzz(func(t *testing.T, pub, msg, sig []byte) {
		want := len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, msg, sig)
		if got := newVerifyKey(pub).verify(msg, sig); got != want {
			t.Fatalf("verify = %v, crypto/ed25519 = %v", got, want)
		}
	})
}

func BenchmarkVerifyCachedVsStd(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg := make([]byte, 200)
	sig := ed25519.Sign(priv, msg)
	vk := newVerifyKey(pub)
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if !vk.verify(msg, sig) {
				b.Fatal("rejected")
			}
		}
	})
	b.Run("crypto/ed25519", func(b *testing.B) {
		for b.Loop() {
			if !ed25519.Verify(pub, msg, sig) {
				b.Fatal("rejected")
			}
		}
	})
}
