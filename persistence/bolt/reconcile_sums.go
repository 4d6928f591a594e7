package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// bucketSyncRangeSums holds reconciliation's range aggregate (layout 12):
// per table and signing site, the count and LtHash16 sum of the retained
// events' keys, lp(schema)|lp(table)|site(16) → rangeSumRecord. It is
// changed in the transaction that appends or deletes the event, so it
// always equals a scan of the table index (TestRangeSumsEqualTheScan).
var bucketSyncRangeSums = []byte("sync.range_sums")

// A rangeSumRecord is version(1) = 1 | count(8, big endian) | sum(2 048).
const (
	rangeSumVersion = 1
	rangeSumSize    = 1 + 8 + lthash.Size
)

func encodeRangeSum(r *persistence.RangeSum) []byte {
	b := make([]byte, 0, rangeSumSize)
	b = append(b, rangeSumVersion)
	b = binary.BigEndian.AppendUint64(b, r.Count)
	return r.Sum.AppendBinary(b)
}

func decodeRangeSum(v []byte) (persistence.RangeSum, error) {
	var r persistence.RangeSum
	if len(v) != rangeSumSize || v[0] != rangeSumVersion {
		return r, fmt.Errorf("bolt: range sum record of %d bytes: %w", len(v), persistence.ErrCorrupt)
	}
	r.Count = binary.BigEndian.Uint64(v[1:9])
	s, err := lthash.Decode(v[9:])
	if err != nil {
		return r, fmt.Errorf("bolt: range sum record: %v: %w", err, persistence.ErrCorrupt)
	}
	r.Sum = s
	return r, nil
}

// sumDelta is a transaction's pending change of one (table, site) sum:
// appends add and deletions subtract, in any order (the sum is a group).
type sumDelta struct {
	count int64
	sum   lthash.Sum
}

// sumKey is the record key of (table, site).
func sumKey(b []byte, t persistence.TableKey, site messages.SiteID) []byte {
	return append(tablePrefix(b, t), site[:]...)
}

// sumDelta is the transaction's pending change of the sum of (tk, site).
func (t *syncTx) sumDelta(tk persistence.TableKey, site messages.SiteID) *sumDelta {
	var kb [128]byte
	key := sumKey(kb[:0], tk, site)
	d := t.sums[string(key)]
	if d == nil {
		if t.sums == nil {
			t.sums = map[string]*sumDelta{}
		}
		d = &sumDelta{}
		t.sums[string(key)] = d
	}
	return d
}

// sumChange records that the event (site, h, id) of t was appended
// (add) or deleted. The records are rewritten once per transaction, in
// flushSums: a batch of a site's events changes one record.
func (t *syncTx) sumChange(tk persistence.TableKey, site messages.SiteID, h messages.HLC, id persistence.EventID, add bool) {
	d := t.sumDelta(tk, site)
	rk := messages.NewReconcileKey(site, h, id)
	if add {
		d.count++
		d.sum.Add(rk[:])
	} else {
		d.count--
		d.sum.Remove(rk[:])
	}
}

// flushSums applies the pending deltas to their records, in key order.
func (t *syncTx) flushSums() error {
	t.psums.Resolve(t.addPrepared) // prepare.go
	if len(t.sums) == 0 {
		return nil
	}
	b := t.tx.Bucket(bucketSyncRangeSums)
	if b == nil {
		return fmt.Errorf("bolt: bucket %s missing: %w", bucketSyncRangeSums, persistence.ErrCorrupt)
	}
	keys := make([]string, 0, len(t.sums))
	for k := range t.sums {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		d := t.sums[k]
		var r persistence.RangeSum
		if v := b.Get([]byte(k)); v != nil {
			var err error
			if r, err = decodeRangeSum(v); err != nil {
				return err
			}
		}
		if d.count < 0 && uint64(-d.count) > r.Count {
			return fmt.Errorf("bolt: range sum of %d events loses %d: %w", r.Count, -d.count, persistence.ErrCorrupt)
		}
		r.Count = uint64(int64(r.Count) + d.count)
		r.Sum.Combine(&d.sum)
		var err error
		if r.Count == 0 {
			if !r.Sum.IsZero() {
				return fmt.Errorf("bolt: range sum of no events is not zero: %w", persistence.ErrCorrupt)
			}
			err = b.Delete([]byte(k))
		} else {
			err = b.Put([]byte(k), encodeRangeSum(&r))
		}
		if err != nil {
			return err
		}
	}
	clear(t.sums)
	return nil
}

