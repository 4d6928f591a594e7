package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"math/big"
	mrand "math/rand/v2"
	"strconv"
	"testing"

	"filippo.io/edwards25519"
)

// ell is the order of the prime subgroup.
var ell, _ = new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)

// fieldP is 2^255 − 19.
var fieldP = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))

// order8 is a point of order 8 (the generator of the torsion subgroup used
// by "Taming the many EdDSAs" and libsodium's blocklist).
const order8Hex = "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"

// torsion returns the 8 points of the small-order subgroup, T_i = [i]T_1.
func torsion(t testing.TB) []*edwards25519.Point {
	t.Helper()
	b, _ := hex.DecodeString(order8Hex)
	g, err := new(edwards25519.Point).SetBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	four := new(edwards25519.Point).Add(g, g)
	four.Add(four, four)
	if !isSmallOrder(g) || four.Equal(identity) == 1 {
		t.Fatal("order8Hex is not of order 8")
	}
	out := []*edwards25519.Point{edwards25519.NewIdentityPoint()}
	for i := 1; i < 8; i++ {
		out = append(out, new(edwards25519.Point).Add(out[i-1], g))
	}
	return out
}

func leBytes(x *big.Int) []byte {
	b := make([]byte, 32)
	be := x.Bytes()
	for i := range be {
		b[i] = be[len(be)-1-i]
	}
	return b
}

func leInt(b []byte) *big.Int { return new(big.Int).SetBytes(reverse(b)) }

// encodings returns every 32-byte encoding ZIP-215 accepts for p: the
// canonical one, y + p when it fits in 255 bits, and each with the sign
// bit set when x = 0.
func encodings(p *edwards25519.Point) [][]byte {
	canon := p.Bytes()
	y := leInt(append(bytes.Clone(canon[:31]), canon[31]&0x7f))
	sign := canon[31] & 0x80
	var ys []*big.Int
	ys = append(ys, y)
	if yp := new(big.Int).Add(y, fieldP); yp.BitLen() <= 255 {
		ys = append(ys, yp)
	}
	var out [][]byte
	for _, yy := range ys {
		for _, s := range []byte{sign, sign ^ 0x80} {
			e := leBytes(yy)
			e[31] |= s
			q, err := new(edwards25519.Point).SetBytes(e)
			if err != nil || q.Equal(p) != 1 {
				continue
			}
			out = append(out, e)
		}
	}
	return out
}

// scalarFromBig reduces x mod ℓ into a Scalar.
func scalarFromBig(x *big.Int) *edwards25519.Scalar {
	x = new(big.Int).Mod(x, ell)
	s, err := edwards25519.NewScalar().SetCanonicalBytes(leBytes(x))
	if err != nil {
		panic(err)
	}
	return s
}

func challenge(rEnc, aEnc, msg []byte) *edwards25519.Scalar {
	h := sha512.New()
	h.Write(rEnc)
	h.Write(aEnc)
	h.Write(msg)
	k, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	return k
}

// makeSig returns rEnc ‖ S with S = r + k·a, k = H(rEnc ‖ aEnc ‖ msg): a
// signature whose equation holds up to whatever torsion the caller put
// into R or A.
func makeSig(a, r *edwards25519.Scalar, aEnc, rEnc, msg []byte) []byte {
	s := edwards25519.NewScalar().MultiplyAdd(challenge(rEnc, aEnc, msg), a, r)
	return append(bytes.Clone(rEnc), s.Bytes()...)
}

// secret is a signing scalar and its public key point.
type secret struct {
	a *edwards25519.Scalar
	A *edwards25519.Point
}

func newSecret(seed []byte) secret {
	h := sha512.Sum512(seed)
	a, _ := edwards25519.NewScalar().SetBytesWithClamping(h[:32])
	return secret{a: a, A: new(edwards25519.Point).ScalarBaseMult(a)}
}

func randScalar(rng *mrand.ChaCha8) *edwards25519.Scalar {
	var b [64]byte
	_, _ = rng.Read(b[:])
	s, _ := edwards25519.NewScalar().SetUniformBytes(b[:])
	return s
}

