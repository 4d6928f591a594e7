package sign

import (
	"crypto/rand"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"math/big"
	mrand "math/rand/v2"
	"testing"
	"time"

	"filippo.io/edwards25519"
	"filippo.io/edwards25519/field"
)

// The multi-scalar multiplication of msm.go is checked against the
// library's VarTimeMultiScalarMult (the oracle), on points of every order
// (prime, small, mixed) and scalars of every size, through both kinds of
// terms batchHolds builds: per-batch tables of width 5 and the wide
// precomputed tables of fixed points, scalar split in 128-bit halves.

// projEqual reports whether the projective p is the library point q.
func projEqual(p projPoint, q *edwards25519.Point) bool {
	x, y, z, _ := q.ExtendedCoordinates()
	var l, r field.Element
	if l.Multiply(&p.x, z).Equal(r.Multiply(x, &p.z)) != 1 {
		return false
	}
	return l.Multiply(&p.y, z).Equal(r.Multiply(y, &p.z)) == 1
}

// msmTerms builds the terms of Σ s_i P_i: per-point tables of width 5 and
// full-length NAFs when wide[i] is false, else a wide table of P_i and
// the two 128-bit halves of s_i.
func msmTerms(scalars []*edwards25519.Scalar, points []*edwards25519.Point, wide []bool) ([]msmTerm, int) {
	var terms []msmTerm
	top := -1
	for i, s := range scalars {
		if wide != nil && wide[i] {
			t := newWideTable(points[i])
			lo, hi := splitScalar(s)
			dl, dh := new([256]int8), new([256]int8)
			top = max(top, naf(dl, lo, wideWidth), naf(dh, hi, wideWidth))
			terms = append(terms, msmTerm{table: t.lo[:], digit: dl}, msmTerm{table: t.hi[:], digit: dh})
			continue
		}
		table := make([]cachedPoint, 1<<(rWidth-2))
		var e extPoint
		oddMultiples(table, e.fromLib(points[i]))
		b := s.Bytes()
		var limbs [4]uint64
		for j := range limbs {
			limbs[j] = binary.LittleEndian.Uint64(b[8*j:])
		}
		dg := new([256]int8)
		top = max(top, naf(dg, limbs, rWidth))
		terms = append(terms, msmTerm{table: table, digit: dg})
	}
	return terms, top
}

func checkMSM(t testing.TB, scalars []*edwards25519.Scalar, points []*edwards25519.Point, wide []bool) {
	t.Helper()
	want := new(edwards25519.Point).VarTimeMultiScalarMult(scalars, points)
	terms, top := msmTerms(scalars, points, wide)
	got := msmEval(terms, top)
	if !projEqual(got, want) {
		t.Fatalf("MSM of %d terms (wide %v) differs from the library's", len(scalars), wide)
	}
	if isSmallOrderProj(got) != isSmallOrder(want) {
		t.Fatalf("small-order verdicts differ")
	}
}

func shortScalar(rng *mrand.ChaCha8) *edwards25519.Scalar {
	var b [32]byte
	rng.Read(b[:16])
	s, err := edwards25519.NewScalar().SetCanonicalBytes(b[:])
	if err != nil {
		panic(err)
	}
	return s
}

func TestMSMMatchesTheLibrary(t *testing.T) {
	rng := mrand.NewChaCha8([32]byte{15})
	tor := torsion(t)
	for trial := 0; trial < 60; trial++ {
		n := 1 + trial%9
		if trial%10 == 9 {
			n = 70 // a batch's size
		}
		scalars := make([]*edwards25519.Scalar, n)
		points := make([]*edwards25519.Point, n)
		wide := make([]bool, n)
		for i := range points {
			switch rng.Uint64() % 4 {
			case 0:
				scalars[i] = shortScalar(rng)
			case 1:
				scalars[i] = edwards25519.NewScalar() // zero
			default:
				scalars[i] = randScalar(rng)
			}
			p := new(edwards25519.Point).ScalarBaseMult(randScalar(rng))
			switch rng.Uint64() % 4 {
			case 0:
				p = tor[rng.Uint64()%8] // small order (the identity included)
			case 1:
				p.Add(p, tor[1+rng.Uint64()%7]) // mixed order
			}
			points[i] = p
			wide[i] = rng.Uint64()%3 == 0
		}
		checkMSM(t, scalars, points, nil)
		checkMSM(t, scalars, points, wide)
	}
	// The extremes of a scalar: ℓ − 1 and 2^128 ± 1.
	lm1 := scalarFromBig(new(big.Int).Sub(ell, big.NewInt(1)))
	b := new(edwards25519.Point).ScalarBaseMult(randScalar(rng))
	var e [32]byte
	e[16] = 1
	p128, _ := edwards25519.NewScalar().SetCanonicalBytes(e[:])
	var m [32]byte
	for i := range m[:16] {
		m[i] = 0xff
	}
	m128, _ := edwards25519.NewScalar().SetCanonicalBytes(m[:])
	for _, s := range []*edwards25519.Scalar{lm1, p128, m128} {
		checkMSM(t, []*edwards25519.Scalar{s, s}, []*edwards25519.Point{b, tor[3]}, []bool{true, false})
		checkMSM(t, []*edwards25519.Scalar{s}, []*edwards25519.Point{b}, nil)
	}
}

