package sign

import (
	"bytes"
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
)

// FuzzVerify checks that Verify and ParseVerified never panic, that every
// failure is a typed error, and that an accepted input decodes to an event
// attributed to its signer's site, with ID = eventid.Of(raw).
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
		if err != nil {
			if v != nil {
				t.Fatal("result with error")
			}
			if !IsSignatureFailure(err) && !errors.Is(err, messages.ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
		} else {
			key, ok := fx.kr.Lookup(v.Kid)
			if !ok || v.Event.Site != key.Site {
				t.Fatalf("accepted event of site %s signed by kid %x", v.Event.Site, v.Kid)
			}
			if !coseVerify(in, testMesh, key.PublicKey) {
				t.Fatal("accepted a signature go-cose rejects")
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