// batchVerdicts runs verifyAll over the given (key, msg, sig) triples and
// returns the per-signature verdict it reaches (true = valid).
func batchVerdicts(vks []*verifyKey, msgs, sigs [][]byte) []bool {
	checks := make([]sigCheck, len(sigs))
	var cands []*sigCheck
	var idx []int
	for i := range sigs {
		checks[i].prepare(vks[i], msgs[i], sigs[i])
		if checks[i].ok {
			cands = append(cands, &checks[i])
			idx = append(idx, i)
		}
	}
	bad := make([]bool, len(cands))
	if len(cands) > 0 {
		verifyAll(cands, bad)
	}
	out := make([]bool, len(sigs))
	for j, i := range idx {
		out[i] = !bad[j]
	}
	return out
}

// Agreement with crypto/ed25519 holds for signatures produced per RFC 8032
// and for their corruptions (bit flips, S + ℓ, wrong lengths, other
// messages, other keys): on these the cofactored and cofactorless
// equations cannot tell apart.
func TestVerifyAgreesWithCryptoEd25519OnRFC8032Signatures(t *testing.T) {
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
		if !newVerifyKey(pub).verify(msg, sig) {
			t.Fatal("an RFC 8032 signature was rejected")
		}
		check(pub, msg, sig, "valid")
		for bit := 0; bit < len(sig)*8; bit += 5 {
			bad := bytes.Clone(sig)
			bad[bit/8] ^= 1 << (bit % 8)
			check(pub, msg, bad, "corrupted signature")
		}
		for bit := 0; bit < len(pub)*8; bit += 11 {
			badPub := bytes.Clone(pub)
			badPub[bit/8] ^= 1 << (bit % 8)
			check(badPub, msg, sig, "corrupted key")
		}
		if len(msg) > 0 {
			check(pub, msg[1:], sig, "other message")
		}
		s := leInt(sig[32:])
		check(pub, msg, append(bytes.Clone(sig[:32]), leBytes(new(big.Int).Add(s, ell))...), "S + ℓ")
		check(pub, msg, sig[:63], "short signature")
		check(pub, msg, append(bytes.Clone(sig), 0), "long signature")
	}
	notPoint := bytes.Repeat([]byte{0xff}, 32)
	check(notPoint, []byte("m"), make([]byte, 64), "not a point")
	check(ed25519.PublicKey{1, 2, 3}, []byte("m"), make([]byte, 64), "short key")
}

// The small-order subgroup has 8 points and 14 encodings ZIP-215 accepts
// (8 canonical; y + p for y = 0 and y = 1, the ±x forms of x = 0).
// Signatures with S = 0 and every small-order A and R, in every accepted
// encoding (the 196 vectors of ed25519consensus / "Taming the many
// EdDSAs"), are valid under ZIP-215 — the cofactored equation reads
// [8]·O = [8]R + [8][k]A = O — single and batched. crypto/ed25519 rejects
// most of them.
func TestZIP215SmallOrderVectors(t *testing.T) {
	var encs [][]byte
	for _, p := range torsion(t) {
		encs = append(encs, encodings(p)...)
	}
	if len(encs) != 14 {
		t.Fatalf("%d small-order encodings, want 14", len(encs))
	}
	msg := []byte("Zcash")
	var vks []*verifyKey
	var msgs, sigs [][]byte
	stdAccepts := 0
	for _, a := range encs {
		for _, r := range encs {
			sig := append(bytes.Clone(r), make([]byte, 32)...)
			vk := newVerifyKey(a)
			if !vk.verify(msg, sig) {
				t.Fatalf("A=%x R=%x S=0 rejected; ZIP-215 accepts it", a, r)
			}
			if ed25519.Verify(a, msg, sig) {
				stdAccepts++
			}
			vks, msgs, sigs = append(vks, vk), append(msgs, msg), append(sigs, sig)
		}
	}
	if stdAccepts == len(sigs) {
		t.Fatal("crypto/ed25519 accepted every vector: the vectors do not exercise the difference")
	}
	for i, ok := range batchVerdicts(vks, msgs, sigs) {
		if !ok {
			t.Fatalf("vector %d valid alone, rejected in the batch", i)
		}
	}
}

