package messages

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// checkEnvelopeReader: whatever the hand-written reader accepts, the
// reflective decoder accepts too, with the same result, and the input is
// its canonical encoding; the result does not alias the input.
func checkEnvelopeReader(t *testing.T, in []byte) bool {
	t.Helper()
	e, ok := readEnvelope(in)
	if !ok {
		return false
	}
	want, err := decodeEnvelope(in)
	if err != nil {
		t.Fatalf("the reader accepted what the decoder refuses (%v): %x", err, in)
	}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("reader %+v, decoder %+v", e, want)
	}
	if out, err := EncodeEnvelope(e); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("accepted input is not canonical (%v): %x", err, in)
	}
	if len(e.Ciphertext) > 0 && &e.Ciphertext[0] == &in[len(in)-len(e.Ciphertext)] {
		t.Fatal("the ciphertext aliases the input")
	}
	return true
}

func checkSecurePayloadReader(t *testing.T, in []byte) bool {
	t.Helper()
	p, ok := readSecurePayload(in)
	if !ok {
		return false
	}
	want, err := decodeSecurePayload(in)
	if err != nil {
		t.Fatalf("the reader accepted what the decoder refuses (%v): %x", err, in)
	}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("reader %+v, decoder %+v", p, want)
	}
	if out, err := EncodeSecurePayload(p); err != nil || !bytes.Equal(out, in) {
		t.Fatalf("accepted input is not canonical (%v): %x", err, in)
	}
	return true
}

// The readers take every envelope and frame the encoders write (edge
// sizes of every head included), so the strict decoders do not reach the
// reflective path for them; an envelope with an initiation, and any
// input changed in one byte, is either refused by the reader or read as
// the decoder reads it.
func TestReadersTakeWhatTheEncodersWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	for _, n := range []uint32{0, 1, 23, 24, 255, 256, 65535, 65536, math.MaxUint32} {
		for _, size := range []int{AEADTagSize, 23, 24, 255, 256, 65535, 65536} {
			e := sampleEnvelope(false)
			e.Header.PN, e.Header.N = n, math.MaxUint32-n
			e.Ciphertext = make([]byte, size)
			fill(rng, e.Ciphertext)
			b, err := EncodeEnvelope(e)
			if err != nil {
				t.Fatal(err)
			}
			if !checkEnvelopeReader(t, b) {
				t.Fatalf("reader refused a canonical envelope (pn %d, %d-byte ciphertext)", n, size)
			}
			if size > 300 {
				continue
			}
			for i := range b {
				c := bytes.Clone(b)
				c[i] ^= byte(1 << rng.IntN(8))
				checkEnvelopeReader(t, c)
			}
			checkEnvelopeReader(t, b[:len(b)-1])
			checkEnvelopeReader(t, append(bytes.Clone(b), 0))
		}
	}
	withInit, err := EncodeEnvelope(sampleEnvelope(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := readEnvelope(withInit); ok {
		t.Fatal("the reader took an envelope with an initiation (the decoder's job)")
	}
	for _, size := range []int{0, 1, 23, 24, 255, 256, 65536} {
		body := make([]byte, size)
		fill(rng, body)
		for _, p := range []*SecurePayload{
			{Type: PayloadApplicationMessage, ID: LogicalMessageID{1, 2}, Body: body},
			{Type: PayloadAck, ID: LogicalMessageID{3}},
		} {
			b, err := EncodeSecurePayload(p)
			if err != nil {
				t.Fatal(err)
			}
			if !checkSecurePayloadReader(t, b) {
				t.Fatalf("reader refused a canonical frame (%v, %d-byte body)", p.Type, size)
			}
			if size > 300 {
				continue
			}
			for i := range b {
				c := bytes.Clone(b)
				c[i] ^= byte(1 << rng.IntN(8))
				checkSecurePayloadReader(t, c)
			}
			checkSecurePayloadReader(t, b[:len(b)-1])
			checkSecurePayloadReader(t, append(bytes.Clone(b), 0))
		}
	}
}

func FuzzEnvelopeReaderMatchesTheDecoder(f *testing.F) {
	for _, w := range []bool{false, true} {
		b, _ := EncodeEnvelope(sampleEnvelope(w))
		f.Add(b)
	}
	for _, w := range []bool{false, true} {
		b, _ := EncodeEnvelope(sampleSaltedEnvelope(w))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkEnvelopeReader(t, in) })
}

func FuzzSecurePayloadReaderMatchesTheDecoder(f *testing.F) {
	for _, p := range []*SecurePayload{
		{Type: PayloadApplicationMessage, ID: LogicalMessageID{1}, Body: []byte("x")},
		{Type: PayloadAck, ID: LogicalMessageID{2}},
	} {
		b, _ := EncodeSecurePayload(p)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkSecurePayloadReader(t, in) })
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}
