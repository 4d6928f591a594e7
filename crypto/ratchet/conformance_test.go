package ratchet

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/mlkem"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/internal/conformance"
)

// The conformance suite of the ratchet's primitives: public vector sets
// written by others (testdata/conformance/README.md names each source, its
// commit and its license), fed through the ratchet's own code: x25519 and
// privateKey (every DH of PQXDH and the DH ratchet), hmacSHA256 and
// hkdfSHA256 (KDF_RK, KDF_CK's construction and the message keys),
// kemEncapsulationKey and kemDecapsulate (PQXDH's KEM). Each set reports how
// many vectors it ran and how many gave the verdict expected of this
// project; where that verdict departs from upstream's, the reason is stated
// beside the vector. `make conformance` prints the reports.

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return b
}

// wycheproofTest is the union of the fields the Wycheproof files below use.
type wycheproofTest struct {
	TcID    int      `json:"tcId"`
	Comment string   `json:"comment"`
	Flags   []string `json:"flags"`
	Result  string   `json:"result"`
	// XDH
	Public, Private, Shared string
	// MAC
	Key, Msg, Tag string
	// HKDF
	IKM, Salt, Info, OKM string
	Size                 int
}

func (v wycheproofTest) id() string {
	return fmt.Sprintf("tcId %d (%s %v)", v.TcID, v.Comment, v.Flags)
}

type wycheproofFile struct {
	NumberOfTests int `json:"numberOfTests"`
	TestGroups    []struct {
		TagSize int              `json:"tagSize"`
		Tests   []wycheproofTest `json:"tests"`
	} `json:"testGroups"`
}

// TestConformanceWycheproofX25519: every vector through privateKey and
// x25519. Upstream calls the vectors whose shared secret is all zero
// (a low-order public key) "acceptable"; the ratchet refuses them as an
// authentication failure (RFC 7748 §6.1's check, ErrTampered), so a peer
// cannot force a known DH output. Every other vector, valid or acceptable
// (non-canonical or twist points), gives upstream's shared secret.
func TestConformanceWycheproofX25519(t *testing.T) {
	var f wycheproofFile
	conformance.Read(t, "wycheproof_x25519.json", &f)
	c := conformance.Tally{Set: "wycheproof x25519"}
	for _, g := range f.TestGroups {
		for _, v := range g.Tests {
			var priv, pub [32]byte
			copy(priv[:], unhex(t, v.Private))
			copy(pub[:], unhex(t, v.Public))
			sk, err := privateKey(nil, priv)
			if err != nil {
				t.Fatalf("%s: %v", v.id(), err)
			}
			out, err := x25519(sk, pub)
			shared := unhex(t, v.Shared)
			got := err == nil && bytes.Equal(out, shared)
			want, dep := v.Result != "invalid", ""
			if slices.Contains(v.Flags, "ZeroSharedSecret") {
				want, dep = false, "(departure: all-zero shared secret refused, RFC 7748 §6.1)"
				if !errors.Is(err, ErrTampered) {
					t.Errorf("%s: err %v, want ErrTampered", v.id(), err)
				}
			}
			c.Check(t, v.id(), got, want, dep)
		}
	}
	c.Report(t, f.NumberOfTests)
}

// TestConformanceWycheproofHMACSHA256: every vector through hmacSHA256 (the
// tag compared over the vector's tag size). Keys longer than one block and
// messages longer than hmacMaxMsg are outside what the ratchet's
// allocation-free HMAC computes: those vectors are refused with
// errKDFRange, whatever upstream's verdict (stated departure where upstream
// says valid).
func TestConformanceWycheproofHMACSHA256(t *testing.T) {
	var f wycheproofFile
	conformance.Read(t, "wycheproof_hmac_sha256.json", &f)
	c := conformance.Tally{Set: "wycheproof hmac-sha256"}
	for _, g := range f.TestGroups {
		tagBits := g.TagSize
		for _, v := range g.Tests {
			key, msg, tag := unhex(t, v.Key), unhex(t, v.Msg), unhex(t, v.Tag)
			sum, err := hmacSHA256(key, msg)
			got := err == nil && bytes.Equal(sum[:tagBits/8], tag)
			want, dep := v.Result == "valid", ""
			if len(key) > hmacMaxKey || len(msg) > hmacMaxMsg {
				if !errors.Is(err, errKDFRange) {
					t.Errorf("%s: %d-byte key, %d-byte message: err %v, want errKDFRange", v.id(), len(key), len(msg), err)
				}
				if want {
					want, dep = false, "(departure: outside the stack HMAC's range, refused with errKDFRange)"
				}
			}
			c.Check(t, v.id(), got, want, dep)
		}
	}
	c.Report(t, f.NumberOfTests)
}

