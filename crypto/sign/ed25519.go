package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"encoding/binary"
	"sync"

	"filippo.io/edwards25519"
)

// The verification rule of event signatures is ZIP-215, for single and
// batch verification alike (docs/verification.md):
//
//   - A (the public key) and R (the signature's first half) are decoded
//     with the ZIP-215 rules: any 32-byte string that decodes to a curve
//     point is accepted, including non-canonical encodings (y ≥ p, and
//     x = 0 with the sign bit set) and points of small or mixed order;
//   - S must be canonical (S < ℓ), and the top three bits of the
//     signature's last byte must be clear;
//   - k = SHA-512(R ‖ A ‖ M) over the encodings exactly as received;
//   - the equation is cofactored: [8][S]B = [8]R + [8][k]A.
//
// crypto/ed25519 checks the cofactorless equation [S]B = R + [k]A and
// requires R to be canonical. Every signature an RFC 8032 signer produces
// satisfies both, but a crafted one (torsion added to R or A, a
// non-canonical R) can satisfy one and not the other; and a batch
// verifier can only be cofactored (its random linear combination does not
// commute with a torsion component). One rule for both is what makes a
// batch verdict equal a single verdict, and every node's verdict equal
// every other's. filippo.io/edwards25519's SetBytes decodes exactly as
// ZIP-215 specifies.

// verifyKey is an Ed25519 public key with its point decoded once, when the
// key enters the keyring: decoding is a square root in the field, ~7% of a
// verification, and a signing key verifies thousands of events.
type verifyKey struct {
	pub    []byte
	a      *edwards25519.Point // nil: not a valid point, every signature fails
	minusA *edwards25519.Point

	// The key's tables for batch equations (msm.go), built on first use.
	wideOnce sync.Once
	wideTab  *wideTable
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
	vk.a = a
	vk.minusA = new(edwards25519.Point).Negate(a)
	return vk
}

var identity = edwards25519.NewIdentityPoint()

// isSmallOrder reports whether p is in the torsion subgroup ([8]p = O).
func isSmallOrder(p *edwards25519.Point) bool {
	return new(edwards25519.Point).MultByCofactor(p).Equal(identity) == 1
}

// sigCheck is one signature prepared for verification: its points and
// scalars decoded and its challenge hashed, so a batch and the bisection
// that follows a failed batch never decode or hash twice.
type sigCheck struct {
	vk *verifyKey
	r  edwards25519.Point
	s  edwards25519.Scalar
	k  edwards25519.Scalar
	ok bool // false: malformed (bad length, S ≥ ℓ, R or A not a point): invalid under any equation
}

// prepare decodes sig for msg under vk. A signature that fails here is
// invalid; one that passes still has to satisfy the equation.
func (c *sigCheck) prepare(vk *verifyKey, msg, sig []byte) {
	c.vk, c.ok = vk, false
	if vk.a == nil || len(sig) != ed25519.SignatureSize || sig[63]&224 != 0 {
		return
	}
	if _, err := c.s.SetCanonicalBytes(sig[32:]); err != nil {
		return
	}
	if _, err := c.r.SetBytes(sig[:32]); err != nil {
		return
	}
	h := sha512.New()
	h.Write(sig[:32])
	h.Write(vk.pub)
	h.Write(msg)
	var digest [sha512.Size]byte
	if _, err := c.k.SetUniformBytes(h.Sum(digest[:0])); err != nil {
		return
	}
	c.ok = true
}

// single checks [8]([S]B − [k]A − R) = O.
func (c *sigCheck) single() bool {
	if !c.ok {
		return false
	}
	// [k](−A) + [S]B, then minus R, times the cofactor.
	p := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(&c.k, c.vk.minusA, &c.s)
	p.Subtract(p, &c.r)
	return isSmallOrder(p)
}

// verify reports whether sig is a valid signature of msg by the key under
// the ZIP-215 rule.
func (vk *verifyKey) verify(msg, sig []byte) bool {
	var c sigCheck
	c.prepare(vk, msg, sig)
	return c.single()
}

