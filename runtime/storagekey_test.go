package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

const rotRows = 12

// seedNode creates a node in cfg.Dir with a table and rotRows rows (so
// sealed events and the sealed node key exist), and closes it.
func seedNode(t *testing.T, cfg Config) {
	t.Helper()
	cfg.MeshID, cfg.NoSync = testMesh, true
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	ctx := context.Background()
	if err := n.DefineTable(ctx, defT); err != nil {
		t.Fatal(err)
	}
	for i := range rotRows {
		if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": fmt.Sprint("v", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// reopenAndCheck opens the node with cfg and checks every row and every
// logged event reads back.
func reopenAndCheck(t *testing.T, cfg Config) {
	t.Helper()
	cfg.NoSync = true
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer n.Close()
	ctx := context.Background()
	for i := range rotRows {
		r, ok, err := n.Get(ctx, "app", "t", map[string]any{"id": i})
		if err != nil || !ok {
			t.Fatalf("row %d: %v, %v", i, ok, err)
		}
		var a string
		if _, err := r.Value("a", &a); err != nil || a != fmt.Sprint("v", i) {
			t.Fatalf("row %d a = %q, %v", i, a, err)
		}
	}
	log, err := n.Log(ctx, 0, 0)
	if err != nil || len(log) < rotRows {
		t.Fatalf("log: %d entries, %v", len(log), err)
	}
}

// storeOpensWith opens every sealed record of dir's store (events and the
// node key) with a sealer holding only key.
func storeOpensWith(dir string, key sealed.Key) error {
	s, err := sealed.New(key)
	if err != nil {
		return err
	}
	db, err := bolt.Open(filepath.Join(dir, "node.db"), bolt.Options{Sealer: s, NoSync: true, Timeout: time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Sync().View(context.Background(), func(r persistence.SyncReader) error {
		seen := 0
		if err := r.EventsAfter(0, 0, func(persistence.StoredEvent) (bool, error) { seen++; return true, nil }); err != nil {
			return err
		}
		if seen < rotRows {
			return fmt.Errorf("%d events", seen)
		}
		if _, ok, err := r.SealedMeta(persistence.RecordNodeKey, metaNodeKey); err != nil || !ok {
			return fmt.Errorf("node key: %v, %w", ok, err)
		}
		return nil
	})
}

func readKey(t *testing.T, path string) sealed.Key {
	t.Helper()
	k, err := sealed.LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func noNextFile(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(dir, nextKeyName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still present (%v)", nextKeyName, err)
	}
}

// failAt returns a failpoint hook that injects persistence.ErrInjected at
// the count-th call of name.
func failAt(name string, count int) func(string) error {
	seen := 0
	return func(n string) error {
		if n == name {
			if seen++; seen == count {
				return persistence.ErrInjected
			}
		}
		return nil
	}
}

// TestRotateStorageKeyReencryptsEverything: a completed rotation leaves a
// new key in storage.key, no storage.key.next, and a store only the new
// key opens.
func TestRotateStorageKeyReencryptsEverything(t *testing.T) {
	dir := t.TempDir()
	seedNode(t, Config{Dir: dir})
	old := readKey(t, filepath.Join(dir, "storage.key"))
	if err := RotateStorageKey(context.Background(), dir); err != nil {
		t.Fatalf("RotateStorageKey: %v", err)
	}
	noNextFile(t, dir)
	st, err := os.Stat(filepath.Join(dir, "storage.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("storage.key mode = %v, %v", st, err)
	}
	nk := readKey(t, filepath.Join(dir, "storage.key"))
	if nk == old {
		t.Fatal("the key did not change")
	}
	if err := storeOpensWith(dir, nk); err != nil {
		t.Fatalf("new key alone: %v", err)
	}
	if err := storeOpensWith(dir, old); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("old key alone: %v, want ErrCorrupt", err)
	}
	reopenAndCheck(t, Config{Dir: dir})
}

// TestOpenFinishesInterruptedRotation: a rotation interrupted after the new
// key is durable, in the middle of the reseal, or after the reseal but
// before the rename is finished by Open: all data readable, storage.key is
// the new key, no storage.key.next, only the new key opens the store.
func TestOpenFinishesInterruptedRotation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fp      func(string) error
		partial bool // records under both keys at the interruption
	}{
		{"after writing storage.key.next", failAt(failpointRotateAfterNext, 1), false},
		// The event log is one batch (< 256 records): the crash leaves it
		// resealed and the sealed node key not.
		{"mid-reseal", failAt(bolt.FailpointResealAfterBatch, 1), true},
		{"after reseal before rename", failAt(failpointRotateAfterReseal, 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			seedNode(t, Config{Dir: dir})
			old := readKey(t, filepath.Join(dir, "storage.key"))
			err := rotateStorageKey(context.Background(), &rotation{dir: dir, noSync: true, failpoint: tc.fp, lockTimeout: time.Second})
			if !errors.Is(err, persistence.ErrInjected) {
				t.Fatalf("interrupted rotation = %v, want ErrInjected", err)
			}
			next := readKey(t, filepath.Join(dir, nextKeyName))
			if cur := readKey(t, filepath.Join(dir, "storage.key")); cur != old || next == old {
				t.Fatal("the interrupted rotation changed storage.key or reused the key")
			}
			if tc.partial && (storeOpensWith(dir, old) == nil || storeOpensWith(dir, next) == nil) {
				t.Fatal("the interruption did not leave records under both keys")
			}
			// Open must use both keys and finish.
			reopenAndCheck(t, Config{Dir: dir})
			noNextFile(t, dir)
			if cur := readKey(t, filepath.Join(dir, "storage.key")); cur != next {
				t.Fatal("storage.key is not the rotation's new key")
			}
			if err := storeOpensWith(dir, next); err != nil {
				t.Fatalf("new key alone: %v", err)
			}
			if err := storeOpensWith(dir, old); !errors.Is(err, persistence.ErrCorrupt) {
				t.Fatalf("old key alone: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestRotateStorageKeyResumesUnfinished: a second RotateStorageKey after an
// interrupted one finishes it with the same new key.
func TestRotateStorageKeyResumesUnfinished(t *testing.T) {
	dir := t.TempDir()
	seedNode(t, Config{Dir: dir})
	if err := rotateStorageKey(context.Background(), &rotation{dir: dir, noSync: true, failpoint: failAt(bolt.FailpointResealAfterBatch, 1), lockTimeout: time.Second}); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("interrupted rotation = %v", err)
	}
	next := readKey(t, filepath.Join(dir, nextKeyName))
	if err := RotateStorageKey(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	noNextFile(t, dir)
	if readKey(t, filepath.Join(dir, "storage.key")) != next {
		t.Fatal("the resumed rotation used another key")
	}
	if err := storeOpensWith(dir, next); err != nil {
		t.Fatal(err)
	}
}

// TestRotateStorageKeyWhileOpenLeavesNothing: the running node holds the
// file lock; RotateStorageKey fails with ErrLocked and withdraws its new
// key, so the node keeps working and reopens with its key.
func TestRotateStorageKeyWhileOpenLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	seedNode(t, Config{Dir: dir})
	n, err := Open(context.Background(), Config{Dir: dir, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	err = rotateStorageKey(context.Background(), &rotation{dir: dir, lockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("rotation of an open node = %v, want ErrLocked", err)
	}
	noNextFile(t, dir)
}

func TestRotateStorageKeyErrors(t *testing.T) {
	ctx := context.Background()
	if err := RotateStorageKey(ctx, t.TempDir()); !errors.Is(err, ErrNoStorageKeyFile) {
		t.Fatalf("empty dir: %v, want ErrNoStorageKeyFile", err)
	}
	// A configured-key node has no key file to rotate.
	dir := t.TempDir()
	seedNode(t, Config{Dir: dir, StorageKey: bytes.Repeat([]byte{7}, 32)})
	if err := RotateStorageKey(ctx, dir); !errors.Is(err, ErrNoStorageKeyFile) {
		t.Fatalf("configured-key node: %v, want ErrNoStorageKeyFile", err)
	}
	// storage.key.next without storage.key: never produced by a rotation.
	dir = t.TempDir()
	seedNode(t, Config{Dir: dir})
	if err := os.Rename(filepath.Join(dir, "storage.key"), filepath.Join(dir, nextKeyName)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Config{Dir: dir, NoSync: true}); !errors.Is(err, ErrStorageKeyState) {
		t.Fatalf("Open with only storage.key.next: %v, want ErrStorageKeyState", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := RotateStorageKey(cctx, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestPreviousStorageKeysResealOnOpen: a configured-key node rotated by
// configuration (new StorageKey, old key in PreviousStorageKeys) has every
// record resealed by Open, resuming after an interrupted Open, and then
// opens with the new key alone.
func TestPreviousStorageKeysResealOnOpen(t *testing.T) {
	dir := t.TempDir()
	keyA, keyB := bytes.Repeat([]byte{0xa1}, 32), bytes.Repeat([]byte("b2"), 32) // raw and hex forms
	seedNode(t, Config{Dir: dir, StorageKey: keyA})
	// The new key alone cannot open the old records.
	if _, err := Open(context.Background(), Config{Dir: dir, NoSync: true, StorageKey: keyB}); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("open with the new key only before the reseal: %v, want ErrCorrupt", err)
	}
	// Interrupted after the first reseal batch (the event log).
	_, err := Open(context.Background(), Config{Dir: dir, NoSync: true, StorageKey: keyB, PreviousStorageKeys: [][]byte{keyA},
		Failpoint: failAt(bolt.FailpointResealAfterBatch, 1)})
	if !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("interrupted Open = %v, want ErrInjected", err)
	}
	reopenAndCheck(t, Config{Dir: dir, StorageKey: keyB, PreviousStorageKeys: [][]byte{keyA}})
	reopenAndCheck(t, Config{Dir: dir, StorageKey: keyB})
	kb, err := sealed.ParseKey(keyB)
	if err != nil {
		t.Fatal(err)
	}
	if err := storeOpensWith(dir, kb); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), Config{Dir: dir, NoSync: true, StorageKey: keyA}); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("open with the old key after the reseal: %v, want ErrCorrupt", err)
	}
}

func TestPreviousStorageKeysValidated(t *testing.T) {
	ctx := context.Background()
	good := bytes.Repeat([]byte{1}, 32)
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string
	}{
		{"without StorageKey", Config{PreviousStorageKeys: [][]byte{good}}, "PreviousStorageKeys"},
		{"bad length", Config{StorageKey: good, PreviousStorageKeys: [][]byte{{1, 2, 3}}}, "PreviousStorageKeys[0]"},
		{"not hex", Config{StorageKey: good, PreviousStorageKeys: [][]byte{bytes.Repeat([]byte("zz"), 32)}}, "PreviousStorageKeys[0]"},
		{"all zero", Config{StorageKey: good, PreviousStorageKeys: [][]byte{good, make([]byte, 32)}}, "PreviousStorageKeys[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Dir, tc.cfg.MeshID, tc.cfg.NoSync = t.TempDir(), testMesh, true
			_, err := Open(ctx, tc.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("Open = %v, want a ConfigError on %s", err, tc.field)
			}
		})
	}
}
