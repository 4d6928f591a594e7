package sign

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"testing"

	cose "github.com/veraison/go-cose"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
)

var testMesh = []byte("mesh-test-0001")

// fixture is a site with its signer and a keyring trusting it.
type fixture struct {
	site   messages.SiteID
	priv   ed25519.PrivateKey
	signer *Signer
	kr     *Keyring
}

func newFixture(t testing.TB, seed byte) *fixture {
	t.Helper()
	var site messages.SiteID
	for i := range site {
		site[i] = seed + byte(i)
	}
	s := bytes.Repeat([]byte{seed}, ed25519.SeedSize)
	priv := ed25519.NewKeyFromSeed(s)
	signer := NewSigner(site, priv)
	kr, err := NewKeyring(signer.Key())
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{site: site, priv: priv, signer: signer, kr: kr}
}

func testEvent(site messages.SiteID, hlc messages.HLC) *messages.Event {
	return &messages.Event{
		Site:   site,
		HLC:    hlc,
		Schema: "app",
		Table:  "notes",
		Key:    messages.Columns{"id": messages.MustValue("n1")},
		Payload: messages.Columns{
			"title": messages.MustValue("hello"),
			"body":  messages.Null,
		},
	}
}

func mustSign(t testing.TB, f *fixture, e *messages.Event) []byte {
	t.Helper()
	raw, err := f.signer.Sign(e, testMesh)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func eventsEqual(a, b *messages.Event) bool {
	if a.Site != b.Site || a.HLC != b.HLC || a.Schema != b.Schema || a.Table != b.Table || a.Delete != b.Delete {
		return false
	}
	if (a.Payload == nil) != (b.Payload == nil) {
		return false
	}
	return bytes.Equal(a.Key.Encode(), b.Key.Encode()) && (a.Payload == nil || bytes.Equal(a.Payload.Encode(), b.Payload.Encode()))
}

// cborBytes returns the canonical CBOR encoding of v.
func cborBytes(t testing.TB, v any) []byte {
	t.Helper()
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// forge assembles a tagged COSE_Sign1 from parts and signs it correctly with
// priv over the given protected bytes, so a rejection is due to structure.
func forge(t testing.TB, priv ed25519.PrivateKey, protected map[int64]any, unprotected []byte, payload, mesh []byte) []byte {
	t.Helper()
	protBytes := cborBytes(t, protected)
	tbs := cborBytes(t, []any{"Signature1", protBytes, mesh, payload})
	sig := ed25519.Sign(priv, tbs)
	out := []byte{0xd2, 0x84}
	out = append(out, cborBytes(t, protBytes)...)
	out = append(out, unprotected...)
	out = append(out, cborBytes(t, payload)...)
	out = append(out, cborBytes(t, sig)...)
	return out
}

func TestSignVerifyRoundTrip(t *testing.T) {
	f := newFixture(t, 1)
	for _, e := range []*messages.Event{
		testEvent(f.site, mustHLC(t, 1_700_000_000_000, 3)),
		{Site: f.site, HLC: 42, Schema: "app", Table: "notes", Key: messages.Columns{"id": messages.MustValue(7)}, Delete: true},
		{Site: f.site, HLC: 43, Schema: "app", Table: "notes", Key: messages.Columns{"id": messages.MustValue(7)}, Payload: messages.Columns{}},
	} {
		raw := mustSign(t, f, e)
		if raw[0] != 0xd2 {
			t.Fatalf("signed event not tagged 18: % x", raw[:2])
		}
		v, err := Verify(f.kr, raw, testMesh)
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if !eventsEqual(v.Event, e) {
			t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", v.Event, e)
		}
		if !bytes.Equal(v.Kid, f.signer.Kid()) {
			t.Fatalf("kid %x, want %x", v.Kid, f.signer.Kid())
		}
		if v.ID != eventid.Of(raw) {
			t.Fatal("Verified.ID is not eventid.Of(raw)")
		}
		pe, err := ParseVerified(raw)
		if err != nil || !eventsEqual(pe, e) {
			t.Fatalf("ParseVerified = %+v, %v", pe, err)
		}
		kid, err := PeekKid(raw)
		if err != nil || !bytes.Equal(kid, f.signer.Kid()) {
			t.Fatalf("PeekKid = %x, %v", kid, err)
		}
	}
}

func mustHLC(t testing.TB, ms uint64, l uint16) messages.HLC {
	h, err := messages.NewHLC(ms, l)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestSignedShapeIsTheDocumentedOne(t *testing.T) {
	f := newFixture(t, 2)
	raw := mustSign(t, f, testEvent(f.site, 9))
	var msg cose.Sign1Message
	if err := msg.UnmarshalCBOR(raw); err != nil {
		t.Fatal(err)
	}
	alg, err := msg.Headers.Protected.Algorithm()
	if err != nil || alg != cose.AlgorithmEdDSA {
		t.Fatalf("alg = %v, %v", alg, err)
	}
	if len(msg.Headers.Protected) != 2 || !bytes.Equal(msg.Headers.Protected[cose.HeaderLabelKeyID].([]byte), f.signer.Kid()) {
		t.Fatalf("protected header = %v", msg.Headers.Protected)
	}
	if len(msg.Headers.Unprotected) != 0 {
		t.Fatalf("unprotected header = %v", msg.Headers.Unprotected)
	}
	want, _ := messages.EncodeEvent(testEvent(f.site, 9))
	if !bytes.Equal(msg.Payload, want) {
		t.Fatal("payload is not messages.EncodeEvent(e)")
	}
	// go-cose verifies it independently with external_aad = mesh id.
	ver, _ := cose.NewVerifier(cose.AlgorithmEdDSA, f.signer.PublicKey())
	if err := msg.Verify(testMesh, ver); err != nil {
		t.Fatalf("go-cose Verify: %v", err)
	}
	if err := msg.Verify([]byte("other"), ver); err == nil {
		t.Fatal("go-cose accepted another external_aad")
	}
}

func TestKidFor(t *testing.T) {
	f := newFixture(t, 3)
	kid := KidFor(f.signer.PublicKey())
	if len(kid) != 16 {
		t.Fatalf("kid len %d", len(kid))
	}
	sum := eventid.Of(f.signer.PublicKey()) // BLAKE3-256
	if !bytes.Equal(kid, sum[:16]) {
		t.Fatal("KidFor is not the first 16 bytes of BLAKE3-256(pub)")
	}
	if !bytes.Equal(f.signer.Kid(), kid) {
		t.Fatal("signer kid differs from KidFor")
	}
	g := newFixture(t, 4)
	if bytes.Equal(KidFor(g.signer.PublicKey()), kid) {
		t.Fatal("two keys share a kid")
	}
}

func TestVerifyWrongMeshIDFails(t *testing.T) {
	f := newFixture(t, 5)
	raw := mustSign(t, f, testEvent(f.site, 1))
	_, err := Verify(f.kr, raw, []byte("mesh-other"))
	if !errors.Is(err, ErrBadSignature) || !IsSignatureFailure(err) {
		t.Fatalf("err = %v, want ErrBadSignature", err)
	}
	if _, err := Verify(f.kr, raw, nil); !errors.Is(err, ErrNoMeshID) {
		t.Fatalf("empty mesh id: err = %v", err)
	}
	if _, err := f.signer.Sign(testEvent(f.site, 1), nil); !errors.Is(err, ErrNoMeshID) {
		t.Fatalf("sign with empty mesh id: err = %v", err)
	}
}

func TestVerifyTamperedFails(t *testing.T) {
	f := newFixture(t, 6)
	raw := mustSign(t, f, testEvent(f.site, 1))
	// Every single-byte change anywhere must be rejected: either the
	// structure no longer parses, or the signature no longer verifies, or
	// (kid byte) the kid is unknown. Nothing else is acceptable.
	for i := range raw {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := bytes.Clone(raw)
			b[i] ^= x
			_, err := Verify(f.kr, b, testMesh)
			if err == nil {
				t.Fatalf("tampered byte %d (^%#x) accepted", i, x)
			}
			if !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrMalformedSignature) && !errors.Is(err, ErrUnknownKid) {
				t.Fatalf("tampered byte %d: err = %v", i, err)
			}
		}
	}
	// Targeted: payload byte, signature byte and protected kid byte.
	payloadByte := bytes.Clone(raw)
	payloadByte[len(raw)-70] ^= 1 // inside the payload, just before the signature head
	if _, err := Verify(f.kr, payloadByte, testMesh); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("payload tamper: %v", err)
	}
	sigByte := bytes.Clone(raw)
	sigByte[len(raw)-1] ^= 1
	if _, err := Verify(f.kr, sigByte, testMesh); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signature tamper: %v", err)
	}
	// Protected header with a second trusted key's kid: parses, signature fails.
	g := newFixture(t, 7)
	kr, _ := f.kr.With(Key{Kid: g.signer.Kid(), Site: f.site, PublicKey: g.signer.PublicKey()})
	swapped := bytes.Replace(raw, f.signer.Kid(), g.signer.Kid(), 1)
	if _, err := Verify(kr, swapped, testMesh); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("protected header tamper: %v", err)
	}
}

