package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/persistence"
)

// bucketSyncRowGens is the row → events index from layout 8 on:
// lp(schema)|lp(table)|gen(4)|lp(rowkey)|seq(8) → ∅, gen = seq >> rowGenBits.
//
// Keyed by row first (layouts 1–7), every new event of a store whose
// history is on the same rows lands next to that row's old entries: at a
// random place of an index that grows with the history, so a transaction
// of 2 000 events dirtied ~2 000 distinct pages, and the bytes written per
// event grew with the store (measured: 2 302 B/event over 100 000 events
// of history, 5 393 B over 500 000). With the generation first, new
// entries only ever land in the newest generation, whose size is bounded
// (4 096 events: a few dozen pages), whatever the history: the cost per
// event is flat. A row's events are read by one seek per generation
// (RowEvents runs only for a rebuild).
var bucketSyncRowGens = []byte("sync.row_gens")

// rowGenBits sets the generation size: 2^12 = 4 096 events. Smaller
// generations dirty fewer pages per commit; larger ones cost RowEvents
// fewer seeks (one per generation: 245 at a million events).
const rowGenBits = 12

func rowGen(seq uint64) uint32 { return uint32(seq >> rowGenBits) }

// rowGenPrefix is lp(schema)|lp(table)|gen|lp(rowkey).
func rowGenPrefix(b []byte, t persistence.TableKey, gen uint32, rowKey []byte) []byte {
	b = binary.BigEndian.AppendUint32(tablePrefix(b, t), gen)
	return appendLP(b, rowKey)
}

// rowEventSeqs calls fn with the seqs of one row's events, one
// generation at a time, in seq order. The seqs are copied out of the
// cursor before fn runs, so fn may write to the transaction.
func rowEventSeqs(b *wbucket, t persistence.TableKey, rowKey []byte, fn func(seqs []uint64) (bool, error)) error {
	tp := tablePrefix(nil, t)
	var gen uint32
	var seqs []uint64
	for {
		prefix := appendLP(binary.BigEndian.AppendUint32(clone(tp), gen), rowKey)
		c := b.Cursor()
		k, _ := c.Seek(prefix)
		if k == nil || !bytes.HasPrefix(k, tp) {
			return nil
		}
		if len(k) < len(tp)+4 {
			return fmt.Errorf("bolt: row index key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		if g := binary.BigEndian.Uint32(k[len(tp):]); g != gen {
			if g < gen {
				return fmt.Errorf("bolt: row index out of order: %w", persistence.ErrCorrupt)
			}
			gen = g // skip the generations without entries
			continue
		}
		seqs = seqs[:0]
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(k) != len(prefix)+8 {
				return fmt.Errorf("bolt: row index key of %d bytes: %w", len(k), persistence.ErrCorrupt)
			}
			seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
		}
		if len(seqs) > 0 {
			more, err := fn(seqs)
			if err != nil || !more {
				return err
			}
		}
		if gen == ^uint32(0) {
			return nil
		}
		gen++
	}
}

// migrateRowGensV1 (layout 7 → 8) rebuilds the row → events index keyed
// by generation from the event log's plaintext index fields, then drops
// the index keyed by row. It runs in the Open transaction: all or nothing.
func migrateRowGensV1(tx *wtx) error {
	idx, err := tx.CreateBucketIfNotExists(bucketSyncRowGens)
	if err != nil {
		return fmt.Errorf("create bucket %s: %w", bucketSyncRowGens, err)
	}
	events := tx.Bucket(bucketSyncEvents)
	if events == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketSyncEvents, persistence.ErrCorrupt)
	}
	var key []byte
	err = events.ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("event key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(binary.BigEndian.Uint64(k), v)
		if err != nil {
			return err
		}
		key = rowIdxKey(key[:0], tableKeyOf(ev.Schema, ev.Table), ev.RowKey, ev.Seq)
		return idx.Put(key, empty)
	})
	if err != nil {
		return err
	}
	if tx.Bucket(bucketSyncRowIdx) != nil {
		if err := tx.DeleteBucket(bucketSyncRowIdx); err != nil {
			return fmt.Errorf("drop bucket %s: %w", bucketSyncRowIdx, err)
		}
	}
	return nil
}
