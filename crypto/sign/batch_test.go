package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"testing"

	"filippo.io/edwards25519"

	"github.com/syncmesh/syncmesh/messages"
)

// sentinels are the error classes a verdict is compared by.
var sentinels = []error{ErrTooLarge, ErrNoMeshID, ErrMalformedSignature, ErrUnknownKid, ErrBadSignature, ErrSiteMismatch, ErrRetired, messages.ErrMalformed, messages.ErrEmptyRowKey}

func sameVerdict(t *testing.T, what string, v1 *Verified, e1 error, v2 *Verified, e2 error) {
	t.Helper()
	if (e1 == nil) != (e2 == nil) {
		t.Fatalf("%s: Verify err %v, VerifyBatch err %v", what, e1, e2)
	}
	for _, s := range sentinels {
		if errors.Is(e1, s) != errors.Is(e2, s) {
			t.Fatalf("%s: Verify err %v, VerifyBatch err %v (differ on %v)", what, e1, e2, s)
		}
	}
	if e1 == nil && (v1.ID != v2.ID || !bytes.Equal(v1.Kid, v2.Kid) || !eventsEqual(v1.Event, v2.Event)) {
		t.Fatalf("%s: verified results differ", what)
	}
}

// coseWithSig assembles a COSE_Sign1 event of f's kid around an arbitrary
// signature over the event's Sig_structure, computed by sigFor.
func coseWithSig(t testing.TB, f *fixture, e *messages.Event, sigFor func(tbs []byte) []byte) []byte {
	t.Helper()
	payload, err := messages.EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	protBytes := cborBytes(t, map[int64]any{1: -8, 4: f.signer.Kid()})
	tbs := cborBytes(t, []any{"Signature1", protBytes, testMesh, payload})
	out := []byte{0xd2, 0x84}
	out = append(out, cborBytes(t, protBytes)...)
	out = append(out, 0xa0)
	out = append(out, cborBytes(t, payload)...)
	return append(out, cborBytes(t, sigFor(tbs))...)
}

