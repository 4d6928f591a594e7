package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"

	"filippo.io/edwards25519"
)

// verifyKey is an Ed25519 public key with its point decoded and negated
// once, when the key enters the keyring. crypto/ed25519.Verify decodes the
// point (a square root in the field) on every call; on the apply path that
// is ~2.6 µs of every ~37 µs verification, for a key that verifies
// thousands of events. The check below is crypto/ed25519's own (RFC 8032
// §5.1.7 with its cofactorless equation and canonical-S rule), on the
// same curve implementation (filippo.io/edwards25519 is the upstream of
// the standard library's internal copy); tests and a fuzz target hold it
// to crypto/ed25519's verdict on every input.
type verifyKey struct {
	pub    []byte
	minusA *edwards25519.Point // nil: not a valid point, every signature fails
}

func newVerifyKey(pub ed25519.PublicKey) *verifyKey {
	vk := &verifyKey{pub: bytes.Clone(pub)}
	if len(pub) != ed25519.PublicKeySize {
		return vk
	}
	a, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return vk
	}
	vk.minusA = new(edwards25519.Point).Negate(a)
	return vk
}

// verify reports whether sig is a valid signature of msg by the key.
func (vk *verifyKey) verify(msg, sig []byte) bool {
	if vk.minusA == nil || len(sig) != ed25519.SignatureSize || sig[63]&224 != 0 {
		return false
	}
	h := sha512.New()
	h.Write(sig[:32])
	h.Write(vk.pub)
	h.Write(msg)
	var digest [sha512.Size]byte
	k, err := new(edwards25519.Scalar).SetUniformBytes(h.Sum(digest[:0]))
	if err != nil {
		return false
	}
	s, err := new(edwards25519.Scalar).SetCanonicalBytes(sig[32:])
	if err != nil {
		return false
	}
	// [S]B = R + [k]A  ⇔  R = [k](−A) + [S]B
	r := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(k, vk.minusA, s)
	return bytes.Equal(sig[:32], r.Bytes())
}
