package lthash

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"pgregory.net/rapid"
)

// The sum of a set does not depend on the order elements were added, and
// removing an element undoes adding it.
func TestSumIsOrderIndependentAndRemovable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		elems := rapid.SliceOfN(rapid.SliceOfN(rapid.Byte(), 0, 64), 0, 20).Draw(t, "elems")
		perm := rapid.Permutation(elems).Draw(t, "perm")
		var a, b Sum
		for _, e := range elems {
			a.Add(e)
		}
		for _, e := range perm {
			b.Add(e)
		}
		if a != b {
			t.Fatalf("sum depends on order")
		}
		cut := rapid.IntRange(0, len(elems)).Draw(t, "cut")
		var head, tail Sum
		for _, e := range elems[:cut] {
			head.Add(e)
		}
		for _, e := range elems[cut:] {
			tail.Add(e)
		}
		head.Combine(&tail)
		if head != a {
			t.Fatalf("sum of parts differs from the sum of the whole")
		}
		for _, e := range elems[:cut] {
			a.Remove(e)
		}
		if a != tail {
			t.Fatalf("removing the head does not leave the tail's sum")
		}
		a.Subtract(&tail)
		if !a.IsZero() {
			t.Fatalf("subtracting everything leaves %x", a.AppendBinary(nil)[:8])
		}
		dec, err := Decode(b.AppendBinary(nil))
		if err != nil || dec != b {
			t.Fatalf("decode(encode) = %v, %v", err, dec == b)
		}
	})
}

// A frozen vector: the expansion (SHA-256 of the v1 domain and the element, AES-256-CTR) must
// never change, or persisted sums and peers' fingerprints disagree.
func TestSumVector(t *testing.T) {
	var s Sum
	s.Add([]byte("syncmesh"))
	s.Add([]byte{})
	got := hex.EncodeToString(s.AppendBinary(nil)[:16])
	const want = "d613440f5b1da232ef573801ce38e3f2"
	if got != want {
		t.Fatalf("sum of {\"syncmesh\", \"\"} starts %s, want %s", got, want)
	}
	if _, err := Decode(make([]byte, Size-1)); !errors.Is(err, ErrSize) {
		t.Fatalf("short decode: %v", err)
	}
	var one Sum
	one.Add([]byte("a"))
	var two Sum
	two.Add([]byte("b"))
	if bytes.Equal(one.AppendBinary(nil), two.AppendBinary(nil)) {
		t.Fatalf("two elements hash alike")
	}
}

func BenchmarkAdd(b *testing.B) {
	var s Sum
	key := make([]byte, 56)
	for i := 0; i < b.N; i++ {
		key[0] = byte(i)
		s.Add(key)
	}
}

// The lane arithmetic is word-wise arithmetic modulo 2^16.
func TestLanesAreWordwise(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := rapid.Uint64().Draw(t, "a"), rapid.Uint64().Draw(t, "b")
		s, d := add16(a, b), sub16(a, b)
		for i := 0; i < 64; i += 16 {
			x, y := uint16(a>>i), uint16(b>>i)
			if uint16(s>>i) != x+y || uint16(d>>i) != x-y {
				t.Fatalf("word %d: %x±%x gave %x, %x", i/16, x, y, uint16(s>>i), uint16(d>>i))
			}
		}
	})
}

// An element expanded ahead (Expand, then AddElement or RemoveElement)
// changes a sum exactly as Add and Remove of the element do, for short
// elements (hashed from a stack buffer) and long ones alike.
func TestExpandedElementAddsAsAdd(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		elems := rapid.SliceOfN(rapid.SliceOfN(rapid.Byte(), 0, 2*shortElem+1), 1, 10).Draw(t, "elems")
		var byAdd, byElem Sum
		for _, e := range elems {
			byAdd.Add(e)
			var x Element
			x.Expand(e)
			byElem.AddElement(&x)
		}
		if byAdd != byElem {
			t.Fatalf("adding expanded elements differs from Add")
		}
		for _, e := range elems[1:] {
			byAdd.Remove(e)
			var x Element
			x.Expand(e)
			byElem.RemoveElement(&x)
		}
		var one Sum
		one.Add(elems[0])
		if byAdd != one || byElem != one {
			t.Fatalf("removing all but the first element does not leave its sum")
		}
	})
}

// The frozen vector of TestSumVector also holds for an element at the
// stack buffer's edge and one past it (the two ways Expand hashes).
func TestExpandAtTheShortElementEdge(t *testing.T) {
	for _, n := range []int{shortElem, shortElem + 1} {
		elem := bytes.Repeat([]byte{0xa5}, n)
		var x Element
		x.Expand(elem)
		h := sha256.New()
		h.Write([]byte(domain))
		h.Write(elem)
		c, err := aes.NewCipher(h.Sum(nil))
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, Size)
		cipher.NewCTR(c, make([]byte, aes.BlockSize)).XORKeyStream(want, want)
		var s Sum
		s.AddElement(&x)
		if got := s.AppendBinary(nil); !bytes.Equal(got, want) {
			t.Fatalf("element of %d bytes: expansion starts %x, want %x", n, got[:8], want[:8])
		}
	}
}

func BenchmarkExpand(b *testing.B) {
	var x Element
	key := make([]byte, 56)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		key[0] = byte(i)
		x.Expand(key)
	}
}

func BenchmarkAddElement(b *testing.B) {
	var s Sum
	var x Element
	x.Expand([]byte("k"))
	for i := 0; i < b.N; i++ {
		s.AddElement(&x)
	}
}

// Every word of the sum of elements of 0 to 2·shortElem+3 bytes (both
// ways Expand hashes) equals what 85b3c04, before Expand's buffers
// changed, computed: the SHA-256 of the encoded sum is frozen.
func TestSumOfManyLengthsIsFrozen(t *testing.T) {
	var s Sum
	for n := 0; n <= 2*shortElem+3; n++ {
		elem := make([]byte, n)
		for i := range elem {
			elem[i] = byte(7*n + 13*i)
		}
		s.Add(elem)
	}
	d := sha256.Sum256(s.AppendBinary(nil))
	const want = "d24086504d242a5feac7fc65d12fa6f19e341c197520071252bee1d6a54bca44"
	if got := hex.EncodeToString(d[:]); got != want {
		t.Fatalf("sum digest %s, want %s", got, want)
	}
}