// VerifyBatch returns Verify's verdict for every event of a mixed batch —
// valid events of several signers, forgeries, unknown kids, malformed
// envelopes and payloads, site mismatches, retired keys, oversize input,
// ZIP-215 edge cases built at the COSE level — in any order and any split.
func TestVerifyBatchGivesVerifysVerdictOnEveryInput(t *testing.T) {
	fs := []*fixture{newFixture(t, 51), newFixture(t, 52), newFixture(t, 53)}
	kr := fs[0].kr
	for _, f := range fs[1:] {
		var err error
		if kr, err = kr.With(f.signer.Key()); err != nil {
			t.Fatal(err)
		}
	}
	retired := fs[2].signer.Key()
	retired.Cutoff = 100
	kr, _ = kr.With(retired)
	stranger := newFixture(t, 54)
	tor := torsion(t)
	sec := newSecret(bytes.Repeat([]byte{51}, ed25519.SeedSize)) // fs[0]'s signing scalar
	if !bytes.Equal(sec.A.Bytes(), fs[0].signer.PublicKey()) {
		t.Fatal("secret does not match fixture 51")
	}
	rng := mrand.NewChaCha8([32]byte{9})
	var raws [][]byte
	for i := 0; i < 40; i++ {
		f := fs[i%2]
		raws = append(raws, mustSign(t, f, testEvent(f.site, messages.HLC(i+1))))
	}
	bad := bytes.Clone(raws[3])
	bad[len(bad)-10] ^= 0x20
	raws = append(raws, bad)
	raws = append(raws, mustSign(t, stranger, testEvent(stranger.site, 5)))        // unknown kid
	raws = append(raws, mustSign(t, fs[2], testEvent(fs[2].site, 50)))             // retired key, below the cutoff
	raws = append(raws, mustSign(t, fs[2], testEvent(fs[2].site, 500)))            // above the cutoff
	raws = append(raws, []byte{0xd2, 0x84, 0x40})                                  // malformed
	raws = append(raws, make([]byte, MaxSignedSize+1))                             // too large
	other, _ := fs[0].signer.SignPayload([]byte{0xa1, 0x61, 0x76, 0x02}, testMesh) // authenticated, undecodable
	raws = append(raws, other)
	mis := NewSigner(fs[1].site, fs[0].priv) // fs[0]'s key signing as fs[1]'s site
	misRaw, err := mis.Sign(testEvent(fs[1].site, 9), testMesh)
	if err != nil {
		t.Fatal(err)
	}
	raws = append(raws, misRaw)
	// ZIP-215 at the COSE level: torsion added to R (valid; crypto/ed25519
	// rejects it), a non-canonical small-order R with S = k·a (valid), and
	// S + ℓ (invalid).
	torR := coseWithSig(t, fs[0], testEvent(fs[0].site, 77), func(tbs []byte) []byte {
		r := randScalar(rng)
		R := new(edwards25519.Point).ScalarBaseMult(r)
		return makeSig(sec.a, r, sec.A.Bytes(), R.Add(R, tor[3]).Bytes(), tbs)
	})
	raws = append(raws, torR)
	nonCanonR := coseWithSig(t, fs[0], testEvent(fs[0].site, 78), func(tbs []byte) []byte {
		return makeSig(sec.a, edwards25519.NewScalar(), sec.A.Bytes(), encodings(tor[0])[1], tbs)
	})
	raws = append(raws, nonCanonR)
	for _, zip := range [][]byte{torR, nonCanonR} {
		if _, err := Verify(kr, zip, testMesh); err != nil {
			t.Fatalf("a ZIP-215-valid event was rejected: %v", err)
		}
	}
	sPlusL := coseWithSig(t, fs[0], testEvent(fs[0].site, 79), func(tbs []byte) []byte {
		sig := ed25519.Sign(fs[0].priv, tbs)
		return append(sig[:32:32], leBytes(leInt(sig[32:]).Add(leInt(sig[32:]), ell))...)
	})
	raws = append(raws, sPlusL)
	if _, err := Verify(kr, sPlusL, testMesh); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("S + ℓ: %v, want ErrBadSignature", err)
	}

	single := make([]BatchResult, len(raws))
	for i, raw := range raws {
		single[i].Verified, single[i].Err = Verify(kr, raw, testMesh)
	}
	valid := 0
	for _, r := range single {
		if r.Err == nil {
			valid++
		}
	}
	if valid != 40+1+2 { // 40 signed; the retired key's event below its cutoff; the two ZIP-215 cases
		t.Fatalf("%d valid events, the fixture has 43", valid)
	}
	check := func(what string, order []int, split int) {
		for lo := 0; lo < len(order); lo += split {
			hi := min(lo+split, len(order))
			batch := make([][]byte, 0, hi-lo)
			for _, i := range order[lo:hi] {
				batch = append(batch, raws[i])
			}
			for j, r := range VerifyBatch(kr, batch, testMesh) {
				i := order[lo+j]
				sameVerdict(t, what, single[i].Verified, single[i].Err, r.Verified, r.Err)
			}
		}
	}
	order := make([]int, len(raws))
	for i := range order {
		order[i] = i
	}
	check("in order, one batch", order, len(order))
	for trial := 0; trial < 5; trial++ {
		mrand.New(rng).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, split := range []int{1, 3, 16, BatchSize} {
			check("shuffled", order, split)
		}
	}
	if out := VerifyBatch(kr, nil, testMesh); len(out) != 0 {
		t.Fatal("results for an empty batch")
	}
	for _, r := range VerifyBatch(kr, raws[:3], nil) {
		if !errors.Is(r.Err, ErrNoMeshID) {
			t.Fatalf("no mesh id: %v", r.Err)
		}
	}
}

