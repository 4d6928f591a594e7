package messages

import (
	"bytes"
	"errors"
	"testing"
)

func sampleEnvelope(withInit bool) *Envelope {
	e := &Envelope{
		Header:     RatchetHeader{DH: [32]byte{1, 2, 3}, PN: 7, N: 300},
		Ciphertext: bytes.Repeat([]byte{0xaa}, 40),
	}
	e.Header.Session[0] = 9
	if withInit {
		otpk := uint32(77)
		e.Initiation = &PrekeyInitiation{
			Ephemeral: [32]byte{4}, SignedPrekeyID: 5, KEMPrekeyID: 6, OneTimePrekeyID: &otpk,
			KEMCiphertext: bytes.Repeat([]byte{0x33}, MLKEM768CiphertextSize),
			From:          DeviceAddress{User: "alice", Device: 1}, To: DeviceAddress{User: "bob", Device: 2},
			Signature: [SignatureSize]byte{8},
		}
		e.Initiation.Identity.Sign[0], e.Initiation.Identity.DH[0] = 1, 2
	}
	return e
}

func sampleBundle(withOTPK bool) *PrekeyBundle {
	b := &PrekeyBundle{
		SignedPrekey: SignedPrekey{ID: 1, Public: [32]byte{1}, Signature: [64]byte{2}},
		KEMPrekey:    KEMPrekey{ID: 2, Public: bytes.Repeat([]byte{7}, MLKEM768EncapsulationKeySize), Signature: [64]byte{3}},
	}
	b.Identity.Sign[31] = 8
	if withOTPK {
		b.OneTimePrekey = &OneTimePrekey{ID: 3, Public: [32]byte{5}}
	}
	return b
}

