package sealed

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// ParseKey parses a storage key given in configuration or read from a key
// file. Accepted forms: exactly 32 raw bytes, or 64 hexadecimal characters
// (either case) optionally surrounded by ASCII whitespace such as a trailing
// newline (e.g. the output of `openssl rand -hex 32`). Anything else fails
// with ErrKeyFormat; an all-zero key fails with ErrZeroKey.
func ParseKey(b []byte) (Key, error) {
	var k Key
	switch {
	case len(b) == KeySize:
		copy(k[:], b)
	default:
		t := bytes.TrimSpace(b)
		if len(t) != 2*KeySize {
			return Key{}, fmt.Errorf("%w: %d bytes, want 32 raw bytes or 64 hex characters", ErrKeyFormat, len(b))
		}
		if _, err := hex.Decode(k[:], t); err != nil {
			return Key{}, fmt.Errorf("%w: not hexadecimal", ErrKeyFormat)
		}
	}
	if k.isZero() {
		return Key{}, ErrZeroKey
	}
	return k, nil
}

// LoadOrCreateKeyFile returns the storage key kept at path.
//
// If the file does not exist it is created with 32 random bytes (raw form)
// and permissions 0600: the key is written to a temporary file in the same
// directory (created with O_EXCL, fsynced), hard-linked to path (which fails
// if path appeared meanwhile, so a concurrent creator never has its key
// replaced; the other creator's key is then loaded), and the directory is
// fsynced. A crash therefore never leaves a partial key file at path.
//
// If the file exists it must be a regular file that group and other cannot
// access (mode & 0o077 == 0, else ErrKeyFilePermissions; not checked on
// Windows) holding a key in a form ParseKey accepts (else ErrKeyFormat).
func LoadOrCreateKeyFile(path string) (Key, error) {
	k, err := loadKeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, err = createKeyFile(path)
	if errors.Is(err, fs.ErrExist) {
		return loadKeyFile(path)
	}
	return k, err
}

func loadKeyFile(path string) (Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return Key{}, fmt.Errorf("sealed: key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Key{}, fmt.Errorf("sealed: key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return Key{}, fmt.Errorf("%w: %s is not a regular file (%v)", ErrKeyFilePermissions, path, st.Mode().Type())
	}
	if runtime.GOOS != "windows" && st.Mode().Perm()&0o077 != 0 {
		return Key{}, fmt.Errorf("%w: %s has mode %#o, want no group/other access (e.g. 0600)", ErrKeyFilePermissions, path, st.Mode().Perm())
	}
	// Read at most a little more than the longest accepted form.
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return Key{}, fmt.Errorf("sealed: key file: %w", err)
	}
	k, err := ParseKey(b)
	if err != nil {
		return Key{}, fmt.Errorf("sealed: key file %s: %w", path, err)
	}
	return k, nil
}

func createKeyFile(path string) (k Key, err error) {
	for {
		if _, err := io.ReadFull(rand.Reader, k[:]); err != nil {
			return Key{}, fmt.Errorf("sealed: generating key: %w", err)
		}
		if !k.isZero() {
			break
		}
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return Key{}, fmt.Errorf("sealed: creating key file: %w", err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName) // after the link, path keeps the key
	// CreateTemp uses O_EXCL and mode 0600; make sure of the mode whatever
	// the umask (umask can only remove bits, but be explicit).
	if err := tmp.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		tmp.Close()
		return Key{}, fmt.Errorf("sealed: creating key file: %w", err)
	}
	if _, err := tmp.Write(k[:]); err != nil {
		tmp.Close()
		return Key{}, fmt.Errorf("sealed: writing key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Key{}, fmt.Errorf("sealed: syncing key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Key{}, fmt.Errorf("sealed: closing key file: %w", err)
	}
	if err := os.Link(tmpName, path); err != nil {
		// fs.ErrExist: another process created it first; the caller loads it.
		return Key{}, fmt.Errorf("sealed: creating key file: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return Key{}, fmt.Errorf("sealed: syncing key directory: %w", err)
	}
	return k, nil
}

func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
