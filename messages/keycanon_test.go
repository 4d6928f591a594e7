package messages

import (
	"bytes"
	"errors"
	"testing"
)

// Each value a row key may hold has exactly one accepted encoding.
func TestCheckKeyValue(t *testing.T) {
	for _, c := range []struct {
		name string
		enc  []byte
		ok   bool
	}{
		{"1", []byte{0x01}, true},
		{"1 in one byte", []byte{0x18, 0x01}, false},
		{"1 in two bytes", []byte{0x19, 0x00, 0x01}, false},
		{"1 in four bytes", []byte{0x1a, 0, 0, 0, 0x01}, false},
		{"1 in eight bytes", []byte{0x1b, 0, 0, 0, 0, 0, 0, 0, 0x01}, false},
		{"24", []byte{0x18, 24}, true},
		{"-1", []byte{0x20}, true},
		{"-1 long", []byte{0x38, 0x00}, false},
		{"max uint64", []byte{0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, true},
		{"1.0 half", []byte{0xf9, 0x3c, 0x00}, false},
		{"1.0 single", []byte{0xfa, 0x3f, 0x80, 0, 0}, false},
		{"1.0 double", []byte{0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, false},
		{"-0.0", []byte{0xf9, 0x80, 0x00}, false},
		{"2^64 as single (an integer no head encodes)", []byte{0xfa, 0x5f, 0x80, 0, 0}, true},
		{"1.5 half", []byte{0xf9, 0x3e, 0x00}, true},
		{"1.5 single", []byte{0xfa, 0x3f, 0xc0, 0, 0}, false},
		{"1.5 double", []byte{0xfb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}, false},
		{"0.1 double", []byte{0xfb, 0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a}, true},
		{"NaN", []byte{0xf9, 0x7e, 0x00}, true},
		{"NaN with payload", []byte{0xf9, 0x7e, 0x01}, false},
		{"NaN single", []byte{0xfa, 0x7f, 0xc0, 0, 0}, false},
		{"+Inf half", []byte{0xf9, 0x7c, 0x00}, true},
		{"+Inf double", []byte{0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0}, false},
		{"text", []byte{0x61, 'a'}, true},
		{"text, long length head", []byte{0x78, 0x01, 'a'}, false},
		{"bytes, long length head", []byte{0x59, 0x00, 0x01, 'a'}, false},
		{"array of long heads", []byte{0x82, 0x01, 0x18, 0x01}, false},
		{"array, long length head", []byte{0x98, 0x01, 0x01}, false},
		{"array", []byte{0x82, 0x01, 0x02}, true},
		{"map in order", []byte{0xa2, 0x01, 0x01, 0x02, 0x02}, true},
		{"map out of order", []byte{0xa2, 0x02, 0x02, 0x01, 0x01}, false},
		{"true", []byte{0xf5}, true},
	} {
		err := CheckKeyValue(Value(c.enc))
		if c.ok && err != nil {
			t.Errorf("%s (%x): refused: %v", c.name, c.enc, err)
		}
		if !c.ok && !errors.Is(err, ErrNonCanonicalKey) {
			t.Errorf("%s (%x): %v, want ErrNonCanonicalKey", c.name, c.enc, err)
		}
	}
}

// A decoded event's key refused as non-canonical is malformed, and
// EncodeEvent refuses to write one.
func TestNonCanonicalKeyEventsRefused(t *testing.T) {
	e := sampleUpsert()
	e.Key = Columns{"id": Value{0x18, 0x01}}
	if _, err := EncodeEvent(e); !errors.Is(err, ErrNonCanonicalKey) {
		t.Fatalf("EncodeEvent: %v", err)
	}
	e.Key = Columns{"id": Value{0x01}}
	b, err := EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	canon := []byte{0x62, 'i', 'd', 0x01}
	i := bytes.Index(b, canon)
	if i < 0 {
		t.Fatal("key not found in the encoding")
	}
	for _, long := range [][]byte{{0x18, 0x01}, {0xf9, 0x3c, 0x00}} {
		bad := append(append(append([]byte(nil), b[:i+3]...), long...), b[i+4:]...)
		_, err := DecodeEvent(bad)
		if !errors.Is(err, ErrNonCanonicalKey) || !errors.Is(err, ErrMalformed) {
			t.Fatalf("key %x: %v", long, err)
		}
	}
}

// FuzzCheckKeyValue: a key value the check accepts is its own canonical
// re-encoding (decoded and encoded again it is the same bytes), so no two
// accepted encodings name one value.
func FuzzCheckKeyValue(f *testing.F) {
	for _, b := range [][]byte{{0x01}, {0x18, 0x01}, {0xf9, 0x3c, 0x00}, {0xf9, 0x3e, 0x00}, {0xa2, 0x01, 0x01, 0x02, 0x02}, {0x82, 0x61, 'a', 0x40}, {0xfb, 0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if Wellformed(in) != nil || CheckKeyValue(Value(in)) != nil {
			return
		}
		// undefined (0xf7) decodes to nil, which encodes as null: the
		// generic decoder cannot round-trip it, though it has one encoding.
		if bytes.IndexByte(in, 0xf7) >= 0 {
			return
		}
		var v any
		if err := Unmarshal("value", in, &v, 0); err != nil {
			return
		}
		out, err := Marshal(v)
		if err != nil {
			return
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("accepted %x re-encodes as %x", in, out)
		}
	})
}