// curveD2 is 2d for the curve's d (RFC 8032 §5.1).
func TestCurveConstant(t *testing.T) {
	d, _ := hex.DecodeString("a3785913ca4deb75abd841414d0a700098e879777940c78c73fe6f2bee6c0352")
	want, err := new(field.Element).SetBytes(d)
	if err != nil {
		t.Fatal(err)
	}
	want.Add(want, want)
	if curveD2.Equal(want) != 1 {
		t.Fatal("curveD2 is not 2d")
	}
}

// batchHoldsLibrary is batchHolds as it was before msm.go: the same
// equation through the library's VarTimeMultiScalarMult. It is the oracle
// of TestBatchHoldsMatchesTheLibraryEquation, with the same z_i.
func batchHoldsLibrary(cs []*sigCheck, zb []byte) bool {
	scalars := []*edwards25519.Scalar{edwards25519.NewScalar()}
	points := []*edwards25519.Point{edwards25519.NewGeneratorPoint()}
	coeff := map[*verifyKey]*edwards25519.Scalar{}
	var order []*verifyKey
	var buf [32]byte
	for i, c := range cs {
		copy(buf[:16], zb[16*i:16*i+16])
		z, _ := edwards25519.NewScalar().SetCanonicalBytes(buf[:])
		scalars[0].MultiplyAdd(z, &c.s, scalars[0])
		scalars = append(scalars, z)
		points = append(points, &c.r)
		zk := edwards25519.NewScalar().Multiply(z, &c.k)
		if coeff[c.vk] == nil {
			coeff[c.vk] = edwards25519.NewScalar()
			order = append(order, c.vk)
		}
		coeff[c.vk].Add(coeff[c.vk], zk)
	}
	scalars[0].Negate(scalars[0])
	for _, vk := range order {
		scalars = append(scalars, coeff[vk])
		points = append(points, vk.a)
	}
	return isSmallOrder(new(edwards25519.Point).VarTimeMultiScalarMult(scalars, points))
}

// batchHoldsWith is batchHolds with the given z_i instead of fresh ones.
func batchHoldsWith(cs []*sigCheck, zb []byte) bool {
	batchRandom = func(b []byte) error { copy(b, zb); return nil }
	defer func() { batchRandom = readRandom }()
	return batchHolds(cs)
}

