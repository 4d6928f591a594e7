package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/persistence"
)

// A write set is one read-write transaction's writes, in order, as the
// bytes bbolt stored: what a replicated log carries so that every copy of
// a file applies the same transactions in the same order
// (docs/replication.md, "Replicated units").
//
// Encoding (version 1):
//
//	"SMW1" | base(8, big-endian) | op* | CRC-32C(everything before, 4 bytes big-endian)
//	op = kind(1) | depth(uvarint) | depth × (len(uvarint) | name) |
//	     len(uvarint) | key | [put only: len(uvarint) | value]
//
// base is the file's applied index (ApplyWriteSet) the transaction read:
// the write set applies only to a file still at that index, so a write
// computed on a copy that had not applied everything before it (a leader
// that had not caught up) is refused the same way on every replica
// (ErrStaleWriteSet) instead of applying over a newer state.
//
// kind 1 puts key=value into the bucket at the path, 2 deletes key from
// it, 3 creates bucket key under the path (the root for depth 0) unless it
// exists, 4 deletes bucket key under the path.
//
// Limits, the same for the recorder and the decoder: a write set is at
// most MaxWriteSetSize bytes; a path at most MaxWriteSetDepth buckets
// deep; keys and bucket names 1 to bbolt.MaxKeySize bytes; values at most
// MaxWriteSetSize bytes.

// Committer makes a captured write set durable. With Options.Committer
// set, a DB's Update runs the transaction, records its writes, rolls it
// back and calls Commit; the write becomes visible when the committer
// applies the write set to this DB with ApplyWriteSet (on every replica,
// in the committer's log order). Commit returns after that apply, or an
// error: then the write may or may not be applied, as the committer's
// error says.
type Committer interface {
	Commit(ctx context.Context, ws []byte) error
}

// Limits of a write set (see the encoding above).
const (
	// MaxWriteSetSize bounds an encoded write set: one transaction's
	// writes. A larger transaction fails with ErrWriteSetTooLarge.
	MaxWriteSetSize = 64 << 20
	// MaxWriteSetDepth bounds how deep a bucket path nests.
	MaxWriteSetDepth = 8
)

var (
	// ErrBadWriteSet is returned (wrapped) for a write set that does not
	// decode, or whose operations do not apply to the file (a bucket it
	// writes to is missing). Nothing of it is applied.
	ErrBadWriteSet = errors.New("bolt: bad write set")
	// ErrStaleWriteSet is returned (wrapped) by ApplyWriteSet, and so by
	// a committed Update, for a write set whose transaction read an older
	// state of the file than the one it would apply to: nothing of it is
	// applied. The writer retries on the current state.
	ErrStaleWriteSet = errors.New("bolt: write set computed on a stale state")
	// ErrWriteSetTooLarge is returned (wrapped, with persistence.ErrLimit)
	// by an Update whose writes exceed MaxWriteSetSize; nothing is
	// written.
	ErrWriteSetTooLarge = errors.New("bolt: write set too large")
)

const (
	opPut          = 1
	opDelete       = 2
	opCreateBucket = 3
	opDeleteBucket = 4
)

var writeSetMagic = []byte("SMW1")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaAppliedIndex is the key of bucketMeta holding the highest log index
// ApplyWriteSet applied (8 bytes big-endian; absent: 0).
var metaAppliedIndex = []byte("replication.applied_index")

// recorder accumulates one transaction's write set. A nil recorder
// records nothing.
type recorder struct {
	buf []byte
	ops int
	err error
}

func newRecorder() *recorder {
	return &recorder{buf: append(append(make([]byte, 0, 4096), writeSetMagic...), make([]byte, 8)...)}
}

// headerLen is the magic and the base index.
const headerLen = 4 + 8

