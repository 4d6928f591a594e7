package sign

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/veraison/go-cose"

	"github.com/syncmesh/syncmesh/messages"
)

// coseVerify is go-cose's own verification of a raw COSE_Sign1: the
// oracle for our direct Sig_structure check.
func coseVerify(raw, meshID []byte, pub ed25519.PublicKey) bool {
	var m cose.Sign1Message
	if err := m.UnmarshalCBOR(raw); err != nil {
		return false
	}
	v, err := cose.NewVerifier(cose.AlgorithmEdDSA, pub)
	if err != nil {
		return false
	}
	return m.Verify(meshID, v) == nil
}

// Verify's signature check agrees with go-cose on valid events (signed per
// RFC 8032) and on every single-byte corruption of them that our strict
// parser accepts: on such inputs ZIP-215 and crypto/ed25519 cannot differ
// (the crafted cases where they do are in ed25519_test.go).
func TestVerifyAgreesWithGoCOSE(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s := NewSigner(messages.SiteID{1}, priv)
	kr, _ := NewKeyring(s.Key())
	mesh := []byte("oracle-mesh")
	for i := 0; i < 20; i++ {
		e := &messages.Event{Site: s.Site(), HLC: messages.HLC(i + 1), Schema: "s", Table: "t",
			Key: messages.Columns{"id": messages.MustValue(i)}, Payload: messages.Columns{"v": messages.MustValue(make([]byte, i*7))}}
		raw, err := s.Sign(e, mesh)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Verify(kr, raw, mesh); err != nil || !coseVerify(raw, mesh, s.PublicKey()) {
			t.Fatalf("valid event: ours %v, go-cose %v", err, coseVerify(raw, mesh, s.PublicKey()))
		}
		for pos := 0; pos < len(raw); pos++ {
			bad := append([]byte(nil), raw...)
			bad[pos] ^= 0x01
			_, err := Verify(kr, bad, mesh)
			if err == nil && !coseVerify(bad, mesh, s.PublicKey()) {
				t.Fatalf("byte %d: we accept what go-cose rejects", pos)
			}
		}
		if _, err := Verify(kr, raw, []byte("other")); err == nil {
			t.Fatal("wrong mesh accepted")
		}
	}
}
