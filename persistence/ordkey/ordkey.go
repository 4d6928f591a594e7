// Package ordkey is the order-preserving encoding of column values that
// the stores key rows and index entries by: comparing two encodings
// bytewise compares the values in their natural order, so a range of a
// bbolt bucket (or of a sorted slice) is a range of values.
//
// The order is total over every well-formed CBOR data item, by kind
// first, then within the kind:
//
//	absent (an unmaterialized cell)
//	< null
//	< false < true
//	< numbers: integers and floats together, numerically (negative
//	  integers below positive ones; -Inf lowest, +Inf then NaN highest;
//	  -0.0 just below 0.0; an integer equal to a float sorts just
//	  after it)
//	< text strings, bytewise (UTF-8 code point order)
//	< byte strings, bytewise
//	< everything else (arrays, maps, tags, undefined, other simple values,
//	  indefinite-length strings), bytewise by their CBOR encoding
//
// A value's own CBOR encoding is not ordered this way (RFC 8949 §4.2.1
// sorts text by length first, negative integers after positive ones);
// signed events keep it (SSP/1 §13): only storage keys use this one.
//
// Each encoded value is self-delimiting, so a tuple of values (a
// composite key, an index's columns) is the concatenation of its values'
// encodings and compares lexicographically, column by column.
package ordkey

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/x448/float16"

	"github.com/syncmesh/syncmesh/messages"
)

// Kind bytes: the first byte of an encoded value.
const (
	KindAbsent byte = 0x01
	KindNull   byte = 0x02
	KindFalse  byte = 0x03
	KindTrue   byte = 0x04
	KindNumber byte = 0x10
	KindText   byte = 0x20
	KindBytes  byte = 0x30
	KindOther  byte = 0x40
)

// Number tie bytes: after the 8 ordered float64 bytes, what kind of
// number it is relative to that float64 (an integer's float64 image may
// be rounded).
const (
	tieIntBelow byte = 0 // an integer below its rounded float64
	tieFloat    byte = 1 // a float
	tieIntEqual byte = 2 // an integer equal to its float64
	tieIntAbove byte = 3 // an integer above its rounded float64
)

// ErrMalformed is returned by Skip for bytes no encoder wrote.
var ErrMalformed = errors.New("ordkey: malformed encoding")

// AppendAbsent appends the encoding of an absent value (an unmaterialized
// cell, a missing key column): lowest of all.
func AppendAbsent(dst []byte) []byte { return append(dst, KindAbsent) }

// AppendValue appends the order-preserving encoding of v, one CBOR data
// item (see the package comment for the order). An empty v encodes as
// absent.
func AppendValue(dst []byte, v messages.Value) []byte {
	if len(v) == 0 {
		return AppendAbsent(dst)
	}
	major, info := v[0]>>5, v[0]&0x1f
	switch major {
	case 0, 1:
		n, ok := head(v)
		if !ok {
			break
		}
		return appendInt(dst, major == 1, n)
	case 2, 3:
		if info == 31 {
			break // indefinite length: not a plain string
		}
		n, ok := head(v)
		hl := headLen(info)
		if !ok || uint64(len(v)-hl) != n {
			break
		}
		kind := KindText
		if major == 2 {
			kind = KindBytes
		}
		return Terminate(AppendEscaped(append(dst, kind), v[hl:]))
	case 7:
		switch {
		case v[0] == 0xf4:
			return append(dst, KindFalse)
		case v[0] == 0xf5:
			return append(dst, KindTrue)
		case v[0] == 0xf6:
			return append(dst, KindNull)
		case v[0] == 0xf9 && len(v) == 3:
			return appendFloat(dst, float64(float16.Frombits(binary.BigEndian.Uint16(v[1:])).Float32()))
		case v[0] == 0xfa && len(v) == 5:
			return appendFloat(dst, float64(math.Float32frombits(binary.BigEndian.Uint32(v[1:]))))
		case v[0] == 0xfb && len(v) == 9:
			return appendFloat(dst, math.Float64frombits(binary.BigEndian.Uint64(v[1:])))
		}
	}
	return Terminate(AppendEscaped(append(dst, KindOther), v))
}

// AppendPrefix appends the encoding of the text (or byte string, when
// bytes is set) prefix p without its terminator: every text (bytes)
// value starting with p, and only those, encodes to something starting
// with it.
func AppendPrefix(dst []byte, p []byte, bytes bool) []byte {
	kind := KindText
	if bytes {
		kind = KindBytes
	}
	return AppendEscaped(append(dst, kind), p)
}

// headLen is the length of a CBOR head with additional information info.
func headLen(info byte) int {
	switch {
	case info < 24:
		return 1
	case info == 24:
		return 2
	case info == 25:
		return 3
	case info == 26:
		return 5
	}
	return 9
}

// head returns the argument of v's head (an integer's value, a string's
// length).
func head(v []byte) (uint64, bool) {
	info := v[0] & 0x1f
	hl := headLen(info)
	if info > 27 || len(v) < hl {
		return 0, false
	}
	switch hl {
	case 1:
		return uint64(info), true
	case 2:
		return uint64(v[1]), true
	case 3:
		return uint64(binary.BigEndian.Uint16(v[1:])), true
	case 5:
		return uint64(binary.BigEndian.Uint32(v[1:])), true
	}
	return binary.BigEndian.Uint64(v[1:]), true
}