func (r *recorder) op(kind byte, path [][]byte, key, value []byte) {
	if r == nil || r.err != nil {
		return
	}
	b := append(r.buf, kind)
	b = binary.AppendUvarint(b, uint64(len(path)))
	for _, p := range path {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	if kind == opPut {
		b = binary.AppendUvarint(b, uint64(len(value)))
		b = append(b, value...)
	}
	r.buf = b
	r.ops++
	if len(path) > MaxWriteSetDepth {
		r.err = fmt.Errorf("bolt: bucket path %d deep, limit %d: %w", len(path), MaxWriteSetDepth, ErrBadWriteSet)
	}
	if len(r.buf)+4 > MaxWriteSetSize {
		r.err = fmt.Errorf("bolt: write set over %d bytes: %w: %w", MaxWriteSetSize, ErrWriteSetTooLarge, persistence.ErrLimit)
		r.buf = nil
	}
}

// finish returns the encoded write set over base, nil when nothing was
// written.
func (r *recorder) finish(base uint64) ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	if r.ops == 0 {
		return nil, nil
	}
	binary.BigEndian.PutUint64(r.buf[len(writeSetMagic):headerLen], base)
	return binary.BigEndian.AppendUint32(r.buf, crc32.Checksum(r.buf, castagnoli)), nil
}

// wsOp is one decoded operation; its slices point into the write set.
type wsOp struct {
	kind       byte
	path       [][]byte
	key, value []byte
}

func badWS(format string, args ...any) error {
	return fmt.Errorf("bolt: write set: "+format+": %w", append(args, ErrBadWriteSet)...)
}