func TestVerifyUnknownKid(t *testing.T) {
	f := newFixture(t, 8)
	g := newFixture(t, 9)
	raw := mustSign(t, f, testEvent(f.site, 1))
	_, err := Verify(g.kr, raw, testMesh)
	if !errors.Is(err, ErrUnknownKid) || !IsSignatureFailure(err) {
		t.Fatalf("err = %v, want ErrUnknownKid", err)
	}
	if _, err := Verify(nil, raw, testMesh); !errors.Is(err, ErrUnknownKid) {
		t.Fatalf("nil keyring: err = %v", err)
	}
	empty, _ := NewKeyring()
	if _, err := Verify(empty, raw, testMesh); !errors.Is(err, ErrUnknownKid) {
		t.Fatalf("empty keyring: err = %v", err)
	}
}

func TestVerifyRejectsMalformedCOSE(t *testing.T) {
	f := newFixture(t, 10)
	e := testEvent(f.site, 1)
	payload, err := messages.EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	kid := f.signer.Kid()
	good := forge(t, f.priv, map[int64]any{1: -8, 4: kid}, []byte{0xa0}, payload, testMesh)
	if _, err := Verify(f.kr, good, testMesh); err != nil {
		t.Fatalf("forge helper builds a valid event, but: %v", err)
	}
	untagged, err := cose.Sign1Untagged(nil, mustCoseSigner(t, f.priv), cose.Headers{Protected: cose.ProtectedHeader{1: cose.AlgorithmEdDSA, 4: kid}}, payload, testMesh)
	if err != nil {
		t.Fatal(err)
	}
	wrongTag := bytes.Clone(good)
	wrongTag[0] = 0xd1 // tag 17 (COSE_Mac0)
	detached := append([]byte{0xd2, 0x84}, cborBytes(t, cborBytes(t, map[int64]any{1: -8, 4: kid}))...)
	detached = append(detached, 0xa0, 0xf6)
	detached = append(detached, cborBytes(t, make([]byte, 64))...)

	cases := []struct {
		name string
		raw  []byte
	}{
		{"empty", nil},
		{"untagged", untagged},
		{"wrong tag", wrongTag},
		{"alg ES256", forge(t, f.priv, map[int64]any{1: -7, 4: kid}, []byte{0xa0}, payload, testMesh)},
		{"alg as text", forge(t, f.priv, map[int64]any{1: "EdDSA", 4: kid}, []byte{0xa0}, payload, testMesh)},
		{"no alg", forge(t, f.priv, map[int64]any{4: kid}, []byte{0xa0}, payload, testMesh)},
		{"no kid", forge(t, f.priv, map[int64]any{1: -8}, []byte{0xa0}, payload, testMesh)},
		{"kid as text", forge(t, f.priv, map[int64]any{1: -8, 4: string(kid)}, []byte{0xa0}, payload, testMesh)},
		{"empty kid", forge(t, f.priv, map[int64]any{1: -8, 4: []byte{}}, []byte{0xa0}, payload, testMesh)},
		{"extra protected param", forge(t, f.priv, map[int64]any{1: -8, 4: kid, 3: "application/cbor"}, []byte{0xa0}, payload, testMesh)},
		{"crit in protected", forge(t, f.priv, map[int64]any{1: -8, 4: kid, 2: []any{4}}, []byte{0xa0}, payload, testMesh)},
		{"kid in unprotected", forge(t, f.priv, map[int64]any{1: -8, 4: kid}, cborBytes(t, map[int64]any{4: kid}), payload, testMesh)},
		{"kid only in unprotected", forge(t, f.priv, map[int64]any{1: -8}, cborBytes(t, map[int64]any{4: kid}), payload, testMesh)},
		{"other unprotected param", forge(t, f.priv, map[int64]any{1: -8, 4: kid}, cborBytes(t, map[int64]any{-65537: 1}), payload, testMesh)},
		{"unprotected not a map", forge(t, f.priv, map[int64]any{1: -8, 4: kid}, []byte{0x80}, payload, testMesh)},
		{"detached payload", detached},
		{"trailing byte", append(bytes.Clone(good), 0x00)},
		{"truncated", good[:len(good)-1]},
		{"array of 3", append([]byte{0xd2, 0x83}, good[2:]...)},
		{"short signature", bytes.Replace(good, good[len(good)-66:], cborBytes(t, make([]byte, 63)), 1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Verify(f.kr, c.raw, testMesh)
			if !errors.Is(err, ErrMalformedSignature) || !IsSignatureFailure(err) {
				t.Fatalf("err = %v, want ErrMalformedSignature", err)
			}
			if _, err := ParseVerified(c.raw); !errors.Is(err, ErrMalformedSignature) {
				t.Fatalf("ParseVerified err = %v, want ErrMalformedSignature", err)
			}
		})
	}
	// Named reasons for the two cases the apply path logs most.
	if _, err := Verify(f.kr, cases[1].raw, testMesh); err == nil || !bytes.Contains([]byte(err.Error()), []byte("untagged")) {
		t.Fatalf("untagged reason: %v", err)
	}
	if _, err := Verify(f.kr, cases[11].raw, testMesh); err == nil || !bytes.Contains([]byte(err.Error()), []byte("kid in the unprotected")) {
		t.Fatalf("unprotected kid reason: %v", err)
	}
}