// Edge cases of the rule, one row each: constructed signatures with mixed
// order A or R (torsion added), non-canonical encodings of R, S ≥ ℓ, and
// encodings that are not points. want is the ZIP-215 verdict; batch
// verdicts (each row among valid RFC 8032 signatures) must equal it.
func TestZIP215EdgeCases(t *testing.T) {
	rng := mrand.NewChaCha8([32]byte{15})
	tor := torsion(t)
	sec := newSecret([]byte("edge-cases"))
	aEnc := sec.A.Bytes()
	msg := []byte("event bytes")
	type row struct {
		name string
		pub  []byte
		sig  []byte
		want bool
		std  bool // crypto/ed25519's verdict, to show where the rules differ
	}
	var rows []row
	{
		r := randScalar(rng)
		rEnc := new(edwards25519.Point).ScalarBaseMult(r).Bytes()
		rows = append(rows, row{"valid", aEnc, makeSig(sec.a, r, aEnc, rEnc, msg), true, true})
		sig := makeSig(sec.a, r, aEnc, rEnc, msg)
		s := leInt(sig[32:])
		rows = append(rows, row{"S + ℓ (non-canonical S)", aEnc, append(bytes.Clone(sig[:32]), leBytes(new(big.Int).Add(s, ell))...), false, false})
		top := bytes.Clone(sig)
		top[63] |= 0x80
		rows = append(rows, row{"S with the top bit set", aEnc, top, false, false})
		notPt := bytes.Clone(sig)
		copy(notPt, leBytes(new(big.Int).Sub(fieldP, big.NewInt(2)))) // y = p − 2: not on the curve
		rows = append(rows, row{"R not a point", aEnc, notPt, false, false})
	}
	for i := 1; i < 8; i++ {
		r := randScalar(rng)
		R := new(edwards25519.Point).ScalarBaseMult(r)
		R.Add(R, tor[i])
		rEnc := R.Bytes()
		rows = append(rows, row{"torsion T" + string(rune('0'+i)) + " added to R", aEnc, makeSig(sec.a, r, aEnc, rEnc, msg), true, false})
		mixed := new(edwards25519.Point).Add(sec.A, tor[i]).Bytes()
		r2 := randScalar(rng)
		rEnc2 := new(edwards25519.Point).ScalarBaseMult(r2).Bytes()
		sig := makeSig(sec.a, r2, mixed, rEnc2, msg)
		// [k]T_i vanishes when k ≡ 0 mod ord(T_i): then crypto/ed25519
		// agrees; otherwise it rejects.
		std := ed25519.Verify(mixed, msg, sig)
		rows = append(rows, row{"mixed-order A (torsion T" + string(rune('0'+i)) + ")", mixed, sig, true, std})
	}
	// Non-canonical encodings of R: only small-order points have them
	// (y < 19 or x = 0); R = T with S = k·a satisfies the cofactored
	// equation.
	for _, p := range tor {
		encs := encodings(p)
		for _, e := range encs[1:] {
			rows = append(rows, row{"non-canonical small-order R " + hex.EncodeToString(e[:2]) + "…" + hex.EncodeToString(e[31:]), aEnc,
				makeSig(sec.a, edwards25519.NewScalar(), aEnc, e, msg), true, false})
		}
	}
	// A key whose y is not reduced (y + p) for the identity: small order,
	// valid under ZIP-215 at the verifier level (the keyring refuses it).
	idNonCanon := encodings(tor[0])[1]
	rows = append(rows, row{"non-canonical identity A", idNonCanon, append(edwards25519.NewIdentityPoint().Bytes(), make([]byte, 32)...), true, true})

	var vks []*verifyKey
	var msgs, sigs [][]byte
	var want []bool
	for _, r := range rows {
		vk := newVerifyKey(r.pub)
		if got := vk.verify(msg, r.sig); got != r.want {
			t.Fatalf("%s: verify = %v, ZIP-215 = %v", r.name, got, r.want)
		}
		if got := ed25519.Verify(r.pub, msg, r.sig); got != r.std {
			t.Fatalf("%s: crypto/ed25519 = %v, the table says %v", r.name, got, r.std)
		}
		// Each row inside a batch of valid signatures by another key.
		bk, bm, bs := []*verifyKey{vk}, [][]byte{msg}, [][]byte{r.sig}
		for j := 0; j < 9; j++ {
			pub, priv, _ := ed25519.GenerateKey(rand.Reader)
			m := []byte{byte(j)}
			bk, bm, bs = append(bk, newVerifyKey(pub)), append(bm, m), append(bs, ed25519.Sign(priv, m))
		}
		got := batchVerdicts(bk, bm, bs)
		if got[0] != r.want {
			t.Fatalf("%s: batch verdict %v, single %v", r.name, got[0], r.want)
		}
		for j, ok := range got[1:] {
			if !ok {
				t.Fatalf("%s: valid neighbour %d rejected", r.name, j)
			}
		}
		vks, msgs, sigs, want = append(vks, vk), append(msgs, msg), append(sigs, r.sig), append(want, r.want)
	}
	for i, ok := range batchVerdicts(vks, msgs, sigs) {
		if ok != want[i] {
			t.Fatalf("all rows in one batch: %s verdict %v, want %v", rows[i].name, ok, want[i])
		}
	}
}

