package sign

import (
	"encoding/binary"
	"sync"

	"filippo.io/edwards25519"
	"filippo.io/edwards25519/field"
)

// The batch equation's multi-scalar multiplication, written here instead
// of calling edwards25519's VarTimeMultiScalarMult, which allocates a
// lookup table per point on every call (~115 KB per batch of 64, 1.8 KB
// per signature), rebuilds the tables of the base point and of the
// signing keys for every batch (the same few points each time), and runs
// 256 doublings although every R coefficient z_i has 128 bits. Here the
// tables of B and of each key are built once, wide (64 odd multiples),
// for the point and for [2^128] times it, so every scalar of the
// equation is split into 128-bit halves and the loop doubles ~129 times;
// the per-batch tables come from a pool. BenchmarkBatchEquation, the two
// alternating call by call: 0.71–0.81 of the library's time per batch of
// 64 (load 10–12), no allocation. Variable time is fine: every input is
// public. The formulas are the library's (extended twisted Edwards
// coordinates, Hisil–Wong–Carter–Dawson 2008) on its exported field
// arithmetic; TestMSMMatchesTheLibrary, FuzzMSMMatchesTheLibrary and
// TestBatchHoldsMatchesTheLibraryEquation hold the results equal to the
// library's, and the ZIP-215 tests hold the verdicts.

// extPoint is a point in extended coordinates (X:Y:Z:T), x = X/Z,
// y = Y/Z, xy = T/Z.
type extPoint struct{ x, y, z, t field.Element }

// projPoint is a point in projective coordinates (X:Y:Z).
type projPoint struct{ x, y, z field.Element }

// completedPoint is the output of an addition or doubling, ((X:Z), (Y:T)).
type completedPoint struct{ x, y, z, t field.Element }

// cachedPoint is a point prepared as the second operand of additions:
// (Y+X, Y−X, Z, 2dT).
type cachedPoint struct{ yPlusX, yMinusX, z, t2d field.Element }

// curveD2 is 2d, d = −121665/121666 the curve constant.
var curveD2 = func() field.Element {
	var num, den, d field.Element
	one := new(field.Element).One()
	num.Mult32(one, 121665)
	den.Mult32(one, 121666)
	den.Invert(&den)
	d.Multiply(&num, &den)
	d.Negate(&d)
	d.Add(&d, &d)
	return d
}()

func (v *extPoint) fromLib(p *edwards25519.Point) *extPoint {
	x, y, z, t := p.ExtendedCoordinates()
	v.x.Set(x)
	v.y.Set(y)
	v.z.Set(z)
	v.t.Set(t)
	return v
}

func (v *extPoint) fromCompleted(p *completedPoint) *extPoint {
	v.x.Multiply(&p.x, &p.t)
	v.y.Multiply(&p.y, &p.z)
	v.z.Multiply(&p.z, &p.t)
	v.t.Multiply(&p.x, &p.y)
	return v
}

func (v *projPoint) fromCompleted(p *completedPoint) *projPoint {
	v.x.Multiply(&p.x, &p.t)
	v.y.Multiply(&p.y, &p.z)
	v.z.Multiply(&p.z, &p.t)
	return v
}

func (v *projPoint) fromExt(p *extPoint) *projPoint {
	v.x.Set(&p.x)
	v.y.Set(&p.y)
	v.z.Set(&p.z)
	return v
}

func (v *cachedPoint) fromExt(p *extPoint) *cachedPoint {
	v.yPlusX.Add(&p.y, &p.x)
	v.yMinusX.Subtract(&p.y, &p.x)
	v.z.Set(&p.z)
	v.t2d.Multiply(&p.t, &curveD2)
	return v
}

func (v *completedPoint) add(p *extPoint, q *cachedPoint) *completedPoint {
	var yPlusX, yMinusX, pp, mm, tt2d, zz2 field.Element
	yPlusX.Add(&p.y, &p.x)
	yMinusX.Subtract(&p.y, &p.x)
	pp.Multiply(&yPlusX, &q.yPlusX)
	mm.Multiply(&yMinusX, &q.yMinusX)
	tt2d.Multiply(&p.t, &q.t2d)
	zz2.Multiply(&p.z, &q.z)
	zz2.Add(&zz2, &zz2)
	v.x.Subtract(&pp, &mm)
	v.y.Add(&pp, &mm)
	v.z.Add(&zz2, &tt2d)
	v.t.Subtract(&zz2, &tt2d)
	return v
}