// A relay must not be able to mint new event ids for a signed event by
// re-encoding its unsigned envelope (event_id is BLAKE3 of the bytes).
func TestVerifyRejectsNonShortestEnvelope(t *testing.T) {
	f := newFixture(t, 11)
	raw := mustSign(t, f, testEvent(f.site, 1))
	// The signature head is 0x58 0x40; re-encode it as 0x59 0x00 0x40.
	i := len(raw) - 66
	if raw[i] != 0x58 || raw[i+1] != 0x40 {
		t.Fatalf("unexpected signature head % x", raw[i:i+2])
	}
	long := append(append(bytes.Clone(raw[:i]), 0x59, 0x00, 0x40), raw[i+2:]...)
	if _, err := Verify(f.kr, long, testMesh); !errors.Is(err, ErrMalformedSignature) {
		t.Fatalf("non-shortest length accepted: %v", err)
	}
}

func mustCoseSigner(t testing.TB, priv ed25519.PrivateKey) cose.Signer {
	s, err := cose.NewSigner(cose.AlgorithmEdDSA, priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSiteMismatch(t *testing.T) {
	f := newFixture(t, 12)
	other := newFixture(t, 13)
	// Sign refuses an event of another site.
	if _, err := f.signer.Sign(testEvent(other.site, 1), testMesh); !errors.Is(err, ErrSiteMismatch) {
		t.Fatalf("Sign: err = %v", err)
	}
	// A validly signed event whose site is not the key's site is refused.
	payload, _ := messages.EncodeEvent(testEvent(other.site, 1))
	raw := forge(t, f.priv, map[int64]any{1: -8, 4: f.signer.Kid()}, []byte{0xa0}, payload, testMesh)
	_, err := Verify(f.kr, raw, testMesh)
	if !errors.Is(err, ErrSiteMismatch) || !IsSignatureFailure(err) {
		t.Fatalf("Verify: err = %v, want ErrSiteMismatch", err)
	}
}

func TestRetirementCutoff(t *testing.T) {
	f := newFixture(t, 14)
	cutoff := mustHLC(t, 1_700_000_000_000, 5)
	key := f.signer.Key()
	key.Cutoff = cutoff
	kr, err := f.kr.With(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		hlc  messages.HLC
		want error
	}{
		{cutoff - 1, nil},
		{cutoff, nil},
		{cutoff + 1, ErrRetired},
		{mustHLC(t, 1_700_000_000_001, 0), ErrRetired},
	} {
		raw := mustSign(t, f, testEvent(f.site, c.hlc))
		_, err := Verify(kr, raw, testMesh)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Fatalf("hlc %s: err = %v, want %v", c.hlc, err, c.want)
		}
		if c.want != nil && !IsSignatureFailure(err) {
			t.Fatal("ErrRetired is not a signature failure")
		}
		// The unretired snapshot still accepts everything.
		if _, err := Verify(f.kr, raw, testMesh); err != nil {
			t.Fatalf("old snapshot: %v", err)
		}
	}
}

func TestPayloadDecodeErrorsWrapMessagesErrors(t *testing.T) {
	f := newFixture(t, 15)
	kid := f.signer.Kid()
	nullKey := cborBytes(t, map[string]any{"v": 1, "site": f.site[:], "hlc": 1, "schema": "s", "table": "t", "key": nil, "payload": map[string]any{}})
	emptyKey := cborBytes(t, map[string]any{"v": 1, "site": f.site[:], "hlc": 1, "schema": "s", "table": "t", "key": map[string]any{}, "payload": nil})
	v2 := cborBytes(t, map[string]any{"v": 2, "site": f.site[:], "hlc": 1, "schema": "s", "table": "t", "key": map[string]any{"id": 1}, "payload": nil})
	for name, p := range map[string][]byte{"null key": nullKey, "empty key": emptyKey, "v2": v2, "garbage": {0xff}, "empty": {}} {
		raw := forge(t, f.priv, map[int64]any{1: -8, 4: kid}, []byte{0xa0}, p, testMesh)
		_, err := Verify(f.kr, raw, testMesh)
		if !errors.Is(err, messages.ErrMalformed) {
			t.Fatalf("%s: err = %v, want messages.ErrMalformed", name, err)
		}
		if IsSignatureFailure(err) {
			t.Fatalf("%s: a signed but malformed payload is not a signature failure: %v", name, err)
		}
		wantEmpty := name == "null key" || name == "empty key"
		if errors.Is(err, messages.ErrEmptyRowKey) != wantEmpty {
			t.Fatalf("%s: errors.Is(ErrEmptyRowKey) = %v", name, !wantEmpty)
		}
		if _, err := ParseVerified(raw); !errors.Is(err, messages.ErrMalformed) {
			t.Fatalf("%s: ParseVerified err = %v", name, err)
		}
	}
	// The same null-key payload with a bad signature fails the signature
	// first: the payload is never decoded (SSP/1 §12 step 1).
	raw := forge(t, f.priv, map[int64]any{1: -8, 4: kid}, []byte{0xa0}, nullKey, []byte("other mesh"))
	if _, err := Verify(f.kr, raw, testMesh); !errors.Is(err, ErrBadSignature) || errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("unauthenticated malformed payload: err = %v, want ErrBadSignature only", err)
	}
}

