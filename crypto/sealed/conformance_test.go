package sealed

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/internal/conformance"
)

// TestConformanceWycheproofAESGCM: Wycheproof's AES-GCM vectors through
// the AEAD a Sealer builds for its key (New): both directions, seal (the
// vector's nonce, message and associated data give its ciphertext and tag)
// and open (valid vectors open to the message, invalid ones fail). The
// data holds only the groups the sealer's profile can express: AES-256,
// 96-bit nonces, 128-bit tags (testdata/conformance/README.md). `make
// conformance` prints the report line.
func TestConformanceWycheproofAESGCM(t *testing.T) {
	var f struct {
		TestGroups []struct {
			KeySize, IVSize, TagSize int
			Tests                    []struct {
				TcID                       int `json:"tcId"`
				Comment                    string
				Flags                      []string
				Key, IV, AAD, Msg, CT, Tag string
				Result                     string
			}
		}
	}
	if err := json.Unmarshal(conformance.File(t, "wycheproof_aes_gcm.json"), &f); err != nil {
		t.Fatal(err)
	}
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	run, met, total := 0, 0, 0
	for _, g := range f.TestGroups {
		if g.KeySize != 256 || g.IVSize != 96 || g.TagSize != 128 {
			t.Fatalf("group %d/%d/%d is outside the sealer's profile", g.KeySize, g.IVSize, g.TagSize)
		}
		for _, v := range g.Tests {
			total++
			id := fmt.Sprintf("tcId %d (%s %v)", v.TcID, v.Comment, v.Flags)
			var k Key
			copy(k[:], unhex(v.Key))
			s, err := New(k)
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			aead := s.current.aead
			iv, aad, msg, sealed := unhex(v.IV), unhex(v.AAD), unhex(v.Msg), append(unhex(v.CT), unhex(v.Tag)...)
			pt, oerr := aead.Open(nil, iv, sealed, aad)
			opened := oerr == nil && bytes.Equal(pt, msg)
			sealedOK := bytes.Equal(aead.Seal(nil, iv, msg, aad), sealed)
			run++
			valid := v.Result == "valid"
			if opened != valid || sealedOK != valid {
				t.Errorf("%s: opens %v, seals to the vector %v, upstream says %s", id, opened, sealedOK, v.Result)
				continue
			}
			met++
		}
	}
	c := conformance.Tally{Set: "wycheproof aes-256-gcm", Run: run, Met: met}
	c.Report(t, total)
}
