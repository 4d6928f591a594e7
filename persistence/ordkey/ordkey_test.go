package ordkey

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/big"
	"testing"

	"github.com/x448/float16"
	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
)

// refCompare is the documented order, computed from decoded values
// (independently of the encoding): kind rank, then numbers by exact
// value (big.Float), text and bytes bytewise, other items by their CBOR
// bytes.
func refCompare(a, b messages.Value) int {
	ra, rb := rank(a), rank(b)
	if ra != rb {
		return cmpInt(ra, rb)
	}
	switch ra {
	case 4:
		return cmpNumbers(a, b)
	case 5, 6:
		return bytes.Compare(payload(a), payload(b))
	case 7:
		return bytes.Compare(a, b)
	}
	return 0
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func rank(v messages.Value) int {
	if len(v) == 0 {
		return 0
	}
	switch v.Kind() {
	case "null":
		return 1
	case "bool":
		if v[0] == 0xf4 {
			return 2
		}
		return 3
	case "integer", "float":
		return 4
	case "text":
		if v[0]&0x1f == 31 {
			return 7
		}
		return 5
	case "bytes":
		if v[0]&0x1f == 31 {
			return 7
		}
		return 6
	}
	return 7
}

func payload(v messages.Value) []byte {
	n, _ := head(v)
	return v[len(v)-int(n):]
}

// number returns v as an exact big.Float, whether it is a float, and NaN.
func number(v messages.Value) (f *big.Float, isFloat, nan bool, neg0 bool) {
	switch v[0] >> 5 {
	case 0:
		n, _ := head(v)
		return new(big.Float).SetPrec(200).SetUint64(n), false, false, false
	case 1:
		n, _ := head(v)
		x := new(big.Float).SetPrec(200).SetUint64(n)
		x.Add(x, big.NewFloat(1))
		return x.Neg(x), false, false, false
	}
	var x float64
	switch v[0] {
	case 0xf9:
		x = float64(float16.Frombits(binary.BigEndian.Uint16(v[1:])).Float32())
	case 0xfa:
		x = float64(math.Float32frombits(binary.BigEndian.Uint32(v[1:])))
	default:
		x = math.Float64frombits(binary.BigEndian.Uint64(v[1:]))
	}
	if x != x {
		return nil, true, true, false
	}
	return new(big.Float).SetPrec(200).SetFloat64(x), true, false, x == 0 && math.Signbit(x)
}

func cmpNumbers(a, b messages.Value) int {
	fa, afl, anan, aneg0 := number(a)
	fb, bfl, bnan, bneg0 := number(b)
	switch {
	case anan && bnan:
		return 0
	case anan:
		return 1
	case bnan:
		return -1
	}
	if c := fa.Cmp(fb); c != 0 {
		return c
	}
	switch {
	case afl && bfl:
		// -0.0 below 0.0.
		switch {
		case aneg0 && !bneg0:
			return -1
		case !aneg0 && bneg0:
			return 1
		}
		return 0
	case afl:
		return -1
	case bfl:
		return 1
	}
	return 0
}

func genValue() *rapid.Generator[messages.Value] {
	raw := func(b ...byte) messages.Value { return messages.Value(b) }
	return rapid.OneOf(
		rapid.Map(rapid.Int64(), func(v int64) messages.Value { return messages.MustValue(v) }),
		rapid.Map(rapid.Uint64(), func(v uint64) messages.Value { return messages.MustValue(v) }),
		rapid.Map(rapid.Uint64(), func(v uint64) messages.Value { // down to -2^64
			return binary.BigEndian.AppendUint64([]byte{0x3b}, v)
		}),
		rapid.Map(rapid.Int64Range(-(1<<54), 1<<54), func(v int64) messages.Value { return messages.MustValue(v) }),
		rapid.Map(rapid.Float64(), func(v float64) messages.Value {
			return binary.BigEndian.AppendUint64([]byte{0xfb}, math.Float64bits(v))
		}),
		rapid.Map(rapid.Int64(), func(v int64) messages.Value { // floats near integers
			return binary.BigEndian.AppendUint64([]byte{0xfb}, math.Float64bits(float64(v)))
		}),
		rapid.Map(rapid.Uint32(), func(v uint32) messages.Value { return binary.BigEndian.AppendUint32([]byte{0xfa}, v) }),
		rapid.Map(rapid.Uint16(), func(v uint16) messages.Value { return binary.BigEndian.AppendUint16([]byte{0xf9}, v) }),
		rapid.Map(rapid.StringN(0, 6, -1), func(v string) messages.Value { return messages.MustValue(v) }),
		rapid.Map(rapid.SliceOfN(rapid.SampledFrom([]byte{0, 1, 0xff, 'a'}), 0, 5), func(v []byte) messages.Value { return messages.MustValue(v) }),
		rapid.Map(rapid.SliceOfN(rapid.Int8(), 0, 3), func(v []int8) messages.Value { return messages.MustValue(v) }),
		rapid.SampledFrom([]messages.Value{raw(0xf6), raw(0xf4), raw(0xf5), raw(0xf7), raw(), raw(0x7f, 0x61, 0x61, 0xff), raw(0xc1, 0x01), raw(0xa0)}),
	)
}

func sign(c int) int { return cmpInt(c, 0) }

// The encoding orders as the documented order does, and each value's
// encoding is self-delimiting.
func TestOrderMatchesTheReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a, b := genValue().Draw(rt, "a"), genValue().Draw(rt, "b")
		ea, eb := AppendValue(nil, a), AppendValue(nil, b)
		if got, want := sign(bytes.Compare(ea, eb)), refCompare(a, b); got != want {
			rt.Fatalf("%x vs %x: encodings compare %d, values %d (%x, %x)", []byte(a), []byte(b), got, want, ea, eb)
		}
		tail := []byte{0, 1, 2}
		if rest, err := Skip(append(ea, tail...)); err != nil || !bytes.Equal(rest, tail) {
			rt.Fatalf("Skip(%x + tail) = %x, %v", ea, rest, err)
		}
	})
}