// decodeWriteSet checks the whole encoding (magic, limits, checksum) and
// returns the base index and the operations in order.
func decodeWriteSet(ws []byte) (uint64, []wsOp, error) {
	if len(ws) > MaxWriteSetSize {
		return 0, nil, fmt.Errorf("bolt: write set of %d bytes over %d: %w: %w", len(ws), MaxWriteSetSize, ErrBadWriteSet, persistence.ErrLimit)
	}
	if len(ws) < headerLen+4 || string(ws[:len(writeSetMagic)]) != string(writeSetMagic) {
		return 0, nil, badWS("no header")
	}
	body := ws[:len(ws)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(ws[len(ws)-4:]) {
		return 0, nil, badWS("checksum mismatch")
	}
	base := binary.BigEndian.Uint64(body[len(writeSetMagic):headerLen])
	var ops []wsOp
	rest := body[headerLen:]
	field := func(what string, min, max int) ([]byte, error) {
		n, w := binary.Uvarint(rest)
		if w <= 0 {
			return nil, badWS("%s length", what)
		}
		rest = rest[w:]
		if n < uint64(min) || n > uint64(max) || n > uint64(len(rest)) {
			return nil, badWS("%s of %d bytes", what, n)
		}
		v := rest[:n:n]
		rest = rest[n:]
		return v, nil
	}
	for len(rest) > 0 {
		op := wsOp{kind: rest[0]}
		rest = rest[1:]
		if op.kind < opPut || op.kind > opDeleteBucket {
			return 0, nil, badWS("operation kind %d", op.kind)
		}
		depth, w := binary.Uvarint(rest)
		if w <= 0 || depth > MaxWriteSetDepth {
			return 0, nil, badWS("bucket path depth")
		}
		rest = rest[w:]
		if depth == 0 && (op.kind == opPut || op.kind == opDelete) {
			return 0, nil, badWS("key outside a bucket")
		}
		for range depth {
			p, err := field("bucket name", 1, bbolt.MaxKeySize)
			if err != nil {
				return 0, nil, err
			}
			op.path = append(op.path, p)
		}
		var err error
		if op.key, err = field("key", 1, bbolt.MaxKeySize); err != nil {
			return 0, nil, err
		}
		if op.kind == opPut {
			if op.value, err = field("value", 0, MaxWriteSetSize); err != nil {
				return 0, nil, err
			}
		}
		ops = append(ops, op)
	}
	return base, ops, nil
}

// applyOps applies a write set's operations inside tx, to a file whose
// applied index is cur.
func applyOps(tx *bbolt.Tx, ws []byte, cur uint64) error {
	base, ops, err := decodeWriteSet(ws)
	if err != nil {
		return err
	}
	if base != cur {
		return fmt.Errorf("bolt: write set read index %d, the file is at %d: %w", base, cur, ErrStaleWriteSet)
	}
	for _, op := range ops {
		if err := applyOp(tx, op); err != nil {
			return err
		}
	}
	return nil
}

func applyOp(tx *bbolt.Tx, op wsOp) error {
	var b *bbolt.Bucket
	for i, p := range op.path {
		if i == 0 {
			b = tx.Bucket(p)
		} else {
			b = b.Bucket(p)
		}
		if b == nil {
			return badWS("bucket %q missing", p)
		}
	}
	var err error
	switch op.kind {
	case opPut:
		err = b.Put(op.key, op.value)
	case opDelete:
		err = b.Delete(op.key)
	case opCreateBucket:
		if b == nil {
			_, err = tx.CreateBucketIfNotExists(op.key)
		} else {
			_, err = b.CreateBucketIfNotExists(op.key)
		}
	case opDeleteBucket:
		if b == nil {
			err = tx.DeleteBucket(op.key)
		} else {
			err = b.DeleteBucket(op.key)
		}
	}
	if err != nil {
		return badWS("%v", err)
	}
	return nil
}

// ApplyWriteSet applies the write set ws (nil: none, only the index is
// recorded), the entry at log index index,
// in one transaction that also records index. An index at or below the
// one recorded is skipped (nil): replaying a log after a restart applies
// each entry once. A malformed write set, or one that does not apply,
// returns ErrBadWriteSet and changes nothing.
//
// It never goes through Options.Committer: it is how a committer applies.
func (d *DB) ApplyWriteSet(index uint64, ws []byte) error {
	if d.closed.Load() {
		return fmt.Errorf("bolt: apply write set: %w", persistence.ErrClosed)
	}
	err := d.bolt.Update(func(tx *bbolt.Tx) error {
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		cur, err := appliedIndex(m)
		if err != nil {
			return err
		}
		if index <= cur {
			return nil
		}
		if ws != nil {
			if err := applyOps(tx, ws, cur); err != nil {
				return err
			}
		}
		return m.Put(metaAppliedIndex, u64(index))
	})
	return mapErr("apply write set", err)
}

// SetAppliedIndex records index as applied without writing anything else
// (an entry of the log that carries no write set for this file); it never
// lowers the recorded index.
func (d *DB) SetAppliedIndex(index uint64) error {
	return d.ApplyWriteSet(index, nil)
}

// AppliedIndex returns the highest log index ApplyWriteSet applied to the
// file (0: none).
func (d *DB) AppliedIndex() (uint64, error) {
	if d.closed.Load() {
		return 0, fmt.Errorf("bolt: applied index: %w", persistence.ErrClosed)
	}
	var idx uint64
	err := d.bolt.View(func(tx *bbolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if m == nil {
			return nil
		}
		var err error
		idx, err = appliedIndex(m)
		return err
	})
	return idx, mapErr("applied index", err)
}

func appliedIndex(m *bbolt.Bucket) (uint64, error) {
	v := m.Get(metaAppliedIndex)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("bolt: applied index is %d bytes: %w", len(v), persistence.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), nil
}

// ApplyWriteSetFile opens the file at path (creating and migrating it
// like Open), applies ws as ApplyWriteSet does and closes it.
// opts.Committer is ignored.
func ApplyWriteSetFile(path string, index uint64, ws []byte, opts Options) error {
	opts.Committer = nil
	d, err := Open(path, opts)
	if err != nil {
		return err
	}
	err = d.ApplyWriteSet(index, ws)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeLock serializes Updates through a Committer: from the capture to
// the committer's apply, no other write may read the file's state.
type writeLock struct{ mu sync.Mutex }

// view runs fn in a read-only transaction.
func (d *DB) view(fn func(tx *wtx) error) error {
	return d.bolt.View(func(tx *bbolt.Tx) error { return fn(wrapTx(tx)) })
}

// update runs fn in a read-write transaction: directly, or — with a
// Committer — captured, rolled back and handed to the Committer.
func (d *DB) update(ctx context.Context, fn func(tx *wtx) error) error {
	c := d.opts.Committer
	if c == nil {
		return d.bolt.Update(func(tx *bbolt.Tx) error { return fn(wrapTx(tx)) })
	}
	d.writeLock.mu.Lock()
	defer d.writeLock.mu.Unlock()
	rec := newRecorder()
	tx, err := d.bolt.Begin(true)
	if err != nil {
		return err
	}
	var base uint64
	err = func() error {
		defer func() { _ = tx.Rollback() }()
		if err := fn(&wtx{Tx: tx, rec: rec}); err != nil {
			return err
		}
		if m := tx.Bucket(bucketMeta); m != nil {
			var err error
			base, err = appliedIndex(m)
			return err
		}
		return nil
	}()
	if err != nil {
		return err
	}
	ws, err := rec.finish(base)
	if err != nil || ws == nil {
		return err
	}
	return c.Commit(ctx, ws)
}