func (v *completedPoint) sub(p *extPoint, q *cachedPoint) *completedPoint {
	var yPlusX, yMinusX, pp, mm, tt2d, zz2 field.Element
	yPlusX.Add(&p.y, &p.x)
	yMinusX.Subtract(&p.y, &p.x)
	pp.Multiply(&yPlusX, &q.yMinusX)
	mm.Multiply(&yMinusX, &q.yPlusX)
	tt2d.Multiply(&p.t, &q.t2d)
	zz2.Multiply(&p.z, &q.z)
	zz2.Add(&zz2, &zz2)
	v.x.Subtract(&pp, &mm)
	v.y.Add(&pp, &mm)
	v.z.Subtract(&zz2, &tt2d)
	v.t.Add(&zz2, &tt2d)
	return v
}

func (v *completedPoint) double(p *projPoint) *completedPoint {
	var xx, yy, zz2, xPlusYSq field.Element
	xx.Square(&p.x)
	yy.Square(&p.y)
	zz2.Square(&p.z)
	zz2.Add(&zz2, &zz2)
	xPlusYSq.Add(&p.x, &p.y)
	xPlusYSq.Square(&xPlusYSq)
	v.y.Add(&yy, &xx)
	v.z.Subtract(&yy, &xx)
	v.x.Subtract(&xPlusYSq, &v.y)
	v.t.Subtract(&zz2, &v.z)
	return v
}

// oddMultiples fills dst with p, 3p, 5p, …, (2·len(dst)−1)p.
func oddMultiples(dst []cachedPoint, p *extPoint) {
	dst[0].fromExt(p)
	var pp projPoint
	var c completedPoint
	var p2, q extPoint
	p2.fromCompleted(c.double(pp.fromExt(p)))
	for i := 0; i+1 < len(dst); i++ {
		dst[i+1].fromExt(q.fromCompleted(c.add(&p2, &dst[i])))
	}
}

// naf writes the width-w non-adjacent form of the 256-bit little-endian
// number limbs (below 2^255) into out and returns the position of its
// highest non-zero digit (−1 for zero). Adapted from edwards25519's
// Scalar.nonAdjacentForm (itself from curve25519-dalek).
func naf(out *[256]int8, limbs [4]uint64, w uint) int {
	*out = [256]int8{}
	var digits [5]uint64
	copy(digits[:4], limbs[:])
	width := uint64(1) << w
	mask := width - 1
	top := -1
	pos := uint(0)
	carry := uint64(0)
	short := limbs[2]|limbs[3] == 0 // a 128-bit number: no digit past 128
	for pos < 256 {
		if short && pos > 128 && carry == 0 {
			break
		}
		idx, bit := pos/64, pos%64
		var buf uint64
		if bit < 64-w {
			buf = digits[idx] >> bit
		} else {
			buf = digits[idx]>>bit | digits[idx+1]<<(64-bit)
		}
		window := carry + buf&mask
		if window&1 == 0 {
			pos++
			continue
		}
		if window < width/2 {
			carry = 0
			out[pos] = int8(window)
		} else {
			carry = 1
			out[pos] = int8(window) - int8(width)
		}
		top = int(pos)
		pos += w
	}
	return top
}

// msmTerm is one point of a multi-scalar multiplication: its odd
// multiples and the NAF digits of its scalar.
type msmTerm struct {
	table []cachedPoint
	digit *[256]int8
}

// msmEval returns Σ digits_j · P_j (in projective coordinates), the
// digits of each term being a NAF of the width its table was built for,
// top the highest position with a non-zero digit.
func msmEval(terms []msmTerm, top int) projPoint {
	var acc projPoint
	acc.x.Zero()
	acc.y.One()
	acc.z.One()
	var c completedPoint
	var e extPoint
	for i := top; i >= 0; i-- {
		c.double(&acc)
		for _, t := range terms {
			d := t.digit[i]
			if d == 0 {
				continue
			}
			e.fromCompleted(&c)
			if d > 0 {
				c.add(&e, &t.table[d/2])
			} else {
				c.sub(&e, &t.table[(-d)/2])
			}
		}
		acc.fromCompleted(&c)
	}
	return acc
}

