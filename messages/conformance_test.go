package messages

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// cborAppendixADepartures are the RFC 8949 Appendix A examples the
// project's strict decoder refuses (codec.go: tags and indefinite lengths
// are forbidden, so one data model has one encoding), each with the rule.
// Every other example decodes, and where the RFC marks it as one a generic
// encoder reproduces, the project's deterministic encoder gives back the
// same bytes.
var cborAppendixADepartures = map[string]string{
	"c249010000000000000000":                             "(departure: tags are refused by the strict profile)",               // tag 2, bignum 2^64
	"c349010000000000000000":                             "(departure: tags are refused by the strict profile)",               // tag 3, bignum -2^64-1
	"c074323031332d30332d32315432303a30343a30305a":       "(departure: tags are refused by the strict profile)",               // tag 0, date/time string
	"c11a514b67b0":                                       "(departure: tags are refused by the strict profile)",               // tag 1, epoch time (integer)
	"c1fb41d452d9ec200000":                               "(departure: tags are refused by the strict profile)",               // tag 1, epoch time (float)
	"d74401020304":                                       "(departure: tags are refused by the strict profile)",               // tag 23, expected base16
	"d818456449455446":                                   "(departure: tags are refused by the strict profile)",               // tag 24, embedded CBOR
	"d82076687474703a2f2f7777772e6578616d706c652e636f6d": "(departure: tags are refused by the strict profile)",               // tag 32, URI
	"5f42010243030405ff":                                 "(departure: indefinite lengths are refused by the strict profile)", // indefinite byte string
	"7f657374726561646d696e67ff":                         "(departure: indefinite lengths are refused by the strict profile)", // indefinite text string
	"9fff":                                               "(departure: indefinite lengths are refused by the strict profile)", // indefinite empty array
	"9f018202039f0405ffff":                               "(departure: indefinite lengths are refused by the strict profile)", // indefinite arrays
	"9f01820203820405ff":                                 "(departure: indefinite lengths are refused by the strict profile)", // indefinite outer array
	"83018202039f0405ff":                                 "(departure: indefinite lengths are refused by the strict profile)", // indefinite inner array
	"83019f0203ff820405":                                 "(departure: indefinite lengths are refused by the strict profile)", // indefinite inner array
	"9f0102030405060708090a0b0c0d0e0f101112131415161718181819ff": "(departure: indefinite lengths are refused by the strict profile)", // indefinite array of 25
	"bf61610161629f0203ffff":                                     "(departure: indefinite lengths are refused by the strict profile)", // indefinite map and array
	"826161bf61626163ff":                                         "(departure: indefinite lengths are refused by the strict profile)", // indefinite inner map
	"bf6346756ef563416d7421ff":                                   "(departure: indefinite lengths are refused by the strict profile)", // indefinite map
	// simple(24) in the one-byte extension: RFC 7049's example, but not
	// well-formed under RFC 8949 §3.3 (values 0..31 must use the short form).
	"f818": "(departure: RFC 8949 §3.3 makes this two-byte simple(24) not well-formed)",
	// undefined decodes to Go nil, the value null decodes to, so Marshal
	// writes null (f6) back: the decoder's generic form does not keep
	// undefined apart from null (Value keeps the bytes as received).
	"f7": "(departure: undefined reads back as null through the generic form)",
}

// TestConformanceCBORAppendixA: every example of RFC 8949 Appendix A
// (cbor/test-vectors' appendix_a.json) through Value.Interface (the strict
// decoder every record goes through) and Marshal (the deterministic
// encoder). `make conformance` prints the report line.
func TestConformanceCBORAppendixA(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "conformance", "cbor_appendix_a.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []struct {
		Hex       string `json:"hex"`
		Roundtrip bool   `json:"roundtrip"`
	}
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	run, met, deps := 0, 0, 0
	for _, v := range vs {
		raw, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatal(err)
		}
		run++
		dep := cborAppendixADepartures[v.Hex]
		if dep != "" {
			deps++
		}
		decoded, derr := Value(raw).Interface()
		got := derr == nil
		if got && v.Roundtrip {
			enc, err := Marshal(decoded)
			got = err == nil && bytes.Equal(enc, raw)
		}
		if want := dep == ""; got != want {
			t.Errorf("%s: accepted %v (decode error %v), expected %v %s", v.Hex, got, derr, want, dep)
			continue
		}
		met++
	}
	t.Logf("conformance: %-30s %4d vectors run, %4d expected verdicts met, %3d stated departures from upstream's verdict",
		"cbor rfc8949 appendix a", run, met, deps)
	if run == 0 || run != len(vs) {
		t.Errorf("%d vectors run of %d", run, len(vs))
	}
}
