package sealed

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func TestLoadOrCreateKeyFileCreates0600AndReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "storage.key")
	k1, err := LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1.isZero() {
		t.Fatal("created an all-zero key")
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %#o, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(path)
	if !bytes.Equal(raw, k1[:]) {
		t.Fatalf("file holds %d bytes, not the raw key", len(raw))
	}
	k2, err := LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if k1 != k2 {
		t.Fatal("second load returned a different key")
	}
	// No temporary files left behind.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want 1", len(ents))
	}
}

func TestLoadOrCreateKeyFileDistinctKeys(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateKeyFile(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateKeyFile(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("two new key files hold the same key")
	}
}

func TestLoadOrCreateKeyFileConcurrentCreatorsAgree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "storage.key")
	const n = 8
	keys := make([]Key, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys[i], errs[i] = LoadOrCreateKeyFile(path)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if keys[i] != keys[0] {
			t.Fatal("concurrent creators returned different keys")
		}
	}
}

func TestLoadOrCreateKeyFileHexForm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "storage.key")
	want := keyOf(9)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(want[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatal("hex key file decoded wrongly")
	}
}

func TestLoadOrCreateKeyFileRejectsWrongLength(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, 31, 33, 63, 64 + 100} {
		path := filepath.Join(dir, "k"+strings.Repeat("x", n%7)+string(rune('a'+n%26)))
		if err := os.WriteFile(path, bytes.Repeat([]byte{'A'}, n), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKeyFile(path)
		if !errors.Is(err, ErrKeyFormat) {
			t.Fatalf("%d bytes: err = %v, want ErrKeyFormat", n, err)
		}
		// The bad file is never replaced by a fresh key.
		if b, _ := os.ReadFile(path); len(b) != n {
			t.Fatalf("%d bytes: file was rewritten", n)
		}
	}
}

func TestLoadOrCreateKeyFileRejectsZeroKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "storage.key")
	if err := os.WriteFile(path, make([]byte, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKeyFile(path); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("err = %v, want ErrZeroKey", err)
	}
}

func TestLoadOrCreateKeyFileRejectsGroupOrOtherAccess(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("POSIX permissions")
	}
	k := keyOf(3)
	for _, mode := range []fs.FileMode{0o640, 0o604, 0o644, 0o620, 0o602, 0o610, 0o601, 0o666} {
		path := filepath.Join(t.TempDir(), "storage.key")
		if err := os.WriteFile(path, k[:], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateKeyFile(path)
		if !errors.Is(err, ErrKeyFilePermissions) {
			t.Fatalf("mode %#o: err = %v, want ErrKeyFilePermissions", mode, err)
		}
	}
	for _, mode := range []fs.FileMode{0o600, 0o400} {
		path := filepath.Join(t.TempDir(), "storage.key")
		if err := os.WriteFile(path, k[:], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadOrCreateKeyFile(path); err != nil || got != k {
			t.Fatalf("mode %#o: %v", mode, err)
		}
	}
}

func TestLoadOrCreateKeyFileRejectsDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKeyFile(dir); !errors.Is(err, ErrKeyFilePermissions) {
		t.Fatalf("err = %v, want ErrKeyFilePermissions", err)
	}
}

func TestLoadOrCreateKeyFileMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "storage.key")
	_, err := LoadOrCreateKeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want a not-exist error", err)
	}
}

func TestParseKey(t *testing.T) {
	want := keyOf(5)
	h := hex.EncodeToString(want[:])
	for name, in := range map[string][]byte{
		"raw":         want[:],
		"hex":         []byte(h),
		"hex-upper":   []byte(strings.ToUpper(h)),
		"hex-newline": []byte(h + "\n"),
		"hex-spaced":  []byte("  " + h + "\r\n"),
	} {
		got, err := ParseKey(in)
		if err != nil || got != want {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for name, in := range map[string][]byte{
		"empty":    nil,
		"short":    want[:31],
		"long-raw": append(append([]byte{}, want[:]...), 0),
		"hex-odd":  []byte(h[:63]),
		"not-hex":  []byte(strings.Repeat("zz", 32)),
		"hex-long": []byte(h + "00"),
	} {
		if _, err := ParseKey(in); !errors.Is(err, ErrKeyFormat) {
			t.Fatalf("%s: err = %v, want ErrKeyFormat", name, err)
		}
	}
	if _, err := ParseKey([]byte(strings.Repeat("0", 64))); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("zero hex key: %v", err)
	}
}

func FuzzParseKey(f *testing.F) {
	k := keyOf(5)
	f.Add(k[:])
	f.Add([]byte(hex.EncodeToString(k[:]) + "\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseKey(b)
		if err != nil {
			if !errors.Is(err, ErrKeyFormat) && !errors.Is(err, ErrZeroKey) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if got.isZero() {
			t.Fatal("accepted zero key")
		}
		if len(b) != KeySize {
			if back, err := ParseKey([]byte(hex.EncodeToString(got[:]))); err != nil || back != got {
				t.Fatal("hex form does not round trip")
			}
		}
	})
}
