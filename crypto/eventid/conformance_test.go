package eventid

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestConformanceBLAKE3: BLAKE3's official test vectors (the "hash" mode,
// default 32-byte output: the first 32 bytes of each extended output)
// through Of, over inputs of 0 to 102 400 bytes that cross every chunk and
// tree boundary. The keyed_hash and derive_key modes are not run: nothing
// in the project uses them (testdata/conformance/README.md). `make
// conformance` prints the report line.
func TestConformanceBLAKE3(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "conformance", "blake3_test_vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []struct {
			InputLen int    `json:"input_len"`
			Hash     string `json:"hash"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
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
	t.Logf("conformance: %-30s %4d vectors run, %4d expected verdicts met, %3d stated departures from upstream's verdict",
		"blake3 official (hash)", run, met, 0)
	if run == 0 || run != len(f.Cases) {
		t.Errorf("%d vectors run of %d", run, len(f.Cases))
	}
}
