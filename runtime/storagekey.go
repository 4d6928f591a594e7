package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// Storage key rotation (docs/protocol.md, "At rest"; requirement: "storage key
// rotation re-encrypts every sealed column in one pass that is safe to
// interrupt and resume").
//
// Key-file nodes rotate with RotateStorageKey on the closed node's
// directory:
//
//  1. a new key is written durably as storage.key.next (0600, created
//     exclusively, file and directory fsynced);
//  2. every sealed record is re-sealed under it (persistence/bolt
//     (*DB).Reseal, with a sealer holding the new key as current and the
//     old one for opening; batches commit on their own);
//  3. storage.key.next is renamed over storage.key and the directory is
//     fsynced.
//
// A crash anywhere leaves either no storage.key.next (nothing started, or
// everything finished) or storage.key.next beside storage.key, with every
// record under one of the two keys. Open detects the second case and
// finishes the rotation (steps 2 and 3) before it returns; so does a new
// RotateStorageKey call.
//
// Nodes configured with Config.StorageKey rotate by configuration: set the
// new key as StorageKey and the old one in Config.PreviousStorageKeys;
// Open re-seals every record still under a previous key before it returns,
// after which the previous keys can be dropped from the configuration.

// nextKeyName is the file holding the key of an unfinished rotation.
const nextKeyName = "storage.key.next"

// Rotation points passed to the failpoint hook (tests), besides the bolt
// failpoints of the reseal itself.
const (
	failpointRotateAfterNext   = "rotate.after_next"   // storage.key.next durable, nothing resealed
	failpointRotateAfterReseal = "rotate.after_reseal" // everything resealed, not yet renamed
)

// rotateLockTimeout bounds the wait for the bbolt file lock in
// RotateStorageKey: a node still open on the directory holds it.
const rotateLockTimeout = 5 * time.Second

// rotation carries what the rotation steps need besides the directory.
type rotation struct {
	dir         string
	noSync      bool
	failpoint   func(name string) error
	log         *slog.Logger
	lockTimeout time.Duration
}

func (r *rotation) keyPath() string  { return filepath.Join(r.dir, "storage.key") }
func (r *rotation) nextPath() string { return filepath.Join(r.dir, nextKeyName) }
func (r *rotation) dbPath() string   { return filepath.Join(r.dir, "node.db") }

func (r *rotation) hook(name string) error {
	if r.failpoint == nil {
		return nil
	}
	if err := r.failpoint(name); err != nil {
		return fmt.Errorf("runtime: failpoint %s: %w", name, err)
	}
	return nil
}

// RotateStorageKey replaces the storage key of the key-file node whose
// directory is dir. It writes a new random key durably as
// storage.key.next (0600, created exclusively, file and directory
// fsynced), re-seals every sealed record under it in batches that commit
// on their own, then renames storage.key.next over storage.key and fsyncs
// the directory. It is safe to interrupt at any point: Open (or another
// RotateStorageKey) on a directory holding storage.key.next finishes the
// rotation before doing anything else.
//
// The node must be closed: while a node has dir open, RotateStorageKey
// waits up to 5 s for its file lock and fails with ErrLocked, leaving
// nothing behind. A directory without storage.key fails with
// ErrNoStorageKeyFile (nodes configured with Config.StorageKey rotate
// through Config.PreviousStorageKeys).
//
// It is a function of the directory rather than a Node method because a
// running node seals new records under its key while it runs, and both the
// re-seal and the key file swap need the file to themselves.
func RotateStorageKey(ctx context.Context, dir string) error {
	return rotateStorageKey(ctx, &rotation{dir: dir, lockTimeout: rotateLockTimeout})
}

func rotateStorageKey(ctx context.Context, r *rotation) error {
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := os.Lstat(r.keyPath()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s", ErrNoStorageKeyFile, r.keyPath())
		}
		return fmt.Errorf("runtime: storage key: %w", err)
	}
	_, err := os.Lstat(r.nextPath())
	fresh := errors.Is(err, fs.ErrNotExist)
	if err != nil && !fresh {
		return fmt.Errorf("runtime: storage key: %w", err)
	}
	// Step 1: the new key, durable before any record is sealed under it.
	// LoadOrCreateKeyFile creates it exclusively (0600, temporary file,
	// fsync, link, directory fsync), or loads the unfinished one.
	if _, err := sealed.LoadOrCreateKeyFile(r.nextPath()); err != nil {
		return fmt.Errorf("runtime: new storage key: %w", err)
	}
	if err := r.hook(failpointRotateAfterNext); err != nil {
		return err
	}
	err = r.finish(ctx)
	if fresh && errors.Is(err, errStoreOpen) {
		// Nothing was sealed under the new key (the store never opened):
		// withdraw it, so a node still running on dir is left as it was.
		if rmErr := os.Remove(r.nextPath()); rmErr == nil {
			_ = syncDir(r.dir)
		}
	}
	return err
}

