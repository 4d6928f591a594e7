package messages

import (
	"bytes"
	"slices"
	"sort"
)

// Value is one column value: exactly one CBOR data item in deterministic
// encoding. The encoded null (0xf6) is an explicit null cell, which SSP/1
// §13.1 treats as an ordinary clocked write.
type Value []byte

// Null is the encoded CBOR null.
var Null = Value{0xf6}

// NewValue encodes a Go value (nil, bool, integers, floats, string, []byte,
// or slices and maps of those) as a Value.
func NewValue(v any) (Value, error) {
	b, err := Marshal(v)
	if err != nil {
		return nil, err
	}
	return Value(b), nil
}

// MustValue is NewValue for values known to encode (tests and examples).
func MustValue(v any) Value {
	b, err := NewValue(v)
	if err != nil {
		panic(err)
	}
	return b
}

// IsNull reports whether v is the CBOR null.
func (v Value) IsNull() bool { return len(v) == 1 && v[0] == 0xf6 }

// Decode decodes v into out with the strict decoder.
func (v Value) Decode(out any) error { return Unmarshal("value", v, out, maxValueSize) }

// Interface decodes v into a generic Go value (nil, bool, uint64/int64,
// float64, string, []byte, []any, map[any]any).
func (v Value) Interface() (any, error) {
	var out any
	err := v.Decode(&out)
	return out, err
}

// Equal reports whether two values have the same encoding.
func (v Value) Equal(o Value) bool { return bytes.Equal(v, o) }

// Clone returns a copy of v.
func (v Value) Clone() Value { return append(Value(nil), v...) }

// Columns is a column name → value map (a row key or an upsert payload).
type Columns map[string]Value

// Names returns the column names in sorted order.
func (c Columns) Names() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Encode returns the deterministic CBOR encoding of the map. For a row key
// this is the row's identity in storage.
//
// It writes Core Deterministic Encoding directly (RFC 8949 §4.2.1: map
// keys in bytewise order of their encodings, which for text keys is
// shorter first, then bytewise) instead of going through reflection: it
// runs for every row key and payload on the apply path. Values are
// already-encoded data items and are copied as they are.
func (c Columns) Encode() []byte {
	size := 9
	for k, v := range c {
		size += 9 + len(k) + len(v)
	}
	return c.AppendEncode(make([]byte, 0, size))
}

// AppendEncode appends Encode's output to b (a caller building a storage
// key around the row key saves a copy).
func (c Columns) AppendEncode(b []byte) []byte {
	// Row keys and payloads have a handful of columns: sort them on the
	// stack when they fit.
	var stack [8]string
	keys := stack[:0]
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, CompareShortlex[string])
	b = appendHead(b, 5, uint64(len(keys)))
	for _, k := range keys {
		b = appendHead(b, 3, uint64(len(k)))
		b = append(b, k...)
		b = append(b, c[k]...)
	}
	return b
}

// appendHead appends a CBOR head of the given major type in its shortest form.
func appendHead(b []byte, major byte, n uint64) []byte {
	m := major << 5
	switch {
	case n < 24:
		return append(b, m|byte(n))
	case n <= 0xff:
		return append(b, m|24, byte(n))
	case n <= 0xffff:
		return append(b, m|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return append(b, m|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(b, m|27, byte(n>>56), byte(n>>48), byte(n>>40), byte(n>>32), byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

// DecodeColumns decodes the encoding produced by Encode.
func DecodeColumns(b []byte) (Columns, error) {
	if len(b) <= maxEventSize {
		// Encode's own output (the common case: stored row keys) is read
		// by hand; anything else goes to the strict decoder. See
		// decodeEventCanonical.
		r := canonReader{b: append([]byte(nil), b...)}
		if c := r.columns(); !r.bad && len(r.b) == 0 {
			return c, nil
		}
	}
	return decodeColumnsStrict(b)
}

// decodeColumnsStrict is DecodeColumns through the strict decoder.
func decodeColumnsStrict(b []byte) (Columns, error) {
	var m Columns
	if err := Unmarshal("columns", b, &m, maxEventSize); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, decodeErr("columns", ErrMalformed, nil)
	}
	return m, nil
}

// UnmarshalCBOR keeps the data item as it is. The strict decoder has
// already checked it is one well-formed item of an allowed kind.
func (v *Value) UnmarshalCBOR(data []byte) error {
	*v = append(Value(nil), data...)
	return nil
}

// MarshalCBOR writes the data item as it is.
func (v Value) MarshalCBOR() ([]byte, error) {
	if len(v) == 0 {
		return nil, decodeErr("value", ErrMalformed, nil)
	}
	return v, nil
}
