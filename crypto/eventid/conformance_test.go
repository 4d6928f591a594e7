package eventid

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/internal/conformance"
)

// TestConformanceBLAKE3: BLAKE3's official test vectors (the "hash" mode,
// default 32-byte output: the first 32 bytes of each extended output)
// through Of, over inputs of 0 to 102 400 bytes that cross every chunk and
// tree boundary. The keyed_hash and derive_key modes are not run: nothing
// in the project uses them (testdata/conformance/README.md). `make
// conformance` prints the report line.
func TestConformanceBLAKE3(t *testing.T) {
	var f struct {
		Cases []struct {
			InputLen int    `json:"input_len"`
			Hash     string `json:"hash"`
		} `json:"cases"`
	}
	conformance.Read(t, "blake3_test_vectors.json", &f)
	run, met := 0, 0
	for _, c := range f.Cases {
		// The input is the repeating sequence 0, 1, ..., 250.
		in := make([]byte, c.InputLen)
		for i := range in {
			in[i] = byte(i % 251)
		}
		want, err := hex.DecodeString(c.Hash)
		if err != nil || len(want) < 32 {
			t.Fatalf("input_len %d: bad hash %q", c.InputLen, c.Hash)
		}
		run++
		id := Of(in)
		if !bytes.Equal(id[:], want[:32]) {
			t.Errorf("input_len %d: event id %x, BLAKE3 %x", c.InputLen, id[:], want[:32])
			continue
		}
		met++
	}
	c := conformance.Tally{Set: "blake3 official (hash)", Run: run, Met: met}
	c.Report(t, len(f.Cases))
}
