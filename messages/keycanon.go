package messages

import (
	"errors"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// ErrNonCanonicalKey marks an event whose row key holds a value in other
// than its one canonical encoding: an integer or length head longer than
// its shortest form, a float that a shorter float encodes exactly, a NaN
// other than 0xf97e00, a float naming an integral value that a CBOR
// integer encodes, or a nested map whose keys are out of order. It
// matches ErrMalformed.
//
// A row key is the row's identity (SSP/1 §13: every rule is keyed on
// (schema, table, row_key, column)), and the store keys rows by the key's
// bytes. Were two encodings of one value both accepted, a peer could
// address one logical row as many stored rows that Get and Delete of the
// value cannot reach. So each value has exactly one accepted encoding, for
// the writer (EncodeEvent) and the reader (DecodeEvent) alike, as tags
// already have none.
var ErrNonCanonicalKey = errors.New("messages: row key value not in its canonical encoding")

// float64 bounds of the integers a CBOR head encodes: [-2^64, 2^64).
const (
	minCBORInt = -18446744073709551616.0
	maxCBORInt = 18446744073709551616.0
)

// checkRowKey reports whether every value of a row key is in its one
// canonical encoding (see ErrNonCanonicalKey). The values are already
// well-formed items the strict decoder accepts.
func checkRowKey(key Columns) error {
	for name, v := range key {
		rest, err := canonicalItem(v, 0)
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("trailing bytes")
		}
		if err != nil {
			return fmt.Errorf("column %q: %w", name, err)
		}
	}
	return nil
}

// canonicalItem checks one data item at the front of b and returns what
// follows it.
func canonicalItem(b []byte, depth int) ([]byte, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("nested deeper than %d", maxNesting)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("truncated")
	}
	major := b[0] >> 5
	if major == 7 {
		return canonicalSimple(b)
	}
	n, rest, err := canonicalHead(b)
	if err != nil {
		return nil, err
	}
	switch major {
	case 0, 1:
		return rest, nil
	case 2, 3:
		if n > uint64(len(rest)) {
			return nil, fmt.Errorf("truncated")
		}
		return rest[n:], nil
	case 4:
		for i := uint64(0); i < n; i++ {
			if rest, err = canonicalItem(rest, depth+1); err != nil {
				return nil, err
			}
		}
		return rest, nil
	case 5:
		var prev []byte
		for i := uint64(0); i < n; i++ {
			start := rest
			if rest, err = canonicalItem(rest, depth+1); err != nil {
				return nil, err
			}
			k := start[:len(start)-len(rest)]
			// RFC 8949 §4.2.1: map keys sorted bytewise by their encodings.
			if prev != nil && string(prev) >= string(k) {
				return nil, fmt.Errorf("map keys out of order")
			}
			prev = k
			if rest, err = canonicalItem(rest, depth+1); err != nil {
				return nil, err
			}
		}
		return rest, nil
	}
	return nil, fmt.Errorf("major type %d", major)
}

// canonicalHead reads a head whose argument must be in its shortest form
// and returns the argument and what follows the head.
func canonicalHead(b []byte) (uint64, []byte, error) {
	n, rest, ok := shortestHead(b)
	if !ok {
		return 0, nil, fmt.Errorf("head not in its shortest form, or truncated")
	}
	return n, rest, nil
}

// shortestHead reads the head at b[0] (b non-empty) whose argument must be
// in its shortest form: the argument, what follows the head, and whether
// it was well formed. Shared by the event reader's fast path (canonReader)
// and the key checks, so both accept exactly the same heads.
func shortestHead(b []byte) (uint64, []byte, bool) {
	info := b[0] & 0x1f
	if info < 24 {
		return uint64(info), b[1:], true
	}
	var size int
	var min uint64
	switch info {
	case 24:
		size, min = 1, 24
	case 25:
		size, min = 2, 0x100
	case 26:
		size, min = 4, 0x10000
	case 27:
		size, min = 8, 0x100000000
	default:
		return 0, nil, false
	}
	if len(b) < 1+size {
		return 0, nil, false
	}
	var n uint64
	for _, c := range b[1 : 1+size] {
		n = n<<8 | uint64(c)
	}
	if n < min {
		return 0, nil, false
	}
	return n, b[1+size:], true
}

// canonicalSimple checks a major-7 item: simple values have one encoding;
// floats must be in their shortest exact form and must not name a value a
// CBOR integer encodes.
func canonicalSimple(b []byte) ([]byte, error) {
	var f float64
	var rest []byte
	switch b[0] {
	case 0xf9:
		if len(b) < 3 {
			return nil, fmt.Errorf("truncated")
		}
		h := float16.Frombits(uint16(b[1])<<8 | uint16(b[2]))
		if h.IsNaN() && h.Bits() != 0x7e00 {
			return nil, fmt.Errorf("NaN not encoded as 0xf97e00")
		}
		f, rest = float64(h.Float32()), b[3:]
	case 0xfa:
		if len(b) < 5 {
			return nil, fmt.Errorf("truncated")
		}
		f32 := math.Float32frombits(uint32(b[1])<<24 | uint32(b[2])<<16 | uint32(b[3])<<8 | uint32(b[4]))
		if f32 != f32 || float16.Fromfloat32(f32).Float32() == f32 {
			return nil, fmt.Errorf("float32 that a float16 encodes exactly")
		}
		f, rest = float64(f32), b[5:]
	case 0xfb:
		if len(b) < 9 {
			return nil, fmt.Errorf("truncated")
		}
		var bits uint64
		for _, c := range b[1:9] {
			bits = bits<<8 | uint64(c)
		}
		f = math.Float64frombits(bits)
		if f != f || float64(float32(f)) == f {
			return nil, fmt.Errorf("float64 that a shorter float encodes exactly")
		}
		rest = b[9:]
	case 0xf8:
		if len(b) < 2 {
			return nil, fmt.Errorf("truncated")
		}
		return b[2:], nil
	default:
		if b[0]&0x1f >= 24 {
			return nil, fmt.Errorf("simple value 0x%02x", b[0])
		}
		return b[1:], nil
	}
	if !math.IsInf(f, 0) && f == math.Trunc(f) && f >= minCBORInt && f < maxCBORInt {
		return nil, fmt.Errorf("float %v names an integer", f)
	}
	return rest, nil
}

// CheckKeyValue reports, as an error matching ErrNonCanonicalKey, whether
// v is not in the one encoding a row key value may have (see
// ErrNonCanonicalKey). Local writes check encoded key values they are
// handed with it, so they name only rows a peer would accept.
func CheckKeyValue(v Value) error {
	if err := checkRowKey(Columns{"": v}); err != nil {
		return fmt.Errorf("%w: %w", ErrNonCanonicalKey, err)
	}
	return nil
}
