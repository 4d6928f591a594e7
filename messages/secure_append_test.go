package messages

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// refRatchetHeader, refSecurePayload and refEnvelope are the reflective
// CBOR encodings the hand-written encoders replaced.
func refRatchetHeader(t *testing.T, h *RatchetHeader) []byte {
	b, err := Marshal(&wireHeader{Session: h.Session[:], DH: h.DH[:], PN: h.PN, N: h.N})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func refSecurePayload(t *testing.T, p *SecurePayload) []byte {
	var body []byte
	var err error
	if p.Type == PayloadApplicationMessage {
		b := p.Body
		if b == nil {
			b = []byte{}
		}
		body, err = Marshal(&wireAppMessage{ID: p.ID[:], Body: &b})
	} else {
		body, err = Marshal(&wireAck{ID: p.ID[:]})
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(&wirePayloadFrame{V: SecurePayloadVersion, Type: uint64(p.Type), Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func refEnvelope(t *testing.T, e *Envelope, ib []byte) []byte {
	w := wireEnvelope{V: EnvelopeVersion, Header: refRatchetHeader(t, &e.Header), Ciphertext: e.Ciphertext, Initiation: cborRaw(Null)}
	if ib != nil {
		w.Initiation = ib
	}
	b, err := Marshal(&w)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSecureAppendMatchesCBOR: the hand-written encoders of the ratchet
// header, the SecurePayload frame and the envelope give the bytes of the
// Core Deterministic CBOR encoder for random values and for every size
// where a CBOR head changes length; what they encode decodes back.
func TestSecureAppendMatchesCBOR(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	nums := []uint32{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1}
	sizes := []int{0, 1, 23, 24, 255, 256, 65535, 65536, 70000}
	num := func() uint32 {
		if r.IntN(2) == 0 {
			return nums[r.IntN(len(nums))]
		}
		return r.Uint32()
	}
	bytesOf := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	for i := range 300 {
		var h RatchetHeader
		copy(h.Session[:], bytesOf(32))
		copy(h.DH[:], bytesOf(32))
		h.PN, h.N = num(), num()
		got, err := EncodeRatchetHeader(&h)
		if err != nil || !bytes.Equal(got, refRatchetHeader(t, &h)) {
			t.Fatalf("header %+v: %x (%v), want %x", h, got, err, refRatchetHeader(t, &h))
		}

		n := sizes[i%len(sizes)]
		if i >= len(sizes) {
			n = r.IntN(600)
		}
		p := &SecurePayload{Type: PayloadApplicationMessage, Body: bytesOf(n)}
		if i%7 == 0 {
			p.Body = nil // encoded as an empty body
		}
		copy(p.ID[:], bytesOf(16))
		if i%3 == 0 {
			p.Type, p.Body = PayloadAck, nil
		}
		got, err = EncodeSecurePayload(p)
		if err != nil || !bytes.Equal(got, refSecurePayload(t, p)) {
			t.Fatalf("payload type %d, %d-byte body: %x (%v), want %x", p.Type, len(p.Body), got, err, refSecurePayload(t, p))
		}
		back, err := DecodeSecurePayload(got)
		if err != nil || back.ID != p.ID || back.Type != p.Type || !bytes.Equal(back.Body, p.Body) {
			t.Fatalf("payload does not decode back: %+v, %v", back, err)
		}

		e := &Envelope{Header: h, Ciphertext: bytesOf(AEADTagSize + n)}
		got, err = EncodeEnvelope(e)
		if err != nil || !bytes.Equal(got, refEnvelope(t, e, nil)) {
			t.Fatalf("envelope, %d-byte ciphertext: %x (%v), want %x", len(e.Ciphertext), got, err, refEnvelope(t, e, nil))
		}
		if i%5 == 0 {
			// With an initiation (the prekey envelopes before the peer answers).
			in := sampleEnvelope(true).Initiation
			ib, err := EncodePrekeyInitiation(in)
			if err != nil {
				t.Fatal(err)
			}
			e.Initiation = in
			if got, err = EncodeEnvelope(e); err != nil || !bytes.Equal(got, refEnvelope(t, e, ib)) {
				t.Fatalf("envelope with an initiation: %x (%v), want %x", got, err, refEnvelope(t, e, ib))
			}
		}
		if len(got) <= MaxEnvelopeSize {
			if de, err := DecodeEnvelope(got); err != nil || de.Header != h || !bytes.Equal(de.Ciphertext, e.Ciphertext) || (de.Initiation == nil) != (e.Initiation == nil) {
				t.Fatalf("envelope does not decode back: %v", err)
			}
		}
	}
}

// BenchmarkSecureFrames is one message's frame work on both sides: its
// SecurePayload and envelope encoded and decoded (each decode re-encodes
// to check its input is canonical), and its ACK's.
func BenchmarkSecureFrames(b *testing.B) {
	p := &SecurePayload{Type: PayloadApplicationMessage, ID: LogicalMessageID{1}, Body: bytes.Repeat([]byte{0x5a}, 256)}
	ack := &SecurePayload{Type: PayloadAck, ID: LogicalMessageID{1}}
	e := sampleEnvelope(false)
	e.Ciphertext = bytes.Repeat([]byte{0xaa}, 300)
	b.ReportAllocs()
	for b.Loop() {
		for _, q := range []*SecurePayload{p, ack} {
			f, err := EncodeSecurePayload(q)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := DecodeSecurePayload(f); err != nil {
				b.Fatal(err)
			}
			env, err := EncodeEnvelope(e)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := DecodeEnvelope(env); err != nil {
				b.Fatal(err)
			}
		}
	}
}