// Bisection finds every forgery wherever it sits in a batch, and a batch
// of forgeries only is rejected entirely.
func TestBatchBisectionFindsEveryForgery(t *testing.T) {
	const n = 64
	keys := make([]ed25519.PrivateKey, 4)
	vks := make([]*verifyKey, 4)
	for i := range keys {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		keys[i], vks[i] = priv, newVerifyKey(pub)
	}
	build := func(forged map[int]bool) ([]*verifyKey, [][]byte, [][]byte) {
		var bk []*verifyKey
		var bm, bs [][]byte
		for i := 0; i < n; i++ {
			m := binary.BigEndian.AppendUint32(nil, uint32(i))
			sig := ed25519.Sign(keys[i%4], m)
			if forged[i] {
				sig[40] ^= 1
			}
			bk, bm, bs = append(bk, vks[i%4]), append(bm, m), append(bs, sig)
		}
		return bk, bm, bs
	}
	for _, forged := range []map[int]bool{
		{}, {0: true}, {63: true}, {31: true}, {32: true}, {5: true, 6: true}, {1: true, 40: true, 62: true},
		func() map[int]bool {
			m := map[int]bool{}
			for i := 0; i < n; i++ {
				m[i] = true
			}
			return m
		}(),
	} {
		bk, bm, bs := build(forged)
		for i, ok := range batchVerdicts(bk, bm, bs) {
			if ok == forged[i] {
				t.Fatalf("forged %v: signature %d verdict %v", forged, i, ok)
			}
		}
	}
}

// FuzzBatchMatchesSingle constructs signatures from its seed — valid ones,
// torsion added to R or to A, non-canonical encodings of small-order R,
// S ≥ ℓ, flipped bits, other messages — and holds every batch verdict
// (verifyAll, with bisection) equal to the single verdict. Constructed
// valid kinds must verify: the target would otherwise only ever compare
// rejections.
func FuzzBatchMatchesSingle(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte{7, 7, 7, 7, 7, 7, 7, 7, 0})
	f.Add(bytes.Repeat([]byte{0x35}, 40))
	f.Add([]byte{5, 0x81, 3, 0xfe, 2, 4, 6, 1})
	tor := torsion(f)
	var nonCanon [][]byte // non-canonical encodings of small-order points
	for _, p := range tor {
		nonCanon = append(nonCanon, encodings(p)[1:]...)
	}
	secrets := []secret{newSecret([]byte("k0")), newSecret([]byte("k1")), newSecret([]byte("k2"))}
	f.Fuzz(func(t *testing.T, seed []byte) {
		if len(seed) == 0 || len(seed) > 96 {
			return
		}
		rng := mrand.NewChaCha8(sha512.Sum512_256(seed))
		var vks []*verifyKey
		var msgs, sigs [][]byte
		var mustValid []bool
		for i, b := range seed {
			sec := secrets[int(b>>4)%len(secrets)]
			tt := tor[1+int(b>>1)%7]
			msg := []byte{byte(i), b}
			aEnc := sec.A.Bytes()
			r := randScalar(rng)
			rEnc := new(edwards25519.Point).ScalarBaseMult(r).Bytes()
			var pub, sig []byte
			valid := false
			switch b % 8 {
			case 0: // valid
				pub, sig, valid = aEnc, makeSig(sec.a, r, aEnc, rEnc, msg), true
			case 1: // torsion added to R
				R := new(edwards25519.Point).ScalarBaseMult(r)
				rEnc = R.Add(R, tt).Bytes()
				pub, sig, valid = aEnc, makeSig(sec.a, r, aEnc, rEnc, msg), true
			case 2: // torsion added to A
				pub = new(edwards25519.Point).Add(sec.A, tt).Bytes()
				sig, valid = makeSig(sec.a, r, pub, rEnc, msg), true
			case 3: // a non-canonical encoding of a small-order R
				e := nonCanon[int(b>>3)%len(nonCanon)]
				pub, sig, valid = aEnc, makeSig(sec.a, edwards25519.NewScalar(), aEnc, e, msg), true
			case 4: // S + ℓ
				sig = makeSig(sec.a, r, aEnc, rEnc, msg)
				sig = append(sig[:32], leBytes(new(big.Int).Add(leInt(sig[32:]), ell))...)
				pub = aEnc
			case 5: // a flipped bit
				sig = makeSig(sec.a, r, aEnc, rEnc, msg)
				sig[int(b)%64] ^= 1 << (b % 7)
				pub = aEnc
			case 6: // signed for another message
				pub, sig = aEnc, makeSig(sec.a, r, aEnc, rEnc, append(msg, 0))
			case 7: // torsion in R and A both, for another key's A
				R := new(edwards25519.Point).ScalarBaseMult(r)
				rEnc = R.Add(R, tt).Bytes()
				other := secrets[(int(b>>4)+1)%len(secrets)]
				pub = new(edwards25519.Point).Add(other.A, tt).Bytes()
				sig = makeSig(sec.a, r, pub, rEnc, msg)
			}
			vks, msgs, sigs, mustValid = append(vks, newVerifyKey(pub)), append(msgs, msg), append(sigs, sig), append(mustValid, valid)
		}
		single := make([]bool, len(sigs))
		all := true
		for i := range sigs {
			single[i] = vks[i].verify(msgs[i], sigs[i])
			if mustValid[i] && !single[i] {
				t.Fatalf("constructed-valid signature %d (kind %d) rejected", i, seed[i]%8)
			}
			all = all && single[i]
		}
		got := batchVerdicts(vks, msgs, sigs)
		for i := range got {
			if got[i] != single[i] {
				t.Fatalf("signature %d (kind %d): batch %v, single %v", i, seed[i]%8, got[i], single[i])
			}
		}
		if all {
			checks := make([]*sigCheck, len(sigs))
			for i := range sigs {
				checks[i] = new(sigCheck)
				checks[i].prepare(vks[i], msgs[i], sigs[i])
			}
			if !batchHolds(checks) {
				t.Fatal("every signature valid, the batch equation fails")
			}
		}
	})
}

