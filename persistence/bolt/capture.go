package bolt

import (
	"fmt"

	bbolt "go.etcd.io/bbolt"
)

// Every write of this package goes through these wrappers of bbolt's
// transaction, bucket and cursor. Without a recorder they only pass
// through; with one (Options.Committer) each successful put, delete,
// bucket creation and bucket deletion is appended to the write set, in
// order, with exactly the bytes handed to bbolt — sealed records stay
// sealed, so a replica needs no key to apply them (writeset.go).

// wtx is a bbolt transaction whose writes may be recorded.
type wtx struct {
	*bbolt.Tx
	rec *recorder // nil: not recording
}

// wrapTx wraps a transaction without recording.
func wrapTx(tx *bbolt.Tx) *wtx { return &wtx{Tx: tx} }

// wbucket is a bucket of a wtx; path names it from the root.
type wbucket struct {
	bk   *bbolt.Bucket
	rec  *recorder
	path [][]byte
}

// wcursor is a cursor of a wbucket; it keeps the key it stands on so a
// Delete through it can be recorded.
type wcursor struct {
	*bbolt.Cursor
	b   *wbucket
	cur []byte
}

func (t *wtx) wrap(b *bbolt.Bucket, name []byte) *wbucket {
	if b == nil {
		return nil
	}
	w := &wbucket{bk: b, rec: t.rec}
	if t.rec != nil {
		w.path = [][]byte{clone(name)}
	}
	return w
}

func (b *wbucket) wrap(c *bbolt.Bucket, name []byte) *wbucket {
	if c == nil {
		return nil
	}
	w := &wbucket{bk: c, rec: b.rec}
	if b.rec != nil {
		w.path = append(append(make([][]byte, 0, len(b.path)+1), b.path...), clone(name))
	}
	return w
}

// Bucket returns the top-level bucket name, nil if it does not exist.
func (t *wtx) Bucket(name []byte) *wbucket { return t.wrap(t.Tx.Bucket(name), name) }

// CreateBucket creates a top-level bucket.
func (t *wtx) CreateBucket(name []byte) (*wbucket, error) {
	b, err := t.Tx.CreateBucket(name)
	if err != nil {
		return nil, err
	}
	t.rec.op(opCreateBucket, nil, name, nil)
	return t.wrap(b, name), nil
}

// CreateBucketIfNotExists creates a top-level bucket unless it exists.
func (t *wtx) CreateBucketIfNotExists(name []byte) (*wbucket, error) {
	b, err := t.Tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	t.rec.op(opCreateBucket, nil, name, nil)
	return t.wrap(b, name), nil
}

// DeleteBucket deletes a top-level bucket.
func (t *wtx) DeleteBucket(name []byte) error {
	if err := t.Tx.DeleteBucket(name); err != nil {
		return err
	}
	t.rec.op(opDeleteBucket, nil, name, nil)
	return nil
}

// Bucket returns the nested bucket name, nil if it does not exist.
func (b *wbucket) Bucket(name []byte) *wbucket { return b.wrap(b.bk.Bucket(name), name) }

// CreateBucket creates a nested bucket.
func (b *wbucket) CreateBucket(name []byte) (*wbucket, error) {
	c, err := b.bk.CreateBucket(name)
	if err != nil {
		return nil, err
	}
	b.rec.op(opCreateBucket, b.path, name, nil)
	return b.wrap(c, name), nil
}

// CreateBucketIfNotExists creates a nested bucket unless it exists.
func (b *wbucket) CreateBucketIfNotExists(name []byte) (*wbucket, error) {
	c, err := b.bk.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	b.rec.op(opCreateBucket, b.path, name, nil)
	return b.wrap(c, name), nil
}

// DeleteBucket deletes a nested bucket.
func (b *wbucket) DeleteBucket(name []byte) error {
	if err := b.bk.DeleteBucket(name); err != nil {
		return err
	}
	b.rec.op(opDeleteBucket, b.path, name, nil)
	return nil
}

// Put stores value under key.
func (b *wbucket) Put(key, value []byte) error {
	if err := b.bk.Put(key, value); err != nil {
		return err
	}
	b.rec.op(opPut, b.path, key, value)
	return nil
}

// Delete removes key.
func (b *wbucket) Delete(key []byte) error {
	if err := b.bk.Delete(key); err != nil {
		return err
	}
	b.rec.op(opDelete, b.path, key, nil)
	return nil
}

// NextSequence is not part of a write set: refused while recording, so a
// bucket sequence can never differ between replicas.
func (b *wbucket) NextSequence() (uint64, error) {
	if b.rec != nil {
		return 0, fmt.Errorf("bolt: bucket sequences are not replicated: %w", ErrBadWriteSet)
	}
	return b.bk.NextSequence()
}

// SetSequence: see NextSequence.
func (b *wbucket) SetSequence(v uint64) error {
	if b.rec != nil {
		return fmt.Errorf("bolt: bucket sequences are not replicated: %w", ErrBadWriteSet)
	}
	return b.bk.SetSequence(v)
}

// Cursor returns a cursor over the bucket.
func (b *wbucket) Cursor() *wcursor { return &wcursor{Cursor: b.bk.Cursor(), b: b} }

func (c *wcursor) at(k, v []byte) ([]byte, []byte) {
	if c.b.rec != nil {
		c.cur = k
	}
	return k, v
}

// First moves to the first item.
func (c *wcursor) First() ([]byte, []byte) { return c.at(c.Cursor.First()) }

// Last moves to the last item.
func (c *wcursor) Last() ([]byte, []byte) { return c.at(c.Cursor.Last()) }

// Next moves to the next item.
func (c *wcursor) Next() ([]byte, []byte) { return c.at(c.Cursor.Next()) }

// Prev moves to the previous item.
func (c *wcursor) Prev() ([]byte, []byte) { return c.at(c.Cursor.Prev()) }

// Seek moves to key or the next one after it.
func (c *wcursor) Seek(key []byte) ([]byte, []byte) { return c.at(c.Cursor.Seek(key)) }

// Delete removes the item the cursor stands on.
func (c *wcursor) Delete() error {
	var k []byte
	if c.b.rec != nil {
		k = clone(c.cur)
	}
	if err := c.Cursor.Delete(); err != nil {
		return err
	}
	c.b.rec.op(opDelete, c.b.path, k, nil)
	return nil
}

// Get returns the value of key (nil if absent or a bucket).
func (b *wbucket) Get(key []byte) []byte { return b.bk.Get(key) }

// ForEach calls fn for every key of the bucket.
func (b *wbucket) ForEach(fn func(k, v []byte) error) error { return b.bk.ForEach(fn) }

// Stats returns bbolt's statistics of the bucket.
func (b *wbucket) Stats() bbolt.BucketStats { return b.bk.Stats() }

// SetFillPercent sets how full bbolt leaves a page it splits.
func (b *wbucket) SetFillPercent(f float64) { b.bk.FillPercent = f }