func TestVerifyTooLarge(t *testing.T) {
	f := newFixture(t, 16)
	big := make([]byte, MaxSignedSize+1)
	big[0], big[1] = 0xd2, 0x84
	_, err := Verify(f.kr, big, testMesh)
	if !errors.Is(err, ErrTooLarge) || IsSignatureFailure(err) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if _, err := ParseVerified(big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ParseVerified err = %v", err)
	}
}

func TestKeyringValidationAndCopyOnWrite(t *testing.T) {
	f := newFixture(t, 17)
	g := newFixture(t, 18)
	if _, err := NewKeyring(Key{Kid: nil, PublicKey: f.signer.PublicKey()}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty kid: %v", err)
	}
	if _, err := NewKeyring(Key{Kid: make([]byte, 65), PublicKey: f.signer.PublicKey()}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("65-byte kid: %v", err)
	}
	if _, err := NewKeyring(Key{Kid: make([]byte, 64), PublicKey: f.signer.PublicKey()}); err != nil {
		t.Fatalf("64-byte kid: %v", err)
	}
	if _, err := NewKeyring(Key{Kid: []byte{1}, PublicKey: make([]byte, 31)}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("short key: %v", err)
	}
	if _, err := NewKeyring(f.signer.Key(), f.signer.Key()); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("duplicate kid: %v", err)
	}
	if _, err := f.kr.With(Key{Kid: []byte{1}}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("With invalid: %v", err)
	}

	old := f.kr
	next, err := old.With(g.signer.Key())
	if err != nil {
		t.Fatal(err)
	}
	if old.Len() != 1 || next.Len() != 2 {
		t.Fatalf("lens %d %d", old.Len(), next.Len())
	}
	if _, ok := old.Lookup(g.signer.Kid()); ok {
		t.Fatal("With modified the old snapshot")
	}
	retired := f.signer.Key()
	retired.Cutoff = 100
	next2, _ := next.With(retired)
	if k, _ := next.Lookup(f.signer.Kid()); k.Cutoff != 0 {
		t.Fatal("replacing a kid modified the previous snapshot")
	}
	if k, _ := next2.Lookup(f.signer.Kid()); k.Cutoff != 100 || next2.Len() != 2 {
		t.Fatalf("replace by kid: %+v, len %d", k, next2.Len())
	}
	// Callers cannot reach inside a snapshot through returned or given slices.
	k, _ := next.Lookup(g.signer.Kid())
	k.PublicKey[0] ^= 0xff
	k.Kid[0] ^= 0xff
	if k2, ok := next.Lookup(g.signer.Kid()); !ok || !bytes.Equal(k2.PublicKey, g.signer.PublicKey()) {
		t.Fatal("Lookup exposed internal slices")
	}
	input := g.signer.Key()
	kr3, _ := NewKeyring(input)
	input.PublicKey[0] ^= 0xff
	if k3, _ := kr3.Lookup(g.signer.Kid()); !bytes.Equal(k3.PublicKey, g.signer.PublicKey()) {
		t.Fatal("NewKeyring kept the caller's slice")
	}
	keys := next.Keys()
	if len(keys) != 2 || bytes.Compare(keys[0].Kid, keys[1].Kid) >= 0 {
		t.Fatalf("Keys not sorted: %v", keys)
	}
	var nilKR *Keyring
	if nilKR.Len() != 0 || nilKR.Keys() != nil {
		t.Fatal("nil keyring not empty")
	}
	if k, err := nilKR.With(f.signer.Key()); err != nil || k.Len() != 1 {
		t.Fatalf("nil.With: %v", err)
	}
}