// TableEventSum returns the sum of the keys TableEventKeys lists from
// min: the table's per-site records, less the retained events below min
// (read from the table index, which is in HLC order: none when min is at
// or below the oldest retained HLC).
func (t *syncTx) TableEventSum(k persistence.TableKey, min messages.HLC) (persistence.RangeSum, error) {
	var total persistence.RangeSum
	if err := t.check(); err != nil {
		return total, err
	}
	if err := t.flushSums(); err != nil {
		return total, err
	}
	b := t.tx.Bucket(bucketSyncRangeSums)
	if b == nil {
		return total, fmt.Errorf("bolt: bucket %s missing: %w", bucketSyncRangeSums, persistence.ErrCorrupt)
	}
	prefix := tablePrefix(nil, k)
	c := b.Cursor()
	for key, v := c.Seek(prefix); key != nil && bytes.HasPrefix(key, prefix); key, v = c.Next() {
		if len(key) != len(prefix)+16 {
			return total, fmt.Errorf("bolt: range sum key of %d bytes: %w", len(key), persistence.ErrCorrupt)
		}
		r, err := decodeRangeSum(v)
		if err != nil {
			return total, err
		}
		total.Combine(&r)
	}
	if min == 0 {
		return total, nil
	}
	below, err := t.tableKeysBelow(k, min)
	if err != nil {
		return total, err
	}
	for _, key := range below {
		if total.Count == 0 {
			return total, fmt.Errorf("bolt: table index holds events the range sums lack: %w", persistence.ErrCorrupt)
		}
		total.Remove(key)
	}
	return total, nil
}

// tableKeysBelow lists the keys of the table's retained events with an
// HLC below min (in index order).
func (t *syncTx) tableKeysBelow(k persistence.TableKey, min messages.HLC) ([]persistence.EventKey, error) {
	if err := t.flushIndexes(); err != nil {
		return nil, err
	}
	prefix := tablePrefix(nil, k)
	end := tableIdxKey(nil, k, min, 0)
	var out []persistence.EventKey
	c := t.tableIdx.Cursor()
	for key, _ := c.Seek(prefix); key != nil && bytes.Compare(key, end) < 0; key, _ = c.Next() {
		if len(key) != len(prefix)+16 {
			return nil, fmt.Errorf("bolt: table index key of %d bytes: %w", len(key), persistence.ErrCorrupt)
		}
		seq := binary.BigEndian.Uint64(key[len(key)-8:])
		v := t.events.Get(u64(seq))
		if v == nil {
			return nil, fmt.Errorf("bolt: table index points at missing event %d: %w", seq, persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(seq, v)
		if err != nil {
			return nil, err
		}
		out = append(out, persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID})
	}
	return out, nil
}

// migrateRangeSumsV12 builds the range aggregate of an existing file:
// one pass over the event log (every retained event is in the table
// index, so the sums equal a scan of it).
func migrateRangeSumsV12(tx *wtx) error {
	b, err := tx.CreateBucketIfNotExists(bucketSyncRangeSums)
	if err != nil {
		return err
	}
	events := tx.Bucket(bucketSyncEvents)
	if events == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketSyncEvents, persistence.ErrCorrupt)
	}
	sums := map[string]*persistence.RangeSum{}
	c := events.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return fmt.Errorf("event key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(binary.BigEndian.Uint64(k), v)
		if err != nil {
			return err
		}
		key := string(sumKey(nil, tableKeyOf(ev.Schema, ev.Table), ev.Site))
		r := sums[key]
		if r == nil {
			r = &persistence.RangeSum{}
			sums[key] = r
		}
		r.Add(persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID})
	}
	keys := make([]string, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := b.Put([]byte(k), encodeRangeSum(sums[k])); err != nil {
			return err
		}
	}
	return nil
}