// batchHolds and the library's equation agree on batches of valid
// signatures, forgeries and ZIP-215 edge cases (torsion in R or A), with
// the same random coefficients.
func TestBatchHoldsMatchesTheLibraryEquation(t *testing.T) {
	rng := mrand.NewChaCha8([32]byte{16})
	tor := torsion(t)
	var vks []*verifyKey
	var secs []secret
	for i := 0; i < 3; i++ {
		seed := make([]byte, 32)
		seed[0] = byte(70 + i)
		s := newSecret(seed)
		if i == 2 {
			s.A = new(edwards25519.Point).Add(s.A, tor[5]) // a mixed-order key
		}
		secs = append(secs, s)
		vks = append(vks, newVerifyKey(s.A.Bytes()))
	}
	held, failed := 0, 0
	for trial := 0; trial < 40; trial++ {
		n := 2 + trial%70
		cs := make([]*sigCheck, n)
		for i := range cs {
			k := rng.Uint64() % 3
			msg := []byte{byte(trial), byte(i)}
			r := randScalar(rng)
			R := new(edwards25519.Point).ScalarBaseMult(r)
			if rng.Uint64()%5 == 0 {
				R.Add(R, tor[rng.Uint64()%8])
			}
			sig := makeSig(secs[k].a, r, secs[k].A.Bytes(), R.Bytes(), msg)
			if trial%4 == 1 && i == n/2 {
				sig[40] ^= 1 // a forgery
			}
			cs[i] = new(sigCheck)
			cs[i].prepare(vks[k], msg, sig)
			if !cs[i].ok {
				t.Fatalf("signature %d did not prepare", i)
			}
		}
		zb := make([]byte, 16*n)
		rng.Read(zb)
		want := batchHoldsLibrary(cs, zb)
		if got := batchHoldsWith(cs, zb); got != want {
			t.Fatalf("trial %d: batchHolds %v, the library's equation %v", trial, got, want)
		}
		if want {
			held++
		} else {
			failed++
		}
	}
	if held == 0 || failed == 0 {
		t.Fatalf("%d batches held, %d failed: the test checks nothing on one side", held, failed)
	}
}

// FuzzMSMMatchesTheLibrary builds up to 8 terms from the input — scalars
// full or 128-bit, points of prime, small or mixed order, each through a
// per-batch or a wide table — and holds the sum equal to the library's.
func FuzzMSMMatchesTheLibrary(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{3, 0xff, 0x00, 0x81})
	f.Add([]byte{7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	tor := torsion(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		n := 1 + int(in[0]%8)
		scalars := make([]*edwards25519.Scalar, n)
		points := make([]*edwards25519.Point, n)
		wide := make([]bool, n)
		for i := range points {
			flags := byte(0)
			if 1+i < len(in) {
				flags = in[1+i]
			}
			h := sha512.Sum512(append([]byte{byte(i)}, in...))
			s, _ := edwards25519.NewScalar().SetUniformBytes(h[:])
			if flags&1 != 0 {
				var b [32]byte
				copy(b[:16], h[:16])
				s, _ = edwards25519.NewScalar().SetCanonicalBytes(b[:])
			}
			scalars[i] = s
			h2 := sha512.Sum512(h[:])
			x, _ := edwards25519.NewScalar().SetUniformBytes(h2[:])
			p := new(edwards25519.Point).ScalarBaseMult(x)
			switch (flags >> 1) & 3 {
			case 1:
				p = tor[flags>>4&7]
			case 2:
				p.Add(p, tor[flags>>4&7])
			}
			points[i] = p
			wide[i] = flags&0x80 != 0
		}
		checkMSM(t, scalars, points, wide)
	})
}

func BenchmarkBatchEquation(b *testing.B) {
	rng := mrand.NewChaCha8([32]byte{17})
	s := newSecret(make([]byte, 32))
	vk := newVerifyKey(s.A.Bytes())
	cs := make([]*sigCheck, BatchSize)
	for i := range cs {
		r := randScalar(rng)
		msg := []byte{byte(i)}
		cs[i] = new(sigCheck)
		cs[i].prepare(vk, msg, makeSig(s.a, r, s.A.Bytes(), new(edwards25519.Point).ScalarBaseMult(r).Bytes(), msg))
	}
	zb := make([]byte, 16*len(cs))
	if _, err := rand.Read(zb); err != nil {
		b.Fatal(err)
	}
	// The two alternate call by call, so load hits both alike; the
	// ratio is the figure to read on a shared machine.
	b.ReportAllocs()
	var own, lib time.Duration
	for b.Loop() {
		t0 := time.Now()
		if !batchHolds(cs) {
			b.Fatal("rejected")
		}
		t1 := time.Now()
		if !batchHoldsLibrary(cs, zb) {
			b.Fatal("rejected")
		}
		own, lib = own+t1.Sub(t0), lib+time.Since(t1)
	}
	n := float64(b.N * len(cs))
	b.ReportMetric(float64(own.Nanoseconds())/n, "msm.go-ns/sig")
	b.ReportMetric(float64(lib.Nanoseconds())/n, "library-ns/sig")
	b.ReportMetric(float64(own)/float64(lib), "msm.go/library")
}
