package messages

import (
	"errors"
	"testing"
)

func TestValue(t *testing.T) {
	if !Null.IsNull() || MustValue(nil).IsNull() != true {
		t.Fatal("null value")
	}
	for _, v := range []Value{MustValue(0), MustValue(false), MustValue(""), MustValue([]byte{}), {}, nil, {0xf6, 0x00}} {
		if v.IsNull() {
			t.Fatalf("%x reads as null", []byte(v))
		}
	}
	v := MustValue("x")
	c := v.Clone()
	c[1] = 'y'
	if !v.Equal(MustValue("x")) || v.Equal(c) {
		t.Fatal("Clone shares memory or Equal wrong")
	}
	var s string
	if err := v.Decode(&s); err != nil || s != "x" {
		t.Fatalf("Decode: %q %v", s, err)
	}
	if err := MustValue(1).Decode(&s); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode wrong type: %v", err)
	}
	if err := append(MustValue(1), 0x01).Decode(new(int)); !errors.Is(err, ErrTrailingBytes) {
		t.Fatalf("Decode trailing: %v", err)
	}
	if _, err := NewValue(make(chan int)); err == nil {
		t.Fatal("NewValue encoded a channel")
	}
	x, err := MustValue(map[string]any{"a": 1}).Interface()
	if err != nil || x == nil {
		t.Fatalf("Interface: %v %v", x, err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("MustValue did not panic on an unencodable value")
			}
		}()
		MustValue(func() {})
	}()
}

func TestColumnsEncodeDecode(t *testing.T) {
	c := Columns{"b": MustValue(2), "a": MustValue(1), "aa": Null}
	if got := c.Names(); len(got) != 3 || got[0] != "a" || got[1] != "aa" || got[2] != "b" {
		t.Fatalf("Names = %v", got)
	}
	b := c.Encode()
	// Core deterministic: shorter keys first, then bytewise.
	want := []byte{0xa3, 0x61, 'a', 0x01, 0x61, 'b', 0x02, 0x62, 'a', 'a', 0xf6}
	if string(b) != string(want) {
		t.Fatalf("Encode = % x, want % x", b, want)
	}
	got, err := DecodeColumns(b)
	if err != nil || !columnsEqual(got, c) {
		t.Fatalf("DecodeColumns = %v, %v", got, err)
	}
	if !got["aa"].IsNull() {
		t.Fatal("null column lost")
	}
	empty, err := DecodeColumns([]byte{0xa0})
	if err != nil || empty == nil || len(empty) != 0 {
		t.Fatalf("empty map: %v %v", empty, err)
	}
	for name, in := range map[string][]byte{
		"null":          {0xf6},
		"array":         {0x80},
		"int keys":      {0xa1, 0x01, 0x01},
		"dup keys":      {0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02},
		"indefinite":    {0xbf, 0x61, 'a', 0x01, 0xff},
		"tagged":        {0xc1, 0xa0},
		"trailing":      {0xa0, 0x00},
		"truncated":     {0xa1, 0x61, 'a'},
		"empty":         {},
		"tag in value":  {0xa1, 0x61, 'a', 0xc1, 0x01},
		"bad utf8 name": {0xa1, 0x61, 0xff, 0x01},
	} {
		if _, err := DecodeColumns(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := DecodeColumns([]byte{0xa0, 0x00}); !errors.Is(err, ErrTrailingBytes) {
		t.Errorf("trailing: not ErrTrailingBytes")
	}
}

func TestCodecErrors(t *testing.T) {
	var v uint64
	err := Unmarshal("thing", []byte{0x01, 0x02}, &v, 0)
	var de *DecodeError
	if !errors.As(err, &de) || de.What != "thing" || !errors.Is(err, ErrTrailingBytes) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("trailing: %v", err)
	}
	if errors.Is(err, ErrTooLarge) {
		t.Fatal("trailing matches ErrTooLarge")
	}
	if err := Unmarshal("thing", make([]byte, 11), &v, 10); !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("too large: %v", err)
	}
	if err := Unmarshal("thing", []byte{0x01}, &v, 1); err != nil || v != 1 {
		t.Fatalf("at limit: %v", err)
	}
	// Nesting deeper than the limit is refused.
	deep := make([]byte, 0, 40)
	for i := 0; i < 20; i++ {
		deep = append(deep, 0x81)
	}
	deep = append(deep, 0x00)
	var x any
	if err := Unmarshal("deep", deep, &x, 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("deep nesting: %v", err)
	}
	if err := Wellformed([]byte{0x18}); err == nil {
		t.Fatal("Wellformed accepted a truncated item")
	}
	if err := Wellformed([]byte{0x01}); err != nil {
		t.Fatal(err)
	}
	if msg := (&DecodeError{What: "x", Kind: ErrTooLarge}).Error(); msg == "" {
		t.Fatal("empty error message")
	}
}
