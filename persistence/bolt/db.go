// Package bolt implements the persistence contracts on bbolt: one file per
// node, a versioned layout with an explicit migration list, the event log
// sealed at rest (docs/protocol.md, "At rest"), and named failpoints for crash and
// fault injection (docs/architecture.md, "Practices").
//
// A DB owns the file; Sync returns the sync-plane store over it. Further
// stores (the delivery plane) are added as new files of this package that
// use the same *bbolt.DB, bucket layout and migration list.
package bolt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/syncmesh/syncmesh/persistence"
)

// Failpoint names passed to Options.Failpoint (docs/architecture.md, "Practices":
// a small storage seam where tests inject failures and crashes).
const (
	// FailpointSyncUpdateBeforeCommit runs inside a sync Update after fn
	// succeeded, before the commit; an error aborts the transaction.
	FailpointSyncUpdateBeforeCommit = "sync.update.before_commit"
	// FailpointSyncUpdateAfterCommit runs after a sync Update committed
	// durably, before Update returns; an error is returned to the caller
	// although the data is durable (a crash after commit).
	FailpointSyncUpdateAfterCommit = "sync.update.after_commit"
	// FailpointResealAfterBatch runs after each committed Reseal batch; an
	// error stops Reseal (a crash between batches).
	FailpointResealAfterBatch = "reseal.batch.after_commit"
)

// Options configure Open.
type Options struct {
	// Sealer seals records at rest; nil stores plaintext.
	Sealer persistence.Sealer
	// NoSync skips fsync on commit. Tests only: a crash loses data.
	NoSync bool
	// Failpoint, when set, is called at each named failpoint (the
	// Failpoint* constants); a non-nil error is injected there.
	Failpoint func(name string) error
	// Timeout bounds the wait for the file lock (0: wait forever).
	Timeout time.Duration
	// Logger receives migration and reseal notices; nil discards them.
	Logger *slog.Logger
	// Committer, when set, replicates writes: every Update (and Reseal
	// batch) is captured as a write set, rolled back and handed to it;
	// it is visible once the Committer applied it with ApplyWriteSet
	// (writeset.go). Open's own layout migration stays local: a
	// migration is a deterministic function of the file, and every
	// replica migrates its copy when it opens it.
	Committer Committer
}

// DB is an open bbolt file holding a node's stores.
type DB struct {
	bolt   *bbolt.DB
	opts   Options
	log    *slog.Logger
	closed atomic.Bool
	writeLock

	syncCommits, deliveryCommits atomic.Uint64
	deliveryWrites               writeCounters // delivery.go

	// rowsHint and pendHint are the rows and index entries the last sync
	// transaction wrote: the next one sizes its buffers by them.
	rowsHint, pendHint atomic.Int64

	// scratch is the memory of the last batch-writing sync transaction,
	// kept for the next (scratch.go).
	scratch atomic.Pointer[txScratch]
}

// CommitStats counts the read-write transactions a DB committed, per plane.
// Benchmarks divide them by the work done (pushes received, messages
// committed): one bbolt commit costs two fdatasyncs.
type CommitStats struct {
	// Sync counts committed sync-plane Updates.
	Sync uint64
	// Delivery counts committed delivery-plane Updates.
	Delivery uint64
}

// Commits returns the read-write transactions committed since Open.
func (d *DB) Commits() CommitStats {
	return CommitStats{Sync: d.syncCommits.Load(), Delivery: d.deliveryCommits.Load()}
}

// Open opens (creating if needed) the file at path and migrates its layout
// to the current version in one transaction. A file written by a newer
// layout returns an error matching persistence.ErrLayoutVersion.
func Open(path string, opts Options) (*DB, error) {
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: opts.Timeout, NoSync: opts.NoSync, InitialMmapSize: initialMmapSize})
	if errors.Is(err, bolterrors.ErrTimeout) {
		// bbolt's own error type stays inside this package.
		return nil, fmt.Errorf("bolt: open %s: %w: %w", path, persistence.ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	d := &DB{bolt: bdb, opts: opts, log: opts.Logger}
	if d.log == nil {
		d.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := migrate(bdb, d.log, opts.Sealer); err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	return d, nil
}

// Close closes the file. Calls on the DB or its stores after Close return
// persistence.ErrClosed; Close itself is idempotent (a second call returns
// nil).
func (d *DB) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.scratch.Store(nil)
	if err := d.bolt.Close(); err != nil {
		return fmt.Errorf("bolt: close: %w", err)
	}
	return nil
}

// failpoint calls the configured failpoint hook.
func (d *DB) failpoint(name string) error {
	if d.opts.Failpoint == nil {
		return nil
	}
	if err := d.opts.Failpoint(name); err != nil {
		return fmt.Errorf("bolt: failpoint %s: %w", name, err)
	}
	return nil
}

// mapErr turns bbolt's "closed" errors into persistence.ErrClosed.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, bolterrors.ErrDatabaseNotOpen) || errors.Is(err, bolterrors.ErrTxClosed) {
		return fmt.Errorf("bolt: %s: %w: %w", op, persistence.ErrClosed, err)
	}
	return err
}

// begin checks the shared preconditions of a transaction.
func (d *DB) begin(ctx context.Context, op string) error {
	if d.closed.Load() {
		return fmt.Errorf("bolt: %s: %w", op, persistence.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w", op, err)
	}
	return nil
}

// initialMmapSize reserves address space (not memory or disk) for the
// file's map up front: while the file grows within it bbolt never
// re-maps, and a re-map copies every node a write transaction touched.
const initialMmapSize = 64 << 20
