package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

// loopCommitter applies each write set at once, in order, to the DB it
// serves and to a mirror that sees nothing else: a log of one replica.
type loopCommitter struct {
	mu     sync.Mutex
	db     *DB
	mirror *DB
	index  uint64
	sets   int
}

func (c *loopCommitter) Commit(_ context.Context, ws []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	c.sets++
	if err := c.mirror.ApplyWriteSet(c.index, ws); err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	return c.db.ApplyWriteSet(c.index, ws)
}

// captured opens path with a loopCommitter and a mirror beside it; at the
// test's end the mirror's content must equal the file's.
func captured(t *testing.T, opts Options) (*DB, func() *DB) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.db")
	mirror := mustOpen(t, filepath.Join(dir, "mirror.db"), Options{NoSync: true})
	lc := &loopCommitter{mirror: mirror}
	opts.Committer = lc
	db := mustOpen(t, path, opts)
	lc.db = db
	t.Cleanup(func() {
		lc.mu.Lock()
		cur := lc.db
		lc.mu.Unlock()
		_ = cur.Close()
		_ = mirror.Close()
		assertSameContent(t, path, filepath.Join(dir, "mirror.db"))
	})
	return db, func() *DB {
		lc.mu.Lock()
		defer lc.mu.Unlock()
		if err := lc.db.Close(); err != nil && !errors.Is(err, persistence.ErrClosed) {
			t.Fatalf("close: %v", err)
		}
		lc.db = mustOpen(t, path, opts)
		return lc.db
	}
}

// dump lists every bucket path, key and value of a file in order.
func dump(t testing.TB, path string) []string {
	t.Helper()
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer bdb.Close()
	var out []string
	var walk func(prefix string, b *bbolt.Bucket) error
	walk = func(prefix string, b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				out = append(out, fmt.Sprintf("%s/%x/", prefix, k))
				return walk(fmt.Sprintf("%s/%x", prefix, k), b.Bucket(k))
			}
			out = append(out, fmt.Sprintf("%s/%x=%x", prefix, k, v))
			return nil
		})
	}
	if err := bdb.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			out = append(out, fmt.Sprintf("%x/", name))
			return walk(fmt.Sprintf("%x", name), b)
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func assertSameContent(t testing.TB, a, b string) {
	t.Helper()
	da, db := dump(t, a), dump(t, b)
	if len(da) != len(db) {
		t.Errorf("%s has %d entries, its mirror %d", a, len(da), len(db))
	}
	for i := range min(len(da), len(db)) {
		if da[i] != db[i] {
			t.Errorf("first difference at entry %d: %q vs mirror %q", i, da[i], db[i])
			return
		}
	}
}

// TestCapturedContractSync runs the sync store's contract through the
// capture (sealed: the sealed bytes are what a write set carries).
func TestCapturedContractSync(t *testing.T) {
	opts := Options{NoSync: true, Sealer: newTestSealer(1)}
	storetest.RunSyncStore(t, func(t *testing.T) (persistence.SyncStore, func() persistence.SyncStore) {
		db, reopen := captured(t, opts)
		return db.Sync(), func() persistence.SyncStore { return reopen().Sync() }
	})
}

func TestCapturedContractDelivery(t *testing.T) {
	open := func(t *testing.T) (persistence.DeliveryStore, func() persistence.DeliveryStore) {
		db, reopen := captured(t, Options{NoSync: true, Sealer: newTestSealer(1)})
		return db.Delivery(), func() persistence.DeliveryStore { return reopen().Delivery() }
	}
	storetest.RunDeliveryStore(t, open)
	storetest.RunInboundStore(t, open)
}

