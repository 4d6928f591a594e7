package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// The protected header SignPayload writes takes the canonical path.
func TestCanonicalProtectedTakesSignerOutput(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s := NewSigner(messages.SiteID{1}, priv)
	raw, err := s.SignPayload([]byte{0xa0}, []byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	prot, _, err := readBstr(raw[2:], "protected header")
	if err != nil {
		t.Fatal(err)
	}
	kid, ok := canonicalProtected(prot)
	if !ok || !bytes.Equal(kid, s.Kid()) {
		t.Fatalf("canonical path: ok %v kid %x, want %x", ok, kid, s.Kid())
	}
	// Other encodings of the same map are left to the general path.
	swapped := append([]byte{0xa2, 0x04, 0x50}, s.Kid()...)
	swapped = append(swapped, 0x01, 0x27)
	if _, ok := canonicalProtected(swapped); ok {
		t.Fatal("non-canonical key order took the canonical path")
	}
	long := append([]byte{0xa2, 0x01, 0x27, 0x04, 0x58, 0x10}, s.Kid()...)
	if _, ok := canonicalProtected(long); ok {
		t.Fatal("non-shortest kid length took the canonical path")
	}
	for _, b := range [][]byte{prot[:len(prot)-1], append(bytes.Clone(prot), 0), {0xa2, 0x01, 0x27, 0x04, 0x40}} {
		if _, ok := canonicalProtected(b); ok {
			t.Fatalf("%x took the canonical path", b)
		}
	}
}

// FuzzCanonicalProtected: the canonical path accepts only what the general
// path accepts, with the same kid.
func FuzzCanonicalProtected(f *testing.F) {
	f.Add(append([]byte{0xa2, 0x01, 0x27, 0x04, 0x50}, make([]byte, 16)...))
	f.Add([]byte{0xa2, 0x01, 0x27, 0x04, 0x41, 0x07})
	f.Add([]byte{0xa2, 0x04, 0x41, 0x07, 0x01, 0x27})
	f.Fuzz(func(t *testing.T, b []byte) {
		kid, ok := canonicalProtected(b)
		if !ok {
			return
		}
		want, err := parseProtectedGeneral(b)
		if err != nil || !bytes.Equal(kid, want) {
			t.Fatalf("canonical kid %x, general %x (%v)", kid, want, err)
		}
	})
}