// batchHolds checks the signatures cs together: with independent random
// 128-bit z_i, [8]( −[Σ z_i S_i]B + Σ [z_i]R_i + Σ_keys [Σ_{i of key} z_i k_i]A ) = O.
// If every signature satisfies the cofactored equation the sum is the
// identity; if one does not, its term is a non-zero point of the
// prime-order subgroup and a random combination cancels it with
// probability about 2⁻¹²⁸. Coefficients of signatures by the same key are
// merged into one scalar per key: the sync plane has few signers, so a
// batch of n costs one multi-scalar multiplication of about n+keys+1
// points instead of 2n+1 (msm.go: the tables of B and of the keys are
// built once, those of the R_i come from a pool). Every c in cs must be
// prepared and ok.
func batchHolds(cs []*sigCheck) bool {
	if len(cs) == 1 {
		return cs[0].single()
	}
	sc := batchScratchPool.Get().(*batchScratch)
	defer func() {
		if len(cs) <= maxScratchSigs {
			batchScratchPool.Put(sc)
		}
	}()
	zb := sc.coefficients(len(cs))
	if err := batchRandom(zb); err != nil {
		return false // no randomness: refuse rather than verify weakly (callers fall back)
	}
	// The distinct keys first (few: a linear scan beats a map), so the
	// scratch is sized before any term points into it.
	type keyTerm struct {
		vk    *verifyKey
		coeff edwards25519.Scalar
	}
	var keyStack [8]keyTerm
	keys := keyStack[:0]
	var keyOf [BatchSize]uint8
	keyIdx := keyOf[:0]
	if len(cs) > len(keyOf) {
		keyIdx = make([]uint8, 0, len(cs))
	}
	for _, c := range cs {
		j := 0
		for j < len(keys) && keys[j].vk != c.vk {
			j++
		}
		if j == len(keys) {
			if len(keys) == 255 {
				// More signers than a uint8 indexes: check in halves.
				mid := len(cs) / 2
				return batchHolds(cs[:mid]) && batchHolds(cs[mid:])
			}
			keys = append(keys, keyTerm{vk: c.vk})
		}
		keyIdx = append(keyIdx, uint8(j))
	}
	sc.reset(len(cs), len(keys))
	var bCoeff, z, zk edwards25519.Scalar
	var zBytes [32]byte
	var r extPoint
	top := -1
	for i, c := range cs {
		copy(zBytes[:16], zb[16*i:16*i+16])
		if _, err := z.SetCanonicalBytes(zBytes[:]); err != nil {
			return false
		}
		bCoeff.MultiplyAdd(&z, &c.s, &bCoeff) // Σ z_i S_i
		zk.Multiply(&z, &c.k)
		k := &keys[keyIdx[i]]
		k.coeff.Add(&k.coeff, &zk)
		oddMultiples(sc.rTables[i][:], r.fromLib(&c.r))
		zl := [4]uint64{binary.LittleEndian.Uint64(zb[16*i:]), binary.LittleEndian.Uint64(zb[16*i+8:])}
		top = max(top, naf(&sc.digits[i], zl, rWidth))
		sc.terms = append(sc.terms, msmTerm{table: sc.rTables[i][:], digit: &sc.digits[i]})
	}
	bCoeff.Negate(&bCoeff)
	d := len(cs)
	wide := func(t *wideTable, s *edwards25519.Scalar) {
		lo, hi := splitScalar(s)
		top = max(top, naf(&sc.digits[d], lo, wideWidth), naf(&sc.digits[d+1], hi, wideWidth))
		sc.terms = append(sc.terms, msmTerm{table: t.lo[:], digit: &sc.digits[d]}, msmTerm{table: t.hi[:], digit: &sc.digits[d+1]})
		d += 2
	}
	wide(basepointWide(), &bCoeff)
	for j := range keys {
		wide(keys[j].vk.wide(), &keys[j].coeff)
	}
	return isSmallOrderProj(msmEval(sc.terms, top))
}

// batchRandom fills the batch equation's coefficients (a test replaces it
// to compare with a reference computation on the same coefficients).
var batchRandom = readRandom

func readRandom(b []byte) error {
	_, err := rand.Read(b)
	return err
}

// bisectLeaf is the size below which a failing range is checked one
// signature at a time: a batch of 2–3 costs about as much as its singles.
const bisectLeaf = 4

// verifyAll sets bad[i] for every signature of cs that fails, checking
// them together first and, when the batch fails, by bisection: one
// forgery among n costs about log₂ n batch checks of shrinking halves, not
// n single checks. Once two forgeries turned up, the rest of a failed
// range is checked singly, so a batch full of forgeries costs little more
// than checking each alone.
func verifyAll(cs []*sigCheck, bad []bool) {
	found := 0
	var walk func(lo, hi int, knownBad bool)
	singles := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if !cs[i].single() {
				bad[i] = true
				found++
			}
		}
	}
	walk = func(lo, hi int, knownBad bool) {
		if hi-lo <= bisectLeaf || found >= 2 {
			singles(lo, hi)
			return
		}
		if !knownBad && batchHolds(cs[lo:hi]) {
			return
		}
		mid := (lo + hi) / 2
		if batchHolds(cs[lo:mid]) {
			// The range fails and its left half holds: the right half fails.
			walk(mid, hi, true)
			return
		}
		walk(lo, mid, true)
		walk(mid, hi, false)
	}
	walk(0, len(cs), false)
}
