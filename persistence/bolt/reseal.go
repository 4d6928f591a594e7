package bolt

import (
	"bytes"
	"context"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Reseal re-seals, under the current storage key, every sealed record the
// Sealer reports as not current (persistence.KeyRotator.IsCurrent): the
// event log's Raw and the sealed meta values. It commits at most batch
// records per transaction (batch ≤ 0: 256). Each batch is durable on its
// own and already-current records are skipped, so an interrupted Reseal
// loses nothing and running it again continues where it stopped. Without a
// KeyRotator it does nothing and returns 0.
func (d *DB) Reseal(ctx context.Context, batch int) (resealed int, err error) {
	rot, ok := d.opts.Sealer.(persistence.KeyRotator)
	if !ok {
		return 0, nil
	}
	if batch <= 0 {
		batch = 256
	}
	for _, pass := range []struct {
		bucket []byte
		redo   func(k, v []byte) ([]byte, error)
	}{
		{bucketSyncEvents, func(k, v []byte) ([]byte, error) { return resealEvent(rot, k, v) }},
		{bucketSyncSealed, func(k, v []byte) ([]byte, error) { return resealMeta(rot, k, v) }},
	} {
		var from []byte // resume key within this call: first key not yet examined
		for {
			if err := d.begin(ctx, "reseal"); err != nil {
				return resealed, err
			}
			n, next, err := d.resealBatch(rot, pass.bucket, from, batch, pass.redo)
			resealed += n
			if err != nil {
				return resealed, mapErr("reseal", err)
			}
			if n > 0 {
				d.log.Info("bolt: resealed batch", "bucket", string(pass.bucket), "records", n)
				if err := d.failpoint(FailpointResealAfterBatch); err != nil {
					return resealed, err
				}
			}
			if next == nil {
				break
			}
			from = next
		}
	}
	return resealed, nil
}

// resealBatch re-seals up to batch stale records of bucket from key from on,
// in one transaction. next is the key to continue from (nil: done).
func (d *DB) resealBatch(rot persistence.KeyRotator, bucket, from []byte, batch int,
	redo func(k, v []byte) ([]byte, error)) (n int, next []byte, err error) {
	err = d.bolt.Update(func(tx *bbolt.Tx) error {
		n, next = 0, nil
		b := tx.Bucket(bucket)
		if b == nil {
			return fmt.Errorf("bolt: bucket %s missing: %w", bucket, persistence.ErrCorrupt)
		}
		type kv struct{ k, v []byte }
		var todo []kv
		c := b.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		for ; k != nil; k, v = c.Next() {
			if len(todo) == batch {
				next = clone(k)
				break
			}
			nv, err := redo(k, v)
			if err != nil {
				return err
			}
			if nv != nil {
				todo = append(todo, kv{clone(k), nv})
			}
		}
		for _, e := range todo {
			if err := b.Put(e.k, e.v); err != nil {
				return err
			}
		}
		n = len(todo)
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return n, next, nil
}

// resealEvent returns the event record re-sealed, or nil when it is current.
func resealEvent(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	var rec eventRecord
	if err := decodeRecord("event", v, &rec, &rec.V); err != nil {
		return nil, err
	}
	if rot.IsCurrent(rec.Raw) {
		return nil, nil
	}
	raw, err := rot.Open(persistence.RecordEvent, rec.ID, rec.Raw)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal event %x: %w: %w", k, persistence.ErrCorrupt, err)
	}
	if rec.Raw, err = rot.Seal(persistence.RecordEvent, rec.ID, raw); err != nil {
		return nil, fmt.Errorf("bolt: reseal event %x: %w", k, err)
	}
	return messages.Marshal(&rec)
}

// resealMeta returns the sealed meta value re-sealed, or nil when current.
func resealMeta(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	if len(k) < 1 {
		return nil, fmt.Errorf("bolt: sealed meta key empty: %w", persistence.ErrCorrupt)
	}
	if rot.IsCurrent(v) {
		return nil, nil
	}
	rt, key := persistence.RecordType(k[0]), bytes.Clone(k[1:])
	p, err := rot.Open(rt, key, v)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal meta %q: %w: %w", key, persistence.ErrCorrupt, err)
	}
	return rot.Seal(rt, key, p)
}