// errStoreOpen marks a failure to open the store during a rotation.
var errStoreOpen = errors.New("runtime: open store for rotation")

// pending reports whether dir holds an unfinished rotation.
func (r *rotation) pending() (bool, error) {
	_, err := os.Lstat(r.nextPath())
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("runtime: storage key: %w", err)
	}
	if _, err := os.Lstat(r.keyPath()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("%w in %s", ErrStorageKeyState, r.dir)
		}
		return false, fmt.Errorf("runtime: storage key: %w", err)
	}
	return true, nil
}

// finish runs steps 2 and 3 of a rotation whose storage.key.next exists.
func (r *rotation) finish(ctx context.Context) error {
	cur, err := sealed.LoadOrCreateKeyFile(r.keyPath()) // exists: checked by the callers
	if err != nil {
		return fmt.Errorf("runtime: storage key: %w", err)
	}
	next, err := sealed.LoadOrCreateKeyFile(r.nextPath())
	if err != nil {
		return fmt.Errorf("runtime: new storage key: %w", err)
	}
	s, err := sealed.New(next, cur)
	if err != nil {
		return fmt.Errorf("runtime: storage key rotation: %w", err)
	}
	db, err := bolt.Open(r.dbPath(), bolt.Options{Sealer: s, NoSync: r.noSync, Failpoint: r.failpoint, Logger: r.log, Timeout: r.lockTimeout})
	if errors.Is(err, persistence.ErrLocked) {
		return fmt.Errorf("%w: %w: %s (gave up after %v)", errStoreOpen, ErrLocked, r.dbPath(), r.lockTimeout)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errStoreOpen, err)
	}
	// Step 2.
	n, err := db.Reseal(ctx, 0)
	if err = errors.Join(err, db.Close()); err != nil {
		return fmt.Errorf("runtime: storage key rotation: reseal: %w", err)
	}
	if err := r.hook(failpointRotateAfterReseal); err != nil {
		return err
	}
	// Step 3: atomic, then durable.
	if err := os.Rename(r.nextPath(), r.keyPath()); err != nil {
		return fmt.Errorf("runtime: storage key rotation: %w", err)
	}
	if err := syncDir(r.dir); err != nil {
		return fmt.Errorf("runtime: storage key rotation: sync %s: %w", r.dir, err)
	}
	r.log.Info("runtime: storage key rotated", "dir", r.dir, "resealed", n)
	return nil
}

// storageSealer returns the sealer a bbolt node opens its store with, and
// whether records under previous keys must be re-sealed once it is open.
// A key-file node's unfinished rotation is finished first.
func (n *Node) storageSealer(ctx context.Context) (s *sealed.Sealer, reseal bool, err error) {
	if len(n.cfg.StorageKey) > 0 {
		key, err := sealed.ParseKey(n.cfg.StorageKey)
		if err != nil {
			return nil, false, &ConfigError{"StorageKey", err.Error()}
		}
		prev := make([]sealed.Key, 0, len(n.cfg.PreviousStorageKeys))
		for i, b := range n.cfg.PreviousStorageKeys {
			k, err := sealed.ParseKey(b)
			if err != nil {
				return nil, false, &ConfigError{fmt.Sprintf("PreviousStorageKeys[%d]", i), err.Error()}
			}
			prev = append(prev, k)
		}
		if s, err = sealed.New(key, prev...); err != nil {
			return nil, false, &ConfigError{"PreviousStorageKeys", err.Error()}
		}
		return s, len(prev) > 0, nil
	}
	r := &rotation{dir: n.cfg.Dir, noSync: n.cfg.NoSync, failpoint: n.cfg.Failpoint, log: n.log, lockTimeout: n.cfg.LockTimeout}
	pending, err := r.pending()
	if err != nil {
		return nil, false, err
	}
	if pending {
		n.log.Info("runtime: finishing an interrupted storage key rotation", "dir", n.cfg.Dir)
		if err := r.finish(ctx); err != nil {
			return nil, false, err
		}
	}
	key, err := sealed.LoadOrCreateKeyFile(n.cfg.keyPath())
	if err != nil {
		return nil, false, fmt.Errorf("runtime: storage key: %w", err)
	}
	if s, err = sealed.New(key); err != nil {
		return nil, false, fmt.Errorf("runtime: storage key: %w", err)
	}
	return s, false, nil
}

// resealPrevious re-seals, under Config.StorageKey, every record still
// sealed under one of Config.PreviousStorageKeys. Interrupted, it resumes
// at the next Open with the same configuration.
func (n *Node) resealPrevious(ctx context.Context) error {
	c, err := n.db.Reseal(ctx, 0)
	if err != nil {
		return fmt.Errorf("runtime: reseal under the new storage key: %w", err)
	}
	if c > 0 {
		n.log.Info("runtime: resealed records under the new storage key", "records", c)
	}
	return nil
}

func syncDir(dir string) error {
	if goruntime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