// TestCaptureWritesNothingUntilCommitted: the Update's writes are not in
// the file when the Committer fails, and the Update returns its error.
func TestCaptureWritesNothingUntilCommitted(t *testing.T) {
	refuse := errors.New("not leader")
	var got []byte
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true, Committer: committerFunc(func(_ context.Context, ws []byte) error {
		got = ws
		return refuse
	})})
	defer db.Close()
	err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		return tx.PutMeta("k", []byte("v"))
	})
	if !errors.Is(err, refuse) {
		t.Fatalf("Update: %v, want the committer's error", err)
	}
	if len(got) == 0 {
		t.Fatal("no write set reached the committer")
	}
	if err := db.Sync().View(ctx, func(tx persistence.SyncReader) error {
		v, ok, err := tx.Meta("k")
		if err != nil || ok {
			return fmt.Errorf("meta after refused commit: %q %v %v", v, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Applying the set makes it visible; replaying it is a no-op.
	for range 2 {
		if err := db.ApplyWriteSet(5, got); err != nil {
			t.Fatal(err)
		}
	}
	if idx, err := db.AppliedIndex(); err != nil || idx != 5 {
		t.Fatalf("AppliedIndex %d %v, want 5", idx, err)
	}
	if err := db.ApplyWriteSet(4, []byte("junk")); err != nil {
		t.Fatalf("an old index must be skipped before decoding: %v", err)
	}
}

type committerFunc func(context.Context, []byte) error

func (f committerFunc) Commit(ctx context.Context, ws []byte) error { return f(ctx, ws) }

// TestApplyWriteSetRefusesBadInput: a damaged or non-applying write set
// returns ErrBadWriteSet and leaves the file and its index unchanged.
func TestApplyWriteSetRefusesBadInput(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	good := encodeOps(t, wsOp{kind: opPut, path: [][]byte{bucketSyncMeta}, key: []byte("a"), value: []byte("1")})
	flipped := bytes.Clone(good)
	flipped[14] ^= 1
	missing := encodeOps(t,
		wsOp{kind: opPut, path: [][]byte{bucketSyncMeta}, key: []byte("b"), value: []byte("2")},
		wsOp{kind: opPut, path: [][]byte{[]byte("nope")}, key: []byte("a"), value: []byte("1")})
	for name, ws := range map[string][]byte{"checksum": flipped, "short": good[:5], "missing bucket": missing} {
		if err := db.ApplyWriteSet(1, ws); !errors.Is(err, ErrBadWriteSet) {
			t.Fatalf("%s: %v, want ErrBadWriteSet", name, err)
		}
	}
	if idx, _ := db.AppliedIndex(); idx != 0 {
		t.Fatalf("index moved to %d by refused sets", idx)
	}
	if err := db.ApplyWriteSet(1, good); err != nil {
		t.Fatal(err)
	}
	if err := db.ApplyWriteSet(2, good); !errors.Is(err, ErrStaleWriteSet) {
		t.Fatalf("a set read at index 0 applied at 1: %v, want ErrStaleWriteSet", err)
	}
}

// TestStaleWriteSetRefused: a write set captured before another one was
// applied to the same file is refused (ErrStaleWriteSet), on the file and
// its mirror alike, and the Update that produced it reports it.
func TestStaleWriteSetRefused(t *testing.T) {
	dir := t.TempDir()
	var held [][]byte
	hold := committerFunc(func(_ context.Context, ws []byte) error { held = append(held, ws); return errors.New("held") })
	db := mustOpen(t, filepath.Join(dir, "n.db"), Options{NoSync: true, Committer: hold})
	defer db.Close()
	for _, k := range []string{"a", "b"} {
		_ = db.Sync().Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta(k, []byte(k)) })
	}
	if len(held) != 2 {
		t.Fatalf("%d write sets captured, want 2", len(held))
	}
	// Both read index 0: the first applies, the second is stale.
	if err := db.ApplyWriteSet(1, held[0]); err != nil {
		t.Fatal(err)
	}
	if err := db.ApplyWriteSet(2, held[1]); !errors.Is(err, ErrStaleWriteSet) {
		t.Fatalf("second write set: %v, want ErrStaleWriteSet", err)
	}
	if idx, _ := db.AppliedIndex(); idx != 1 {
		t.Fatalf("applied index %d after a stale set, want 1", idx)
	}
	if err := db.Sync().View(ctx, func(tx persistence.SyncReader) error {
		if _, ok, _ := tx.Meta("b"); ok {
			return errors.New("the stale write is visible")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestWriteSetTooLarge(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true, Committer: committerFunc(func(context.Context, []byte) error {
		return errors.New("must not be called")
	})})
	defer db.Close()
	big := make([]byte, 1<<20)
	err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for i := range MaxWriteSetSize/len(big) + 1 {
			if err := tx.PutMeta(fmt.Sprint(i), big); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, ErrWriteSetTooLarge) || !errors.Is(err, persistence.ErrLimit) {
		t.Fatalf("Update: %v, want ErrWriteSetTooLarge", err)
	}
}

// encodeOps encodes ops over base 0 as the recorder does.
func encodeOps(t testing.TB, ops ...wsOp) []byte { return encodeOpsAt(t, 0, ops...) }

func encodeOpsAt(t testing.TB, base uint64, ops ...wsOp) []byte {
	r := newRecorder()
	for _, op := range ops {
		r.op(op.kind, op.path, op.key, op.value)
	}
	ws, err := r.finish(base)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// FuzzDecodeWriteSet: any bytes decode to operations or ErrBadWriteSet,
// never a panic; what decodes re-encodes to the same bytes.
func FuzzDecodeWriteSet(f *testing.F) {
	f.Add(encodeOps(f, wsOp{kind: opCreateBucket, key: []byte("b")},
		wsOp{kind: opCreateBucket, path: [][]byte{[]byte("b")}, key: []byte("c")},
		wsOp{kind: opPut, path: [][]byte{[]byte("b"), []byte("c")}, key: []byte("k"), value: []byte("v")},
		wsOp{kind: opDelete, path: [][]byte{[]byte("b")}, key: []byte("k")},
		wsOp{kind: opDeleteBucket, key: []byte("b")}))
	f.Add([]byte("SMW1\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, ws []byte) {
		base, ops, err := decodeWriteSet(ws)
		if err != nil {
			if !errors.Is(err, ErrBadWriteSet) {
				t.Fatalf("error %v is not ErrBadWriteSet", err)
			}
			return
		}
		if len(ops) == 0 {
			return
		}
		if again := encodeOpsAt(t, base, ops...); !bytes.Equal(again, ws) {
			t.Fatalf("re-encoded %x, decoded from %x", again, ws)
		}
	})
}

// TestCaptureNestedBucketsAndCursorDelete covers what the stores use
// rarely: nested buckets, a cursor's Delete, bucket deletion.
func TestCaptureNestedBucketsAndCursorDelete(t *testing.T) {
	dir := t.TempDir()
	mirror := mustOpen(t, filepath.Join(dir, "m.db"), Options{NoSync: true})
	lc := &loopCommitter{mirror: mirror}
	db := mustOpen(t, filepath.Join(dir, "n.db"), Options{NoSync: true, Committer: lc})
	lc.db = db
	steps := []func(tx *wtx) error{
		func(tx *wtx) error {
			a, err := tx.CreateBucketIfNotExists([]byte("a"))
			if err != nil {
				return err
			}
			b, err := a.CreateBucket([]byte("b"))
			if err != nil {
				return err
			}
			for i := range 10 {
				if err := b.Put([]byte{byte(i)}, []byte{byte(i * 2)}); err != nil {
					return err
				}
			}
			_, err = tx.CreateBucket([]byte("gone"))
			return err
		},
		func(tx *wtx) error {
			c := tx.Bucket([]byte("a")).Bucket([]byte("b")).Cursor()
			for k, _ := c.First(); k != nil; k, _ = c.Next() {
				if k[0]%3 == 0 {
					if err := c.Delete(); err != nil {
						return err
					}
				}
			}
			return tx.DeleteBucket([]byte("gone"))
		},
	}
	for _, s := range steps {
		if err := db.update(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	_ = db.Close()
	_ = mirror.Close()
	if lc.sets != 2 {
		t.Fatalf("%d write sets, want 2", lc.sets)
	}
	d := dump(t, filepath.Join(dir, "n.db"))
	n := 0
	for _, e := range d {
		if bytes.HasPrefix([]byte(e), []byte("61/62/")) && bytes.Contains([]byte(e), []byte("=")) {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("%d keys left in a/b, want 6: %q", n, d)
	}
	if i := sort.SearchStrings(d, "676f6e65/"); i < len(d) && d[i] == "676f6e65/" {
		t.Fatal("bucket gone still exists")
	}
	assertSameContent(t, filepath.Join(dir, "n.db"), filepath.Join(dir, "m.db"))
}
