package messages

import (
	"bytes"
	"testing"
)

// FuzzDecodePrekeyInitiation: never panics; an accepted initiation
// re-encodes to exactly the input (the wire decoders accept only the
// canonical encoding, so one initiation has one session id).
var (
	fuzzFrom = DeviceAddress{User: "alice", Device: 1}
	fuzzTo   = DeviceAddress{User: "bob", Device: 2}
)

func FuzzDecodePrekeyInitiation(f *testing.F) {
	otpk := uint32(7)
	for _, in := range []*PrekeyInitiation{
		{SignedPrekeyID: 1, KEMPrekeyID: 2, KEMCiphertext: make([]byte, MLKEM768CiphertextSize), From: fuzzFrom, To: fuzzTo},
		{SignedPrekeyID: 3, KEMPrekeyID: 4, OneTimePrekeyID: &otpk, KEMCiphertext: bytes.Repeat([]byte{9}, MLKEM768CiphertextSize),
			From: fuzzFrom, To: fuzzTo, Signature: [SignatureSize]byte{5}},
	} {
		enc, err := EncodePrekeyInitiation(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(enc)
		f.Add(enc[:len(enc)-1])
	}
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodePrekeyInitiation(data)
		if err != nil {
			return
		}
		again, err := EncodePrekeyInitiation(in)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted a non-canonical initiation: %v", err)
		}
	})
}