// Trust refuses public keys of small order, in every encoding ZIP-215
// decodes, with a typed error; a mixed-order key (a honest-looking key
// plus torsion) is not of small order and is accepted (its events verify
// by the cofactored rule, which ignores the torsion).
func TestKeyringRefusesSmallOrderKeys(t *testing.T) {
	n := 0
	for _, p := range torsion(t) {
		for _, enc := range encodings(p) {
			n++
			k := Key{Kid: KidFor(enc), Site: messages.SiteID{1}, PublicKey: ed25519.PublicKey(enc)}
			_, err := NewKeyring(k)
			if !errors.Is(err, ErrSmallOrderKey) || !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("NewKeyring with small-order key %x: %v", enc, err)
			}
			var empty *Keyring
			if _, err := empty.With(k); !errors.Is(err, ErrSmallOrderKey) {
				t.Fatalf("With small-order key %x: %v", enc, err)
			}
		}
	}
	if n != 14 {
		t.Fatalf("checked %d encodings, want 14", n)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	a, _ := new(edwards25519.Point).SetBytes(pub)
	mixed := new(edwards25519.Point).Add(a, torsion(t)[5]).Bytes()
	if _, err := NewKeyring(Key{Kid: []byte{1}, Site: messages.SiteID{1}, PublicKey: mixed}); err != nil {
		t.Fatalf("mixed-order key refused: %v", err)
	}
	if _, err := NewKeyring(Key{Kid: []byte{1}, Site: messages.SiteID{1}, PublicKey: pub}); err != nil {
		t.Fatalf("RFC 8032 key refused: %v", err)
	}
}

func BenchmarkVerifyBatchEvents(b *testing.B) {
	f := newFixture(b, 61)
	raws := make([][]byte, BatchSize)
	for i := range raws {
		raws[i] = mustSign(b, f, testEvent(f.site, messages.HLC(i+1)))
	}
	b.Run("batch", func(b *testing.B) {
		for b.Loop() {
			for _, r := range VerifyBatch(f.kr, raws, testMesh) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(raws)), "ns/event")
	})
	b.Run("single", func(b *testing.B) {
		for b.Loop() {
			for _, raw := range raws {
				if _, err := Verify(f.kr, raw, testMesh); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(raws)), "ns/event")
	})
}

// The verified events of a batch share one allocation but no bytes: each
// owns a private copy of its payload and kid, so scribbling over the raw
// inputs, or appending to one event's kid, changes no verified result, and
// a later batch (reusing VerifyBatch's pooled memory) leaves an earlier
// batch's results as they were. Verify's results are held to the same.
func TestVerifiedEventsOwnTheirBytes(t *testing.T) {
	fs := []*fixture{newFixture(t, 61), newFixture(t, 62)}
	kr, err := fs[0].kr.With(fs[1].signer.Key())
	if err != nil {
		t.Fatal(err)
	}
	sign := func(n, hlc0 int) [][]byte {
		var raws [][]byte
		for i := 0; i < n; i++ {
			f := fs[i%2]
			raws = append(raws, mustSign(t, f, testEvent(f.site, messages.HLC(hlc0+i))))
		}
		raws[n/2] = append([]byte(nil), raws[n/2]...)
		raws[n/2][len(raws[n/2])-10] ^= 0x20 // a forgery among them
		return raws
	}
	raws := sign(BatchSize, 1)
	want := make([]BatchResult, len(raws))
	for i, raw := range raws {
		want[i].Verified, want[i].Err = Verify(kr, bytes.Clone(raw), testMesh)
	}
	got := VerifyBatch(kr, raws, testMesh)
	single, err := Verify(kr, raws[0], testMesh)
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range raws {
		for i := range raw {
			raw[i] = 0xff
		}
	}
	_ = append(got[0].Verified.Kid, 0xee, 0xee, 0xee, 0xee)
	_ = append(got[1].Verified.RowKey, 0xee, 0xee, 0xee, 0xee)
	for range 3 {
		VerifyBatch(kr, sign(BatchSize, 1000), testMesh)
	}
	for i := range raws {
		sameVerdict(t, "after scribbling", want[i].Verified, want[i].Err, got[i].Verified, got[i].Err)
		if want[i].Err == nil && !bytes.Equal(want[i].Verified.RowKey, got[i].Verified.RowKey) {
			t.Fatalf("event %d: row key %x, want %x", i, got[i].Verified.RowKey, want[i].Verified.RowKey)
		}
	}
	sameVerdict(t, "Verify after scribbling", want[0].Verified, nil, single, nil)
	if got[0].Verified.Event == got[2].Verified.Event || got[0].Verified.Event == single.Event {
		t.Fatal("two results share an event")
	}
}
