package messages

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeEvent: DecodeEvent never panics, every failure matches
// ErrMalformed, and every accepted input re-encodes to bytes that decode to
// an equal event (re-encoding may differ from a non-canonical input).
func FuzzDecodeEvent(f *testing.F) {
	up, _ := EncodeEvent(sampleUpsert())
	del, _ := EncodeEvent(sampleDelete())
	f.Add(up)
	f.Add(del)
	f.Add(up[:len(up)-1])
	f.Add(append(bytes.Clone(del), 0x00))
	f.Add([]byte{0xa0})
	f.Add([]byte{0xf6})
	f.Add([]byte{0xbf, 0xff})
	m := wireMap(f)
	m["key"] = nil
	f.Add(enc(f, m))
	m = wireMap(f)
	m["v"] = 2
	f.Add(enc(f, m))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := DecodeEvent(in)
		if err != nil {
			if e != nil {
				t.Fatal("event returned with error")
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not match ErrMalformed: %v", err)
			}
			return
		}
		for name, v := range e.Key {
			if err := CheckKeyValue(v); err != nil {
				t.Fatalf("accepted a non-canonical key value %q=%x: %v", name, []byte(v), err)
			}
		}
		b, err := EncodeEvent(e)
		if err != nil {
			t.Fatalf("accepted event does not encode: %v (%+v)", err, e)
		}
		e2, err := DecodeEvent(b)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !eventEqual(e, e2) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", e, e2)
		}
		b2, err := EncodeEvent(e2)
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("encoding is not a fixed point: %v", err)
		}
		_ = e.RowKey()
	})
}

// FuzzDecodeColumns: DecodeColumns never panics and accepted columns
// re-encode to an equal map.
func FuzzDecodeColumns(f *testing.F) {
	f.Add(Columns{"a": MustValue(1), "b": Null}.Encode())
	f.Add([]byte{0xa0})
	f.Add([]byte{0xf6})
	f.Add([]byte{0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02})
	f.Add([]byte{0xa1, 0x61, 'a', 0xc1, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := DecodeColumns(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not match ErrMalformed: %v", err)
			}
			return
		}
		c2, err := DecodeColumns(c.Encode())
		if err != nil || !columnsEqual(c, c2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