// TestConformanceWycheproofHKDFSHA256: every vector through hkdfSHA256.
// Upstream's invalid vectors ask for more than 255 hash lengths of output,
// refused by both. Input key material longer than hmacMaxMsg, salt longer
// than a block and info longer than hkdfMaxInfo are outside the ratchet's
// allocation-free HKDF: refused with errKDFRange (stated departure).
func TestConformanceWycheproofHKDFSHA256(t *testing.T) {
	var f wycheproofFile
	conformance.Read(t, "wycheproof_hkdf_sha256.json", &f)
	c := conformance.Tally{Set: "wycheproof hkdf-sha256"}
	for _, g := range f.TestGroups {
		for _, v := range g.Tests {
			ikm, salt, info, okm := unhex(t, v.IKM), unhex(t, v.Salt), unhex(t, v.Info), unhex(t, v.OKM)
			out := make([]byte, v.Size)
			err := hkdfSHA256(out, ikm, salt, string(info))
			got := err == nil && bytes.Equal(out, okm)
			want, dep := v.Result == "valid", ""
			if len(ikm) > hmacMaxMsg || len(salt) > hmacMaxKey || len(info) > hkdfMaxInfo || v.Size > hkdfMaxOut {
				if !errors.Is(err, errKDFRange) {
					t.Errorf("%s: err %v, want errKDFRange", v.id(), err)
				}
				if want {
					want, dep = false, "(departure: outside the stack HKDF's range, refused with errKDFRange)"
				}
			}
			c.Check(t, v.id(), got, want, dep)
		}
	}
	c.Report(t, f.NumberOfTests)
}

// TestConformanceWycheproofMLKEM768: decapsulation from the stored 64-byte
// seed (kemDecapsulate, as PrekeyStore keeps KEM prekeys) and the
// encapsulation key the seed derives. Upstream's invalid vectors (a seed or
// ciphertext of the wrong length) are refused; valid ones, including
// CCTV's strcmp vector (a ciphertext whose re-encryption differs after a
// zero byte), give upstream's shared key.
func TestConformanceWycheproofMLKEM768(t *testing.T) {
	var f struct {
		NumberOfTests int `json:"numberOfTests"`
		TestGroups    []struct {
			Tests []struct {
				TcID   int      `json:"tcId"`
				Flags  []string `json:"flags"`
				Seed   string   `json:"seed"`
				EK     string   `json:"ek"`
				C      string   `json:"c"`
				K      string   `json:"K"`
				Result string   `json:"result"`
			} `json:"tests"`
		} `json:"testGroups"`
	}
	conformance.Read(t, "wycheproof_mlkem_768.json", &f)
	c := conformance.Tally{Set: "wycheproof ml-kem-768"}
	for _, g := range f.TestGroups {
		for _, v := range g.Tests {
			seed, ct := unhex(t, v.Seed), unhex(t, v.C)
			got := false
			if ss, err := kemDecapsulate(seed, ct); err == nil {
				dk, err := mlkem.NewDecapsulationKey768(seed)
				got = err == nil && bytes.Equal(ss, unhex(t, v.K)) &&
					bytes.Equal(dk.EncapsulationKey().Bytes(), unhex(t, v.EK))
			}
			c.Check(t, fmt.Sprintf("tcId %d %v", v.TcID, v.Flags), got, v.Result == "valid", "")
		}
	}
	c.Report(t, f.NumberOfTests)
}

// TestConformanceCCTVMLKEMModulus: C2SP CCTV's encapsulation keys with one
// coefficient in q..2¹²-1, every value at every position: all refused by
// kemEncapsulationKey (FIPS 203 §7.2's modulus check), as a bundle's KEM
// prekey would be.
func TestConformanceCCTVMLKEMModulus(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(conformance.File(t, "cctv_mlkem768_modulus.txt.gz")))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 0, 4096), 1<<16)
	c := conformance.Tally{Set: "cctv ml-kem-768 modulus"}
	n := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		n++
		_, err := kemEncapsulationKey(unhex(t, line))
		c.Check(t, fmt.Sprintf("key %d", n), err == nil, false, "")
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no keys read")
	}
	c.Report(t, n)
}
