package eventid

import (
	"encoding/hex"
	"testing"
)

// Known-answer vectors for BLAKE3-256 (the empty input is the official
// test vector; the others are fixed regression values).
func TestOfKnownVectors(t *testing.T) {
	cases := []struct {
		in   []byte
		want string
	}{
		{nil, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{[]byte{}, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{[]byte("abc"), "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"},
	}
	for _, c := range cases {
		got := Of(c.in)
		if hex.EncodeToString(got[:]) != c.want {
			t.Errorf("Of(%q) = %x, want %s", c.in, got, c.want)
		}
		if got.String() != c.want {
			t.Errorf("EventID.String() = %s, want %s", got.String(), c.want)
		}
	}
}

func TestOfIsOverRawBytes(t *testing.T) {
	// The same CBOR uint 1 in canonical and non-canonical (two-byte) form:
	// semantically equal, but different bytes must give different ids.
	canonical := []byte{0x01}
	nonCanonical := []byte{0x18, 0x01}
	if Of(canonical) == Of(nonCanonical) {
		t.Fatal("different encodings produced the same event id")
	}
	a := []byte("event bytes")
	id1 := Of(a)
	a[0] ^= 1
	if Of(a) == id1 {
		t.Fatal("a one-bit change did not change the id")
	}
	a[0] ^= 1
	if Of(a) != id1 {
		t.Fatal("Of is not deterministic")
	}
}

func BenchmarkEventID(b *testing.B) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		_ = Of(buf)
	}
}
