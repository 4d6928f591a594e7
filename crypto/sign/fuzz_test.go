package sign

import (
	"bytes"
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
)

// FuzzVerify checks that Verify, VerifyBatch and ParseVerified never
// panic, that every failure is a typed error, that VerifyBatch gives
// Verify's verdict (alone and beside a valid event), that an accepted
// input decodes to an event attributed to its signer's site, with ID =
// eventid.Of(raw), and that what go-cose (crypto/ed25519) accepts and our
// strict parser reads is accepted: the ZIP-215 rule accepts every
// signature RFC 8032 verification does.
func FuzzVerify(f *testing.F) {
	fx := newFixture(f, 40)
	raw := mustSign(f, fx, testEvent(fx.site, 7))
	del := mustSign(f, fx, &messages.Event{Site: fx.site, HLC: 8, Schema: "s", Table: "t", Key: messages.Columns{"k": messages.MustValue(1)}, Delete: true})
	tampered := bytes.Clone(raw)
	tampered[len(tampered)/2] ^= 0x10
	f.Add(raw)
	f.Add(del)
	f.Add(raw[:len(raw)-1])
	f.Add(raw[:len(raw)/2])
	f.Add(tampered)
	f.Add(raw[1:]) // untagged
	f.Add(append(bytes.Clone(raw), 0))
	f.Add([]byte{})
	f.Add([]byte{0xd2, 0x84, 0x40, 0xa0, 0xf6, 0x40})
	f.Add([]byte{0xd2, 0x84, 0x5f, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		v, err := Verify(fx.kr, in, testMesh)
		for _, b := range [][][]byte{{in}, {raw, in}} {
			r := VerifyBatch(fx.kr, b, testMesh)
			if r[0].Err != nil && len(b) == 2 {
				t.Fatalf("valid neighbour rejected: %v", r[0].Err)
			}
			last := r[len(r)-1]
			sameVerdict(t, "fuzz", v, err, last.Verified, last.Err)
		}
		if err != nil {
			if v != nil {
				t.Fatal("result with error")
			}
			if !IsSignatureFailure(err) && !errors.Is(err, messages.ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
			if errors.Is(err, ErrBadSignature) {
				if kid, kerr := PeekKid(in); kerr == nil {
					if key, ok := fx.kr.Lookup(kid); ok && coseVerify(in, testMesh, key.PublicKey) {
						t.Fatal("go-cose accepts a signature the ZIP-215 rule rejects")
					}
				}
			}
		} else {
			key, ok := fx.kr.Lookup(v.Kid)
			if !ok || v.Event.Site != key.Site {
				t.Fatalf("accepted event of site %s signed by kid %x", v.Event.Site, v.Kid)
			}
			if v.ID != eventid.Of(in) {
				t.Fatal("ID is not eventid.Of(raw)")
			}
			if _, err := messages.EncodeEvent(v.Event); err != nil {
				t.Fatalf("accepted event does not re-encode: %v", err)
			}
		}
		ev, perr := ParseVerified(in)
		if err == nil && (perr != nil || ev == nil) {
			t.Fatalf("Verify accepted but ParseVerified failed: %v", perr)
		}
		_, _ = PeekKid(in)
	})
}
