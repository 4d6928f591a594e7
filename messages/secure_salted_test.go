package messages

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func sampleSaltedEnvelope(withInit bool) *Envelope {
	e := sampleEnvelope(withInit)
	salt := [HeaderSaltSize]byte{0xde, 0xad}
	salt[31] = 0x5a
	e.Header.Salt = &salt
	return e
}

// A version-2 envelope carries the salt in its header, round-trips, and is
// strict: every single-bit flip is an error or another value; the header
// shape must match the version (a 5-field header under version 1, a
// 4-field one under version 2 and a salt of another size are malformed);
// version 3 is ErrUnsupportedVersion.
func TestSaltedEnvelopeRoundTripAndStrictness(t *testing.T) {
	for _, withInit := range []bool{false, true} {
		e := sampleSaltedEnvelope(withInit)
		b, err := EncodeEnvelope(e)
		if err != nil {
			t.Fatal(err)
		}
		if b[1] != EnvelopeVersionSalted {
			t.Fatalf("version byte %d", b[1])
		}
		got, err := DecodeEnvelope(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Header.Salt == nil || *got.Header.Salt != *e.Header.Salt || got.Header.N != e.Header.N ||
			got.Header.PN != e.Header.PN || got.Header.Session != e.Header.Session || (got.Initiation != nil) != withInit {
			t.Fatalf("round trip: %+v", got.Header)
		}
		if s, init, ok := PeekEnvelope(b); !ok || s != e.Header.Session || init != withInit {
			t.Fatalf("peek: %v %v %v", s, init, ok)
		}
		hdr, _ := EncodeRatchetHeader(&e.Header)
		if !bytes.Contains(b, hdr) || hdr[0] != 0x85 {
			t.Fatalf("the encoded header (bound into the AD) is not the envelope's: %x", hdr)
		}
		for i := range b {
			for bit := range 8 {
				mut := bytes.Clone(b)
				mut[i] ^= 1 << bit
				d, err := DecodeEnvelope(mut)
				if err != nil {
					if !errors.Is(err, ErrMalformed) {
						t.Fatalf("untyped error %v", err)
					}
					continue
				}
				if re, _ := EncodeEnvelope(d); bytes.Equal(re, b) {
					t.Fatalf("flip at %d/%d decodes to the original value", i, bit)
				}
			}
		}
	}

	v2, _ := EncodeEnvelope(sampleSaltedEnvelope(false))
	v1, _ := EncodeEnvelope(sampleEnvelope(false))
	asV1 := bytes.Clone(v2)
	asV1[1] = EnvelopeVersion
	asV2 := bytes.Clone(v1)
	asV2[1] = EnvelopeVersionSalted
	v3 := bytes.Clone(v2)
	v3[1] = 3
	shortSalt := sampleSaltedEnvelope(false)
	hdr, _ := EncodeRatchetHeader(&shortSalt.Header)
	shortHdr := append(bytes.Clone(hdr[:len(hdr)-34]), 0x58, 31)
	shortHdr = append(shortHdr, make([]byte, 31)...)
	short := appendUint(appendArray(nil, 4), EnvelopeVersionSalted)
	short = append(short, shortHdr...)
	short = appendBstr(appendNull(short), make([]byte, AEADTagSize))
	for name, in := range map[string][]byte{"salted header under version 1": asV1, "plain header under version 2": asV2, "31-byte salt": short} {
		if _, err := DecodeEnvelope(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
		if _, _, ok := PeekEnvelope(in); ok && name != "31-byte salt" {
			t.Errorf("%s: peek took it", name)
		}
	}
	if _, err := DecodeEnvelope(v3); !errors.Is(err, ErrUnsupportedVersion) {
		t.Errorf("version 3: %v", err)
	}
}

// The hand-written reader takes every salted envelope the encoder writes,
// at every head size, and agrees with the reflective decoder on any
// one-byte change of it.
func TestReaderTakesSaltedEnvelopes(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 2))
	for _, n := range []uint32{0, 23, 24, 65536, math.MaxUint32} {
		for _, size := range []int{AEADTagSize, 24, 256, 65536} {
			e := sampleSaltedEnvelope(false)
			fill(rng, e.Header.Salt[:])
			e.Header.PN, e.Header.N = n, math.MaxUint32-n
			e.Ciphertext = make([]byte, size)
			fill(rng, e.Ciphertext)
			b, err := EncodeEnvelope(e)
			if err != nil {
				t.Fatal(err)
			}
			if !checkEnvelopeReader(t, b) {
				t.Fatalf("reader refused a canonical salted envelope (pn %d, %d bytes)", n, size)
			}
			if size > 300 {
				continue
			}
			for i := range b {
				c := bytes.Clone(b)
				c[i] ^= byte(1 << rng.IntN(8))
				checkEnvelopeReader(t, c)
			}
		}
	}
}

// FuzzDecodeSaltedEnvelope: whatever DecodeEnvelope accepts is its own
// canonical encoding, of the version its header's shape says, and the
// peek agrees with it.
func FuzzDecodeSaltedEnvelope(f *testing.F) {
	for _, w := range []bool{false, true} {
		b, _ := EncodeEnvelope(sampleSaltedEnvelope(w))
		f.Add(b)
		b, _ = EncodeEnvelope(sampleEnvelope(w))
		f.Add(b)
	}
	f.Add([]byte{0x84, 0x02, 0x85, 0xf6, 0x40})
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := DecodeEnvelope(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		out, err := EncodeEnvelope(e)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("accepted input is not canonical: %v", err)
		}
		if want := envelopeVersionOf(&e.Header); uint64(in[1]) != want {
			t.Fatalf("version %d with a header of version %d", in[1], want)
		}
		if s, init, ok := PeekEnvelope(in); !ok || s != e.Header.Session || init != (e.Initiation != nil) {
			t.Fatalf("peek %v %v %v", s, init, ok)
		}
		checkEnvelopeReader(t, in)
	})
}