// floatBits maps f to 8 bytes whose unsigned order is f's numeric order;
// every NaN is the canonical one, above +Inf.
func floatBits(f float64) uint64 {
	if f != f {
		return 0x7ff8000000000000 | 1<<63
	}
	b := math.Float64bits(f)
	if b>>63 == 0 {
		return b | 1<<63
	}
	return ^b
}

func appendFloat(dst []byte, f float64) []byte {
	dst = append(dst, KindNumber)
	dst = binary.BigEndian.AppendUint64(dst, floatBits(f))
	return append(dst, tieFloat)
}

// two64 is 2^64 as a float64.
const two64 = 18446744073709551616.0

// appendInt appends the integer n (neg: -1-n, CBOR's major type 1).
func appendInt(dst []byte, neg bool, n uint64) []byte {
	var f float64
	tie := tieIntEqual
	if !neg {
		f = float64(n)
		if n > 1<<53 {
			// f is integral; compare it with n exactly.
			switch {
			case f >= two64:
				tie = tieIntBelow
			case uint64(f) > n:
				tie = tieIntBelow
			case uint64(f) < n:
				tie = tieIntAbove
			}
		}
	} else {
		m := float64(n) + 1 // |value| rounded
		f = -m
		if n >= 1<<53 {
			// |value| = n+1; value above f when |value| < m.
			switch {
			case m >= two64:
				if n != math.MaxUint64 {
					tie = tieIntAbove
				}
			case uint64(m) > n+1:
				tie = tieIntAbove
			case uint64(m) < n+1:
				tie = tieIntBelow
			}
		}
	}
	dst = append(dst, KindNumber)
	dst = binary.BigEndian.AppendUint64(dst, floatBits(f))
	dst = append(dst, tie)
	if neg {
		return binary.BigEndian.AppendUint64(append(dst, 0), ^n)
	}
	return binary.BigEndian.AppendUint64(append(dst, 1), n)
}

// AppendEscaped appends p with every 0x00 byte written as 0x00 0xFF, so
// that the terminator 0x00 0x01 sorts below any continuation.
func AppendEscaped(dst, p []byte) []byte {
	for _, c := range p {
		if c == 0 {
			dst = append(dst, 0, 0xff)
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// Terminate appends the terminator of an escaped string.
func Terminate(dst []byte) []byte { return append(dst, 0, 1) }

// Skip returns what follows the one encoded value at the front of b.
func Skip(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, ErrMalformed
	}
	switch b[0] {
	case KindAbsent, KindNull, KindFalse, KindTrue:
		return b[1:], nil
	case KindNumber:
		if len(b) < 10 {
			return nil, ErrMalformed
		}
		switch b[9] {
		case tieFloat:
			return b[10:], nil
		case tieIntBelow, tieIntEqual, tieIntAbove:
			if len(b) < 19 || b[10] > 1 {
				return nil, ErrMalformed
			}
			return b[19:], nil
		}
		return nil, ErrMalformed
	case KindText, KindBytes, KindOther:
		for i := 1; i+1 < len(b); i++ {
			if b[i] != 0 {
				continue
			}
			switch b[i+1] {
			case 1:
				return b[i+2:], nil
			case 0xff:
				i++
			default:
				return nil, ErrMalformed
			}
		}
	}
	return nil, ErrMalformed
}

// AppendRowKey appends a row's storage key: the ordered encoding of its
// key columns in the table's key column order (absent for a column the
// key lacks), then the key's own CBOR encoding (messages.Columns.Encode),
// which makes it unique and is what SplitRowKey returns.
func AppendRowKey(dst []byte, keyColumns []string, key messages.Columns) []byte {
	for _, c := range keyColumns {
		if v, ok := key[c]; ok {
			dst = AppendValue(dst, v)
		} else {
			dst = AppendAbsent(dst)
		}
	}
	return key.AppendEncode(dst)
}

// RowKeyFromEncoded is AppendRowKey for a key given by its CBOR encoding.
func RowKeyFromEncoded(dst []byte, keyColumns []string, encoded []byte) ([]byte, error) {
	key, err := messages.DecodeColumns(encoded)
	if err != nil {
		return nil, err
	}
	for _, c := range keyColumns {
		if v, ok := key[c]; ok {
			dst = AppendValue(dst, v)
		} else {
			dst = AppendAbsent(dst)
		}
	}
	return append(dst, encoded...), nil
}

// SplitRowKey splits a storage key written by AppendRowKey for a table
// with n key columns into its ordered part and the CBOR row key.
func SplitRowKey(n int, b []byte) (ordered, encoded []byte, err error) {
	rest := b
	for range n {
		if rest, err = Skip(rest); err != nil {
			return nil, nil, err
		}
	}
	if len(rest) == 0 {
		return nil, nil, ErrMalformed
	}
	return b[:len(b)-len(rest)], rest, nil
}