func TestOrderExamples(t *testing.T) {
	in := []any{nil, false, true, math.Inf(-1), -1 << 62, -300, -1, -0.5, 0, 0.5, 1, 2, 10, 1 << 62, math.Inf(1), math.NaN(), "", "Z", "a", "a\x00", "aa", "b", "é", []byte{}, []byte{0}, []byte{1}, []any{}}
	var prev []byte
	for i, v := range in {
		e := AppendValue(nil, messages.MustValue(v))
		if i > 0 && bytes.Compare(prev, e) >= 0 {
			t.Errorf("%v does not sort after %v", v, in[i-1])
		}
		prev = e
	}
	if bytes.Compare(AppendAbsent(nil), AppendValue(nil, messages.Null)) >= 0 {
		t.Error("absent does not sort below null")
	}
	// A text prefix: exactly the texts that start with it.
	p := AppendPrefix(nil, []byte("a\x00"), false)
	for _, s := range []string{"a\x00", "a\x00b", "a\x00\x00"} {
		if !bytes.HasPrefix(AppendValue(nil, messages.MustValue(s)), p) {
			t.Errorf("%q does not start with the prefix a\\x00", s)
		}
	}
	for _, s := range []string{"a", "a\x01", "b"} {
		if bytes.HasPrefix(AppendValue(nil, messages.MustValue(s)), p) {
			t.Errorf("%q starts with the prefix a\\x00", s)
		}
	}
}

// A row storage key splits back into its CBOR key.
func TestRowKeyRoundTrip(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		key := messages.Columns{"a": genValue().Draw(rt, "a"), "b": genValue().Draw(rt, "b")}
		if _, err := messages.DecodeColumns(key.Encode()); err != nil || len(key["a"]) == 0 || len(key["b"]) == 0 {
			return // not a key the stores accept
		}
		cols := []string{"b", "a"}
		sk := AppendRowKey(nil, cols, key)
		ord, enc, err := SplitRowKey(len(cols), sk)
		if err != nil || !bytes.Equal(enc, key.Encode()) || !bytes.Equal(ord, sk[:len(sk)-len(enc)]) {
			rt.Fatalf("split %x: %x %x %v", sk, ord, enc, err)
		}
		if got, err := RowKeyFromEncoded(nil, cols, key.Encode()); err != nil || !bytes.Equal(got, sk) {
			rt.Fatalf("RowKeyFromEncoded: %x, %v; want %x", got, err, sk)
		}
	})
}

// FuzzOrdkey: for any two well-formed items the encodings order as the
// reference does and Skip finds each one's end; Skip and SplitRowKey
// never panic on any input and never return more than they were given.
func FuzzOrdkey(f *testing.F) {
	f.Add([]byte{0x01}, []byte{0x20})
	f.Add([]byte{0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{0xfb, 0xc3, 0xf0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x62, 0x61, 0x00}, []byte{0x61, 0x61})
	f.Add([]byte{0xf9, 0x7e, 0x00}, []byte{0xfa, 0x7f, 0x80, 0, 0})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if rest, err := Skip(a); err == nil && len(rest) > len(a) {
			t.Fatalf("Skip grew its input")
		}
		_, _, _ = SplitRowKey(2, a)
		if messages.Wellformed(a) != nil || messages.Wellformed(b) != nil {
			return
		}
		ea, eb := AppendValue(nil, a), AppendValue(nil, b)
		if got, want := sign(bytes.Compare(ea, eb)), refCompare(a, b); got != want {
			t.Fatalf("%x vs %x: encodings compare %d, values %d", a, b, got, want)
		}
		if rest, err := Skip(append(ea, eb...)); err != nil || !bytes.Equal(rest, eb) {
			t.Fatalf("Skip(%x|%x) = %x, %v", ea, eb, rest, err)
		}
	})
}