func TestInvalidPrivateKey(t *testing.T) {
	s := NewSigner(messages.SiteID{}, ed25519.PrivateKey{1, 2, 3})
	if _, err := s.Sign(testEvent(messages.SiteID{}, 1), testMesh); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("err = %v", err)
	}
}

func TestSignRejectsInvalidEvent(t *testing.T) {
	f := newFixture(t, 19)
	e := testEvent(f.site, 1)
	e.Key = nil
	if _, err := f.signer.Sign(e, testMesh); !errors.Is(err, messages.ErrEmptyRowKey) {
		t.Fatalf("err = %v", err)
	}
	if _, err := f.signer.Sign(nil, testMesh); err == nil {
		t.Fatal("nil event signed")
	}
}

// Many goroutines verify against one shared keyring while another goroutine
// publishes new snapshots; run with -race.
func TestConcurrentVerify(t *testing.T) {
	f := newFixture(t, 20)
	const events = 16
	raws := make([][]byte, events)
	for i := range raws {
		raws[i] = mustSign(t, f, testEvent(f.site, messages.HLC(i+1)))
	}
	var mu sync.Mutex
	current := f.kr
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				mu.Lock()
				kr := current
				mu.Unlock()
				raw := raws[(w+i)%events]
				v, err := Verify(kr, raw, testMesh)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if v.Event.Site != f.site || v.ID != eventid.Of(raw) {
					errs <- fmt.Errorf("worker %d: wrong result", w)
					return
				}
				_ = kr.Keys()
			}
		}(w)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 20; i++ {
			mu.Lock()
			next, err := current.With(Key{Kid: []byte{byte(i) + 1}, Site: f.site, PublicKey: f.signer.PublicKey()})
			if err == nil {
				current = next
			}
			mu.Unlock()
		}
	}()
	// Concurrent signing with one Signer.
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if _, err := f.signer.Sign(testEvent(f.site, messages.HLC(w*100+i+1)), testMesh); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestEventIDIsOverRawBytes(t *testing.T) {
	f := newFixture(t, 21)
	e := testEvent(f.site, 1)
	raw1 := mustSign(t, f, e)
	v1, err := Verify(f.kr, raw1, testMesh)
	if err != nil {
		t.Fatal(err)
	}
	// The same event content under a differently encoded payload (a
	// non-canonical but valid CBOR map order) is signed validly, decodes to
	// the same event, and has a different id.
	payload, _ := messages.EncodeEvent(e)
	alt := reorderedEvent(t, e)
	if bytes.Equal(alt, payload) {
		t.Fatal("helper did not change the encoding")
	}
	raw2 := forge(t, f.priv, map[int64]any{1: -8, 4: f.signer.Kid()}, []byte{0xa0}, alt, testMesh)
	v2, err := Verify(f.kr, raw2, testMesh)
	if err != nil {
		t.Fatal(err)
	}
	if !eventsEqual(v1.Event, v2.Event) {
		t.Fatal("events differ")
	}
	if v1.ID == v2.ID {
		t.Fatal("different bytes gave the same event id")
	}
	if v1.ID != eventid.Of(raw1) || v2.ID != eventid.Of(raw2) {
		t.Fatal("ID is not BLAKE3 of the raw bytes")
	}
}