// isSmallOrderProj reports whether [8]p is the identity (0:1:1).
func isSmallOrderProj(p projPoint) bool {
	var c completedPoint
	for i := 0; i < 3; i++ {
		p.fromCompleted(c.double(&p))
	}
	return p.x.Equal(new(field.Element).Zero()) == 1 && p.y.Equal(&p.z) == 1
}

// wideWidth is the NAF width of the fixed points' tables (B, keys):
// 64 odd multiples, built once.
const wideWidth = 8

// wideTable is a fixed point's precomputation: odd multiples of P and
// of [2^128]P, so a full scalar c = lo + 2^128·hi costs two 128-bit terms.
type wideTable struct {
	lo, hi [1 << (wideWidth - 2)]cachedPoint
}

func newWideTable(p *edwards25519.Point) *wideTable {
	t := new(wideTable)
	var e extPoint
	oddMultiples(t.lo[:], e.fromLib(p))
	// [2^128]P by 128 doublings.
	var pp projPoint
	var c completedPoint
	pp.fromExt(&e)
	for i := 0; i < 127; i++ {
		pp.fromCompleted(c.double(&pp))
	}
	e.fromCompleted(c.double(&pp))
	oddMultiples(t.hi[:], &e)
	return t
}

var (
	baseTableOnce sync.Once
	baseTable     *wideTable
)

func basepointWide() *wideTable {
	baseTableOnce.Do(func() { baseTable = newWideTable(edwards25519.NewGeneratorPoint()) })
	return baseTable
}

// wide returns vk's precomputed tables (built on first use: a key that
// only ever verifies singly never pays for them).
func (vk *verifyKey) wide() *wideTable {
	vk.wideOnce.Do(func() { vk.wideTab = newWideTable(vk.a) })
	return vk.wideTab
}

// splitScalar returns s's canonical value as two 128-bit halves, lo and
// hi, s = lo + 2^128·hi, each as the limbs naf reads.
func splitScalar(s *edwards25519.Scalar) (lo, hi [4]uint64) {
	b := s.Bytes()
	lo[0], lo[1] = binary.LittleEndian.Uint64(b[0:]), binary.LittleEndian.Uint64(b[8:])
	hi[0], hi[1] = binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])
	return lo, hi
}

// rWidth is the NAF width of the per-batch tables of the R points: 8 odd
// multiples, as the library builds (wider tables cost more to build than
// their fewer additions save for a 128-bit scalar).
const rWidth = 5

// batchScratch is the per-call memory of batchHolds, pooled: the tables
// of the R points and the digits of every scalar.
type batchScratch struct {
	z       []byte // the random 128-bit coefficients
	rTables [][1 << (rWidth - 2)]cachedPoint
	digits  [][256]int8
	terms   []msmTerm
}

var batchScratchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// coefficients returns room for n random 128-bit coefficients.
func (s *batchScratch) coefficients(n int) []byte {
	if cap(s.z) < 16*n {
		s.z = make([]byte, 16*n)
	}
	return s.z[:16*n]
}

// reset sizes s for n signatures by keys distinct keys.
func (s *batchScratch) reset(n, keys int) {
	if cap(s.rTables) < n {
		s.rTables = make([][1 << (rWidth - 2)]cachedPoint, n)
	}
	s.rTables = s.rTables[:n]
	m := n + 2 + 2*keys // R terms, B and [2^128]B, each key and [2^128] times it
	if cap(s.digits) < m {
		s.digits = make([][256]int8, m)
		s.terms = make([]msmTerm, 0, m)
	}
	s.digits = s.digits[:m]
	s.terms = s.terms[:0]
}

// maxScratchSigs bounds the batches whose scratch goes back to the pool,
// so one huge batch does not pin its tables.
const maxScratchSigs = 1024