func TestSecurePayloadRoundTrip(t *testing.T) {
	for _, p := range []*SecurePayload{
		{Type: PayloadApplicationMessage, ID: LogicalMessageID{1, 2}, Body: []byte("hello")},
		{Type: PayloadApplicationMessage, ID: LogicalMessageID{3}, Body: []byte{}},
		{Type: PayloadAck, ID: LogicalMessageID{4}},
		{Type: PayloadHeld, ID: LogicalMessageID{5}, Digest: [32]byte{6, 7}},
	} {
		b, err := EncodeSecurePayload(p)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 0x83 || b[1] != SecurePayloadVersion || b[2] != byte(p.Type) {
			t.Fatalf("frame must be [1, type, body]: % x", b[:3])
		}
		got, err := DecodeSecurePayload(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != p.Type || got.ID != p.ID || !bytes.Equal(got.Body, p.Body) || got.Digest != p.Digest {
			t.Fatalf("round trip: %+v != %+v", got, p)
		}
	}
	if _, err := EncodeSecurePayload(&SecurePayload{Type: 9}); err == nil {
		t.Fatal("unknown type encoded")
	}
	if _, err := EncodeSecurePayload(&SecurePayload{Type: PayloadAck, Body: []byte{1}}); err == nil {
		t.Fatal("ack with body encoded")
	}
	if _, err := EncodeSecurePayload(&SecurePayload{Type: PayloadHeld, Body: []byte{}}); err == nil {
		t.Fatal("held receipt with body encoded")
	}
	if _, err := EncodeSecurePayload(&SecurePayload{Type: PayloadAck, Digest: [32]byte{1}}); err == nil {
		t.Fatal("ack with digest encoded")
	}
}

// TestHeldPayloadIsCanonical: the hand-written held frame is the Core
// Deterministic encoding the reflective codec writes, and every malformed
// variant is refused with ErrMalformed.
func TestHeldPayloadIsCanonical(t *testing.T) {
	p := &SecurePayload{Type: PayloadHeld, ID: LogicalMessageID{1}, Digest: [32]byte{2}}
	b, err := EncodeSecurePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	body, err := Marshal(&wireHeld{ID: p.ID[:], Digest: p.Digest[:]})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Marshal(&wirePayloadFrame{V: SecurePayloadVersion, Type: uint64(PayloadHeld), Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("held frame % x, canonical % x", b, want)
	}
	ack, _ := EncodeSecurePayload(&SecurePayload{Type: PayloadAck, ID: p.ID})
	// b is 83 01 03 a2 62 'i' 'd' 50 <id> ...: the id's head at b[7].
	long := append(append(bytes.Clone(b[:7]), 0x58, 0x10), b[8:]...)
	cases := map[string][]byte{
		"held without digest": append([]byte{0x83, 0x01, 0x03}, ack[3:]...),
		"ack with digest":     append([]byte{0x83, 0x01, 0x02}, b[3:]...),
		"short digest":        append(bytes.Clone(b[:len(b)-34]), 0x58, 0x1f, 0x00),
		"non-minimal id head": long,
		"trailing":            append(bytes.Clone(b), 0),
	}
	for name, in := range cases {
		if _, err := DecodeSecurePayload(in); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestSecurePayloadStrict(t *testing.T) {
	good, _ := EncodeSecurePayload(&SecurePayload{Type: PayloadAck, ID: LogicalMessageID{1}})
	cases := map[string][]byte{
		"trailing":          append(bytes.Clone(good), 0),
		"version 2":         append([]byte{0x83, 0x02}, good[2:]...),
		"unknown type":      append([]byte{0x83, 0x01, 0x04}, good[3:]...),
		"type 0x101":        append([]byte{0x83, 0x01, 0x19, 0x01, 0x01}, good[3:]...),
		"non-minimal uint":  append([]byte{0x83, 0x18, 0x01}, good[2:]...),
		"short id":          {0x83, 0x01, 0x02, 0xa1, 0x62, 'i', 'd', 0x41, 0x00},
		"app without body":  append([]byte{0x83, 0x01, 0x01}, good[3:]...),
		"unknown field":     {0x83, 0x01, 0x02, 0xa2, 0x61, 'x', 0x00, 0x62, 'i', 'd', 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"empty":             {},
		"not an array":      {0xa0},
		"too large":         make([]byte, MaxSecurePayloadSize+1),
		"indefinite length": {0x9f, 0x01, 0x02, 0xff},
	}
	for name, in := range cases {
		_, err := DecodeSecurePayload(in)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := DecodeSecurePayload(cases["version 2"]); !errors.Is(err, ErrUnsupportedVersion) {
		t.Errorf("version: %v", err)
	}
	if _, err := DecodeSecurePayload(cases["too large"]); !errors.Is(err, ErrTooLarge) {
		t.Errorf("size: %v", err)
	}
	if _, err := DecodeSecurePayload(cases["trailing"]); !errors.Is(err, ErrTrailingBytes) {
		t.Errorf("trailing: %v", err)
	}
}

func TestEnvelopeRoundTripAndStrictness(t *testing.T) {
	for _, withInit := range []bool{false, true} {
		e := sampleEnvelope(withInit)
		b, err := EncodeEnvelope(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeEnvelope(b)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := EncodeEnvelope(got)
		if !bytes.Equal(b, again) || got.Header != e.Header || (got.Initiation != nil) != withInit {
			t.Fatal("envelope round trip")
		}
		if withInit && *got.Initiation.OneTimePrekeyID != 77 {
			t.Fatal("otpk id lost")
		}
		if _, err := DecodeEnvelope(append(bytes.Clone(b), 0)); !errors.Is(err, ErrTrailingBytes) {
			t.Fatalf("trailing: %v", err)
		}
		// Every single-bit flip is an error or a different value, never an
		// alias of the same value.
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
				re, _ := EncodeEnvelope(d)
				if bytes.Equal(re, b) {
					t.Fatalf("flip at %d/%d decodes to the original value", i, bit)
				}
			}
		}
	}
	short := sampleEnvelope(false)
	short.Ciphertext = []byte{1}
	if _, err := EncodeEnvelope(short); err == nil {
		t.Fatal("ciphertext shorter than a tag encoded")
	}
	ib, _ := EncodePrekeyInitiation(sampleEnvelope(true).Initiation)
	in, err := DecodePrekeyInitiation(ib)
	if err != nil || in.SignedPrekeyID != 5 {
		t.Fatalf("initiation round trip: %v", err)
	}
	if _, err := DecodePrekeyInitiation(ib[:len(ib)-1]); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated initiation: %v", err)
	}
}

func TestPrekeyBundleRoundTripAndStrictness(t *testing.T) {
	for _, with := range []bool{false, true} {
		b := sampleBundle(with)
		enc, err := EncodePrekeyBundle(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodePrekeyBundle(enc)
		if err != nil {
			t.Fatal(err)
		}
		if got.Identity != b.Identity || got.SignedPrekey != b.SignedPrekey || !bytes.Equal(got.KEMPrekey.Public, b.KEMPrekey.Public) ||
			(got.OneTimePrekey != nil) != with {
			t.Fatal("bundle round trip")
		}
	}
	bad := sampleBundle(false)
	bad.KEMPrekey.Public = bad.KEMPrekey.Public[:10]
	if _, err := EncodePrekeyBundle(bad); err == nil {
		t.Fatal("short KEM key encoded")
	}
	enc, _ := EncodePrekeyBundle(sampleBundle(true))
	for _, in := range [][]byte{enc[:len(enc)-1], append(bytes.Clone(enc), 1), make([]byte, MaxPrekeyBundleSize+1), {0x80}} {
		if _, err := DecodePrekeyBundle(in); !errors.Is(err, ErrMalformed) {
			t.Fatalf("bad bundle: %v", err)
		}
	}
}

func TestDeviceAddress(t *testing.T) {
	a := DeviceAddress{User: "alice", Device: 2}
	if a.Validate() != nil || a.String() != "alice.2" {
		t.Fatal(a.String())
	}
	if (DeviceAddress{User: "a.b", Device: 1}).String() != `"a.b".1` {
		t.Fatal("dotted user not quoted")
	}
	if (DeviceAddress{}).Validate() == nil || (DeviceAddress{User: string(make([]byte, 256))}).Validate() == nil {
		t.Fatal("invalid address accepted")
	}
	if a.Compare(DeviceAddress{User: "alice", Device: 3}) >= 0 || a.Compare(DeviceAddress{User: "alicf"}) >= 0 || a.Compare(a) != 0 {
		t.Fatal("Compare")
	}
	b, err := Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back DeviceAddress
	if err := Unmarshal("address", b, &back, 1024); err != nil || back != a {
		t.Fatalf("address codec: %v", err)
	}
}

// FuzzDecodeSecurePayload: no panics, typed errors, and accepted input is
// exactly the canonical encoding of what it decodes to.
func FuzzDecodeSecurePayload(f *testing.F) {
	for _, p := range []*SecurePayload{
		{Type: PayloadApplicationMessage, ID: LogicalMessageID{1}, Body: []byte("x")},
		{Type: PayloadAck, ID: LogicalMessageID{2}},
		{Type: PayloadHeld, ID: LogicalMessageID{3}, Digest: [32]byte{4}},
	} {
		b, _ := EncodeSecurePayload(p)
		f.Add(b)
	}
	f.Add([]byte{0x83, 0x01, 0x01, 0xa0})
	f.Add([]byte{0x83, 0x01, 0x03, 0xa0})
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := DecodeSecurePayload(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		out, err := EncodeSecurePayload(p)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("accepted input is not canonical: %v", err)
		}
	})
}

// FuzzDecodeHeldPayload: the held receipt's decoder never panics, gives
// typed errors, and accepts only the canonical encoding of a held receipt
// (or of another frame type) — fuzzing from held frames.
func FuzzDecodeHeldPayload(f *testing.F) {
	b, _ := EncodeSecurePayload(&SecurePayload{Type: PayloadHeld, ID: LogicalMessageID{9}, Digest: [32]byte{1, 2, 3}})
	f.Add(b)
	f.Add(append(bytes.Clone(b[:len(b)-34]), 0x40))
	f.Add([]byte{0x83, 0x01, 0x03, 0xa2, 0x62, 'i', 'd', 0x40, 0x66, 'd', 'i', 'g', 'e', 's', 't', 0x40})
	f.Fuzz(func(t *testing.T, in []byte) {
		p, err := DecodeSecurePayload(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		if p.Type == PayloadHeld && p.Body != nil {
			t.Fatal("held receipt decoded with a body")
		}
		out, err := EncodeSecurePayload(p)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("accepted input is not canonical: %v", err)
		}
	})
}

func FuzzDecodeEnvelope(f *testing.F) {
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
	})
}

func FuzzDecodePrekeyBundle(f *testing.F) {
	for _, w := range []bool{false, true} {
		b, _ := EncodePrekeyBundle(sampleBundle(w))
		f.Add(b)
	}
	f.Add([]byte{0x86, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		b, err := DecodePrekeyBundle(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		out, err := EncodePrekeyBundle(b)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("accepted input is not canonical: %v", err)
		}
	})
}

// TestPrekeyInitiationVersion1Refused: a version-1 initiation (no
// addresses, no signature) is named as an unsupported version, and the
// signature covers every other field of version 2.
func TestPrekeyInitiationVersion1Refused(t *testing.T) {
	in := sampleEnvelope(true).Initiation
	v1, err := Marshal(&wireInitiationV1{IKSign: in.Identity.Sign[:], IKDH: in.Identity.DH[:], Ephemeral: in.Ephemeral[:],
		SPKID: in.SignedPrekeyID, KEMID: in.KEMPrekeyID, OTPKID: in.OneTimePrekeyID, KEMCT: in.KEMCiphertext})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodePrekeyInitiation(v1); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("version 1 initiation: %v, want ErrUnsupportedVersion", err)
	}
	body, err := PrekeyInitiationSigningBytes(in)
	if err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(c *PrekeyInitiation){
		"from":      func(c *PrekeyInitiation) { c.From.Device++ },
		"to":        func(c *PrekeyInitiation) { c.To.User = "mallory" },
		"ik dh":     func(c *PrekeyInitiation) { c.Identity.DH[1] ^= 1 },
		"ephemeral": func(c *PrekeyInitiation) { c.Ephemeral[1] ^= 1 },
		"kem ct":    func(c *PrekeyInitiation) { c.KEMCiphertext = bytes.Repeat([]byte{0x34}, MLKEM768CiphertextSize) },
	} {
		c := *in
		mut(&c)
		other, err := PrekeyInitiationSigningBytes(&c)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(body, other) {
			t.Errorf("%s is not covered by the signed bytes", name)
		}
	}
	c := *in
	c.Signature[0] ^= 1
	if other, _ := PrekeyInitiationSigningBytes(&c); !bytes.Equal(body, other) {
		t.Error("the signed bytes depend on the signature")
	}
	c = *in
	c.From = DeviceAddress{}
	if _, err := EncodePrekeyInitiation(&c); err == nil {
		t.Error("an initiation without a from address was encoded")
	}
}