// reorderedEvent encodes e with its top-level map keys in reverse
// canonical order: valid, strictly decodable, but not canonical.
func reorderedEvent(t testing.TB, e *messages.Event) []byte {
	t.Helper()
	var payload []byte
	if e.Delete {
		payload = []byte{0xf6}
	} else {
		payload = e.Payload.Encode()
	}
	fields := []struct {
		k string
		v []byte
	}{
		{"payload", payload},
		{"key", e.Key.Encode()},
		{"table", cborBytes(t, e.Table)},
		{"schema", cborBytes(t, e.Schema)},
		{"hlc", cborBytes(t, uint64(e.HLC))},
		{"site", cborBytes(t, e.Site[:])},
		{"v", cborBytes(t, 1)},
	}
	out := []byte{0xa7}
	for _, f := range fields {
		out = append(out, cborBytes(t, f.k)...)
		out = append(out, f.v...)
	}
	return out
}

func BenchmarkSign(b *testing.B) {
	f := newFixture(b, 30)
	e := testEvent(f.site, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.signer.Sign(e, testMesh); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	f := newFixture(b, 31)
	raw := mustSign(b, f, testEvent(f.site, 1))
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := Verify(f.kr, raw, testMesh); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyParallel(b *testing.B) {
	f := newFixture(b, 32)
	raw := mustSign(b, f, testEvent(f.site, 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := Verify(f.kr, raw, testMesh); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkEventID(b *testing.B) {
	f := newFixture(b, 33)
	raw := mustSign(b, f, testEvent(f.site, 1))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		_ = eventid.Of(raw)
	}
}
