package messages

import "testing"

// PeekEnvelope agrees with DecodeEnvelope on every envelope it accepts,
// with and without an initiation, and refuses what it cannot read.
func TestPeekEnvelopeAgreesWithDecode(t *testing.T) {
	for _, withInit := range []bool{false, true} {
		e := sampleEnvelope(withInit)
		e.Header.PN, e.Header.N = 70000, 300 // multi-byte integer heads
		b, err := EncodeEnvelope(e)
		if err != nil {
			t.Fatal(err)
		}
		s, in, ok := PeekEnvelope(b)
		if !ok || s != e.Header.Session || in != withInit {
			t.Fatalf("initiation %v: peek = %s, %v, %v", withInit, s, in, ok)
		}
		for _, cut := range []int{0, 1, 2, 40, 70, 72} {
			if _, _, ok := PeekEnvelope(b[:cut]); ok {
				t.Fatalf("a %d-byte prefix peeked ok", cut)
			}
		}
		bad := append([]byte(nil), b...)
		bad[1] = EnvelopeVersion + 1
		if _, _, ok := PeekEnvelope(bad); ok {
			t.Fatal("another version peeked ok")
		}
	}
}

func FuzzPeekEnvelope(f *testing.F) {
	for _, w := range []bool{false, true} {
		b, _ := EncodeEnvelope(sampleEnvelope(w))
		f.Add(b)
	}
	for _, w := range []bool{false, true} {
		b, _ := EncodeEnvelope(sampleSaltedEnvelope(w))
		f.Add(b)
	}
	f.Add([]byte{0x84, 0x01, 0xf6, 0xf6, 0x40})
	f.Fuzz(func(t *testing.T, in []byte) {
		s, init, ok := PeekEnvelope(in) // never panics
		e, err := DecodeEnvelope(in)
		if err != nil {
			return
		}
		if !ok || s != e.Header.Session || init != (e.Initiation != nil) {
			t.Fatalf("decoded (session %s, initiation %v), peeked (%s, %v, ok %v)", e.Header.Session, e.Initiation != nil, s, init, ok)
		}
	})
}
