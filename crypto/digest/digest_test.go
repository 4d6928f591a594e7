package digest

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
)

// Frozen vectors (docs/protocol.md, "Processed-message digest": empty body 7d44197a…caa10,
// "hello" ff761c42…26e54). Never change these.
const (
	vectorEmpty = "7d44197a4b18d43f3b5e30289ec8d6c2b67b868a4fbaf426fe47cd39ec4caa10"
	vectorHello = "ff761c428d54479fc3f9f6fddc7555dcbf1dd3b42d9a7620065a43b5f9f26e54"
)

func TestApplicationMessageFrozenVectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty", nil, vectorEmpty},
		{"empty-non-nil", []byte{}, vectorEmpty},
		{"hello", []byte("hello"), vectorHello},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ApplicationMessage(tc.body)
			if got := hex.EncodeToString(d[:]); got != tc.want {
				t.Fatalf("digest = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestFrozenVectorsMatchSpecPrefixes(t *testing.T) {
	// The spec gives only prefix/suffix; make sure the full frozen strings agree.
	if vectorEmpty[:8] != "7d44197a" || vectorEmpty[len(vectorEmpty)-5:] != "caa10" {
		t.Fatal("empty vector disagrees with spec")
	}
	if vectorHello[:8] != "ff761c42" || vectorHello[len(vectorHello)-5:] != "26e54" {
		t.Fatal("hello vector disagrees with spec")
	}
}

func TestApplicationMessageLengthPrefixBindsBody(t *testing.T) {
	a := ApplicationMessage([]byte("hello"))
	b := ApplicationMessage([]byte("hello\x00"))
	c := ApplicationMessage([]byte("hellp"))
	if Equal(a, b) || Equal(a, c) || Equal(b, c) {
		t.Fatal("distinct bodies share a digest")
	}
}

func TestEqual(t *testing.T) {
	a := ApplicationMessage([]byte("x"))
	b := a
	if !Equal(a, b) {
		t.Fatal("equal digests reported different")
	}
	for i := range b {
		c := a
		c[i] ^= 0x01
		if Equal(a, c) {
			t.Fatalf("digests differing at byte %d reported equal", i)
		}
	}
}

func TestStoredRoundTrip(t *testing.T) {
	d := ApplicationMessage([]byte("hello"))
	enc := EncodeStored(d)
	if len(enc) != 33 || enc[0] != 1 {
		t.Fatalf("stored form = %x", enc)
	}
	if want := "01" + vectorHello; hex.EncodeToString(enc) != want {
		t.Fatalf("stored form = %x, want %s", enc, want)
	}
	got, err := DecodeStored(enc)
	if err != nil {
		t.Fatal(err)
	}
	if got != d {
		t.Fatal("round trip changed the digest")
	}
}

func TestDecodeStoredRejects(t *testing.T) {
	good := EncodeStored(ApplicationMessage(nil))
	for _, tc := range []struct {
		name   string
		in     []byte
		reason string
	}{
		{"nil", nil, "empty"},
		{"version-only", []byte{1}, "wrong length"},
		{"short", good[:32], "wrong length"},
		{"long", append(append([]byte{}, good...), 0), "wrong length"},
		{"version-0", append([]byte{0}, good[1:]...), "unknown version"},
		{"version-2", append([]byte{2}, good[1:]...), "unknown version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeStored(tc.in)
			if !errors.Is(err, ErrStored) {
				t.Fatalf("err = %v, want ErrStored", err)
			}
			var se *StoredError
			if !errors.As(err, &se) || se.Reason != tc.reason || se.Length != len(tc.in) {
				t.Fatalf("err = %#v, want reason %q length %d", err, tc.reason, len(tc.in))
			}
		})
	}
}

func FuzzDecodeStored(f *testing.F) {
	f.Add(EncodeStored(ApplicationMessage(nil)))
	f.Add(EncodeStored(ApplicationMessage([]byte("hello"))))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeStored(b)
		if err != nil {
			if !errors.Is(err, ErrStored) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !bytes.Equal(EncodeStored(d), b) {
			t.Fatalf("accepted non-canonical %x", b)
		}
	})
}

func BenchmarkApplicationMessage256(b *testing.B) {
	body := make([]byte, 256)
	b.SetBytes(256)
	for b.Loop() {
		ApplicationMessage(body)
	}
}

func ExampleApplicationMessage() {
	d := ApplicationMessage([]byte("hello"))
	fmt.Printf("%x\n", d)
	stored := EncodeStored(d)
	back, err := DecodeStored(stored)
	fmt.Println(len(stored), err, Equal(d, back))
	// Output:
	// ff761c428d54479fc3f9f6fddc7555dcbf1dd3b42d9a7620065a43b5f9f26e54
	// 33 <nil> true
}