// FuzzVerifyAcceptsWhatCryptoEd25519Accepts: on any key, message and
// signature, a signature crypto/ed25519 accepts (cofactorless, canonical
// R) is accepted by the ZIP-215 rule, single and batched — the rule
// accepts a superset of what RFC 8032 verifiers accept — and the batch
// verdict equals the single one.
func FuzzVerifyAcceptsWhatCryptoEd25519Accepts(f *testing.F) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg := []byte("event")
	f.Add([]byte(pub), msg, ed25519.Sign(priv, msg))
	f.Add(make([]byte, 32), msg, make([]byte, 64))
	id := edwards25519.NewIdentityPoint().Bytes()
	f.Add(id, msg, append(bytes.Clone(id), make([]byte, 32)...))
	f.Fuzz(func(t *testing.T, pub, msg, sig []byte) {
		vk := newVerifyKey(pub)
		got := vk.verify(msg, sig)
		if len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, msg, sig) && !got {
			t.Fatal("crypto/ed25519 accepts, the ZIP-215 rule rejects")
		}
		other, op, _ := ed25519.GenerateKey(rand.Reader)
		om := []byte("neighbour")
		verdicts := batchVerdicts([]*verifyKey{newVerifyKey(other), vk}, [][]byte{om, msg}, [][]byte{ed25519.Sign(op, om), sig})
		if !verdicts[0] || verdicts[1] != got {
			t.Fatalf("batch verdicts %v, single %v", verdicts, got)
		}
	})
}

func reverse(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[len(b)-1-i] = b[i]
	}
	return out
}

func BenchmarkVerifyRule(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	msg := make([]byte, 200)
	sig := ed25519.Sign(priv, msg)
	vk := newVerifyKey(pub)
	b.Run("zip215-single", func(b *testing.B) {
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
	for _, n := range []int{16, 64, 256} {
		checks := make([]*sigCheck, n)
		for i := range checks {
			checks[i] = new(sigCheck)
			checks[i].prepare(vk, msg, sig)
		}
		b.Run("batch-"+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				if !batchHolds(checks) {
					b.Fatal("rejected")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sig")
		})
	}
}
