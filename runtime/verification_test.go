package runtime

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"errors"
	"testing"

	"filippo.io/edwards25519"
	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
)

// zipPeer is a peer whose signing scalar the test holds, so it can build
// signatures RFC 8032 signers never produce (torsion in R).
type zipPeer struct {
	*peer
	a   *edwards25519.Scalar
	pub []byte
}

func newZipPeer(t *testing.T, site byte) *zipPeer {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h := sha512.Sum512(priv.Seed())
	a, _ := edwards25519.NewScalar().SetBytesWithClamping(h[:32])
	s := sign.NewSigner(messages.SiteID{site}, priv)
	return &zipPeer{peer: &peer{t: t, signer: s}, a: a, pub: s.PublicKey()}
}

func coseBytes(t *testing.T, v any) []byte {
	em, _ := cbor.CoreDetEncOptions().EncMode()
	b, err := em.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// signWithTorsion signs e with R = [r]B + T for a point T of order 8: the
// cofactored (ZIP-215) equation holds, the cofactorless one of
// crypto/ed25519 does not.
func (p *zipPeer) signWithTorsion(t *testing.T, e *messages.Event, kid []byte, pubEnc []byte) []byte {
	e.Site = p.signer.Site()
	payload, err := messages.EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	prot := coseBytes(t, map[int64]any{1: -8, 4: kid})
	tbs := coseBytes(t, []any{"Signature1", prot, testMesh, payload})
	var rb [64]byte
	_, _ = rand.Read(rb[:])
	r, _ := edwards25519.NewScalar().SetUniformBytes(rb[:])
	T, _ := new(edwards25519.Point).SetBytes(mustHex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"))
	R := new(edwards25519.Point).ScalarBaseMult(r)
	rEnc := R.Add(R, T).Bytes()
	h := sha512.New()
	h.Write(rEnc)
	h.Write(pubEnc)
	h.Write(tbs)
	k, _ := edwards25519.NewScalar().SetUniformBytes(h.Sum(nil))
	S := edwards25519.NewScalar().MultiplyAdd(k, p.a, r)
	sig := append(rEnc, S.Bytes()...)
	if ed25519.Verify(pubEnc, tbs, sig) {
		t.Fatal("crypto/ed25519 accepts the torsion signature: it does not exercise the rule")
	}
	out := []byte{0xd2, 0x84}
	out = append(out, coseBytes(t, prot)...)
	out = append(out, 0xa0)
	out = append(out, coseBytes(t, payload)...)
	return append(out, coseBytes(t, sig)...)
}

func mustHex(s string) []byte {
	b := make([]byte, len(s)/2)
	for i := range b {
		var v byte
		for _, c := range s[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			default:
				v |= byte(c-'a') + 10
			}
		}
		b[i] = v
	}
	return b
}

// Attack: a site's key of small order (the identity here). Under
// cofactored verification [8][k]A vanishes, so anyone can sign anything
// as that site; under the former cofactorless rule R = identity, S = 0
// verified too. Trust must refuse the key, with a typed error, and a
// "signature" made without any secret must not apply.
func TestTrustRefusesSmallOrderKeyAndItsForgeries(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	ident := edwards25519.NewIdentityPoint().Bytes()
	key := sign.Key{Kid: sign.KidFor(ident), Site: messages.SiteID{9}, PublicKey: ident}
	err := n.Trust(n.ctx, key)
	if !errors.Is(err, sign.ErrSmallOrderKey) {
		t.Errorf("Trust(identity key) = %v, want sign.ErrSmallOrderKey", err)
	}
	for _, k := range n.TrustedKeys() {
		if bytes.Equal(k.PublicKey, ident) {
			t.Error("the small-order key is in the keyring")
		}
	}
	// The forgery: any payload, R = identity, S = 0, no secret involved.
	e := &messages.Event{Site: messages.SiteID{9}, HLC: hlcAt(n.wall.MS(), 1), Schema: "app", Table: "t",
		Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{"a": messages.MustValue("forged")}}
	payload, _ := messages.EncodeEvent(e)
	prot := coseBytes(t, map[int64]any{1: -8, 4: key.Kid})
	out := []byte{0xd2, 0x84}
	out = append(out, coseBytes(t, prot)...)
	out = append(out, 0xa0)
	out = append(out, coseBytes(t, payload)...)
	out = append(out, coseBytes(t, append(bytes.Clone(ident), make([]byte, 32)...))...)
	if o := n.apply(out); o.Kind != messages.Dropped || o.Reason != messages.ReasonSignature {
		t.Fatalf("forged event under a small-order key: %v", o)
	}
	if _, ok := n.get(1); ok {
		t.Fatal("the forged row exists")
	}
}

// One rule on every path: an event whose signature is valid under ZIP-215
// but not under crypto/ed25519 (torsion in R) applies through ApplySigned
// and through ApplySignedBatch (batch verification with bisection), on
// two nodes; forgeries spread over a batch are dropped exactly, and
// every other event applies.
func TestApplySingleAndBatchFollowOneRule(t *testing.T) {
	p := newZipPeer(t, 3)
	a := openTestNode(t, Config{})
	b := openTestNode(t, Config{})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		n.trust(p.peer)
	}
	now := a.wall.MS()
	edge := p.signWithTorsion(t, &messages.Event{HLC: hlcAt(now, 1), Schema: "app", Table: "t",
		Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{"a": messages.MustValue("zip215")}}, p.signer.Kid(), p.pub)
	if o := a.apply(edge); o.Kind != messages.Applied {
		t.Fatalf("ApplySigned of a ZIP-215-valid event: %v", o)
	}
	var batch [][]byte
	forged := map[int]bool{}
	for i := 0; i < 3*sign.BatchSize+7; i++ {
		raw := p.upsert(hlcAt(now, uint16(10+i)), 100+i, map[string]any{"a": i})
		if i%61 == 17 {
			raw[len(raw)-5] ^= 0x08
			forged[i] = true
		}
		batch = append(batch, raw)
	}
	batch = append(batch, edge)
	outs, err := b.ApplySignedBatch(b.ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		switch {
		case forged[i]:
			if o.Kind != messages.Dropped || o.Reason != messages.ReasonSignature {
				t.Fatalf("forged event %d: %v", i, o)
			}
		case o.Kind != messages.Applied:
			t.Fatalf("event %d: %v", i, o)
		}
	}
	if len(forged) < 3 {
		t.Fatalf("only %d forgeries in the batch", len(forged))
	}
	var va, vb string
	ra, okA := a.get(1)
	rb, okB := b.get(1)
	if !okA || !okB {
		t.Fatal("row 1 missing on a node")
	}
	_, _ = ra.Value("a", &va)
	_, _ = rb.Value("a", &vb)
	if va != "zip215" || vb != va {
		t.Fatalf("the two paths disagree on row 1: %q vs %q", va, vb)
	}
}
