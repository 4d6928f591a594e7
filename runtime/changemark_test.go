package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/persistence"
)

// The change mark file round-trips; a truncated, foreign or damaged one
// is a corrupt-store error, and a missing one reads as 0.
func TestChangeMarkFileChecks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, changeMarkName)
	if m, err := readChangeMark(path); err != nil || m != 0 {
		t.Fatalf("missing file: %d, %v", m, err)
	}
	if err := writeFileAtomic(path, encodeChangeMark(1<<40+7), true); err != nil {
		t.Fatal(err)
	}
	if m, err := readChangeMark(path); err != nil || m != 1<<40+7 {
		t.Fatalf("round trip: %d, %v", m, err)
	}
	good := encodeChangeMark(9)
	flipped := append([]byte(nil), good...)
	flipped[10] ^= 1
	for name, b := range map[string][]byte{"short": good[:10], "long": append(good, 0), "magic": append([]byte("xxxxxxxx"), good[8:]...), "checksum": flipped} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readChangeMark(path); !errors.Is(err, persistence.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeChangeMark: never panics; what decodes re-encodes identically.
func FuzzDecodeChangeMark(f *testing.F) {
	f.Add(encodeChangeMark(0))
	f.Add(encodeChangeMark(1 << 63))
	f.Add([]byte("smchange"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeChangeMark(b)
		if err == nil && string(encodeChangeMark(m)) != string(b) {
			t.Fatalf("%x decodes to %d, which encodes as %x", b, m, encodeChangeMark(m))
		}
	})
}
