package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// bucketSyncChanges is the change log (layout 10 on):
// seq(8, big-endian)|lp(schema)|lp(table) → changeRecord. Keyed by the
// change sequence first, so appends are sequential (the cheap case for
// bbolt) and trimming the oldest is a cursor's First; the table in the
// key lets ChangesAfter skip other tables' entries without decoding them.
var bucketSyncChanges = []byte("sync.changes")

// metaSyncLastChange (bucketMeta) is the highest change sequence ever
// assigned: trimming never lowers it, so a sequence is never reused.
var metaSyncLastChange = []byte("sync.last_change")

// changeRecord is a value of bucketSyncChanges. Values are plaintext, as
// the rows they describe are (bucketSyncRows).
type changeRecord struct {
	V         uint64                `cbor:"1,keyasint"`
	RowKey    []byte                `cbor:"2,keyasint"`
	Exists    bool                  `cbor:"3,keyasint"`
	Existence clockRecord           `cbor:"4,keyasint"`
	Tomb      clockRecord           `cbor:"5,keyasint"`
	Cells     map[string]cellRecord `cbor:"6,keyasint"`
	Cleared   []string              `cbor:"7,keyasint"`
	Cause     uint8                 `cbor:"8,keyasint"`
	Event     clockRecord           `cbor:"9,keyasint"`
}

// createChangesV10 creates the change log (layout 9 → 10).
func createChangesV10(tx *wtx) error {
	_, err := tx.CreateBucketIfNotExists(bucketSyncChanges)
	return err
}

func (t *syncTx) changes() (*wbucket, error) {
	if t.changesB != nil {
		return t.changesB, nil
	}
	b := t.tx.Bucket(bucketSyncChanges)
	if b == nil {
		return nil, fmt.Errorf("bolt: no change log bucket: %w", persistence.ErrCorrupt)
	}
	if t.tx.Writable() {
		b.SetFillPercent(sequentialFill)
	}
	t.changesB = b
	return b, nil
}

// lastChange is the highest change sequence assigned, as this
// transaction sees it: read once, then kept in the transaction, which
// writes it back at its end (flush) — one meta Put per transaction
// instead of one per change.
func (t *syncTx) lastChange() (uint64, error) {
	if t.changeLoaded {
		return t.changeSeq, nil
	}
	v := t.meta.Get(metaSyncLastChange)
	switch len(v) {
	case 0:
	case 8:
		t.changeSeq = binary.BigEndian.Uint64(v)
	default:
		return 0, fmt.Errorf("bolt: last change of %d bytes: %w", len(v), persistence.ErrCorrupt)
	}
	t.changeLoaded = true
	return t.changeSeq, nil
}

// flushChangeSeq writes the last change sequence if this transaction
// assigned any.
func (t *syncTx) flushChangeSeq() error {
	if !t.changeDirty {
		return nil
	}
	t.changeDirty = false
	return t.meta.Put(metaSyncLastChange, u64(t.changeSeq))
}

// AppendChange implements persistence.ChangeWriter.
func (t *syncTx) AppendChange(c persistence.RowChange) (uint64, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	if err := validRowKey(c.Key); err != nil {
		return 0, err
	}
	b, err := t.changes()
	if err != nil {
		return 0, err
	}
	last, err := t.lastChange()
	if err != nil {
		return 0, err
	}
	seq := last + 1
	t.keyBuf = c.Key.AppendEncode(t.keyBuf[:0])
	v := encodeChangeTo(t.valueBuf(changeLen(&c, t.keyBuf)), &c, t.keyBuf)
	// bbolt copies the key on Put and keeps the value until commit.
	t.keyBuf = tablePrefix(binary.BigEndian.AppendUint64(t.keyBuf[:0], seq), persistence.TableKey{Schema: c.Schema, Table: c.Table})
	if err := b.Put(t.keyBuf, v); err != nil {
		return 0, err
	}
	t.changeSeq, t.changeDirty = seq, true
	return seq, nil
}

// encodeChange writes the changeRecord of c directly (it runs once per
// applied event); TestRecordEncodersMatchCodec proves it byte-identical
// to messages.Marshal(&changeRecord{...}).
func encodeChange(c *persistence.RowChange, rowKey []byte) []byte {
	return encodeChangeTo(make([]byte, 0, changeLen(c, rowKey)), c, rowKey)
}

// changeLen bounds what encodeChangeTo writes (as cellsLen does; a
// cleared name longer than 7 bytes only costs a reallocation).
func changeLen(c *persistence.RowChange, rowKey []byte) int {
	return 32 + len(rowKey) + 3*maxClockLen + cellsLen(c.Cells) + 8*len(c.Cleared)
}

// encodeChangeTo appends the changeRecord of c to b.
func encodeChangeTo(b []byte, c *persistence.RowChange, rowKey []byte) []byte {
	b = messages.AppendMapHeader(b, 9)
	b = messages.AppendUint(messages.AppendUint(b, 1), recordVersion)
	b = messages.AppendBytes(messages.AppendUint(b, 2), rowKey)
	b = messages.AppendBool(messages.AppendUint(b, 3), c.Exists)
	b = appendClock(messages.AppendUint(b, 4), c.Existence)
	b = appendClock(messages.AppendUint(b, 5), c.Tomb)
	b = appendCells(messages.AppendUint(b, 6), c.Cells)
	b = messages.AppendUint(b, 7)
	if c.Cleared == nil {
		b = messages.AppendNull(b)
	} else {
		b = appendArrayHeader(b, len(c.Cleared))
		for _, name := range c.Cleared {
			b = messages.AppendText(b, name)
		}
	}
	b = messages.AppendUint(messages.AppendUint(b, 8), uint64(c.Cause))
	return appendClock(messages.AppendUint(b, 9), c.Event)
}

// TrimChanges implements persistence.ChangeWriter. Sequences are dense
// and deleted only from the oldest, so the count is last-oldest+1.
func (t *syncTx) TrimChanges(keep uint64, trimmed func(persistence.TableKey, uint64)) (int, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	b, err := t.changes()
	if err != nil {
		return 0, err
	}
	last, err := t.lastChange()
	if err != nil {
		return 0, err
	}
	n := 0
	c := b.Cursor()
	var next [8]byte
	// After each delete the cursor seeks just past the deleted sequence,
	// not to First: bbolt empties leaves in memory and removes them only
	// at commit, so First walked over every leaf this transaction emptied
	// — O(n²) in the entries trimmed, ~10% of an apply's commit with the
	// log at its limit (one trim per appended change).
	for k, _ := c.First(); k != nil; {
		if len(k) < 8 {
			return n, fmt.Errorf("bolt: change key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		seq := binary.BigEndian.Uint64(k)
		if last-seq+1 <= keep {
			break
		}
		if trimmed != nil {
			schema, rest, err := readLP(k[8:])
			if err == nil {
				var table []byte
				if table, _, err = readLP(rest); err == nil {
					trimmed(persistence.TableKey{Schema: string(schema), Table: string(table)}, seq)
				}
			}
			if err != nil {
				return n, err
			}
		}
		if err := c.Delete(); err != nil {
			return n, err
		}
		n++
		binary.BigEndian.PutUint64(next[:], seq+1)
		k, _ = c.Seek(next[:])
	}
	return n, nil
}

// RaiseChangeSeq implements persistence.ChangeWriter.
func (t *syncTx) RaiseChangeSeq(floor uint64) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	last, err := t.lastChange()
	if err != nil || last >= floor {
		return err
	}
	t.changeSeq, t.changeDirty = floor, true
	return nil
}

// ChangeBounds implements persistence.ChangeReader.
func (t *syncTx) ChangeBounds() (oldest, last uint64, err error) {
	if err := t.check(); err != nil {
		return 0, 0, err
	}
	b, err := t.changes()
	if err != nil {
		return 0, 0, err
	}
	if last, err = t.lastChange(); err != nil {
		return 0, 0, err
	}
	if k, _ := b.Cursor().First(); k != nil {
		if len(k) < 8 {
			return 0, 0, fmt.Errorf("bolt: change key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		oldest = binary.BigEndian.Uint64(k)
	}
	return oldest, last, nil
}

// ChangeTablesAfter implements persistence.ChangeReader.
func (t *syncTx) ChangeTablesAfter(after uint64, fn func(persistence.TableKey, uint64) bool) error {
	if err := t.check(); err != nil {
		return err
	}
	b, err := t.changes()
	if err != nil {
		return err
	}
	c := b.Cursor()
	for k, _ := c.Seek(u64(after + 1)); k != nil; k, _ = c.Next() {
		if len(k) < 8 {
			return fmt.Errorf("bolt: change key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		schema, rest, err := readLP(k[8:])
		if err != nil {
			return err
		}
		table, _, err := readLP(rest)
		if err != nil {
			return err
		}
		if !fn(persistence.TableKey{Schema: string(schema), Table: string(table)}, binary.BigEndian.Uint64(k)) {
			return nil
		}
	}
	return nil
}

// ChangesAfter implements persistence.ChangeReader. Entries are copied
// out of the cursor in chunks before fn runs, so fn may write.
func (t *syncTx) ChangesAfter(tk persistence.TableKey, after uint64, limit int, fn func(persistence.RowChange) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	b, err := t.changes()
	if err != nil {
		return err
	}
	suffix := tablePrefix(nil, tk)
	type entry struct {
		seq uint64
		v   []byte
	}
	visited := 0
	next, done := after, false
	for !done {
		// One chunk of this table's entries; at most 16 × scanChunk keys
		// are looked at per chunk, so a quiet table behind a busy one
		// still yields to fn between chunks.
		var chunk []entry
		c := b.Cursor()
		k, v := c.Seek(u64(next + 1))
		for seen := 0; len(chunk) < scanChunk && seen < 16*scanChunk; seen++ {
			if k == nil {
				done = true
				break
			}
			if len(k) < 8 {
				return fmt.Errorf("bolt: change key of %d bytes: %w", len(k), persistence.ErrCorrupt)
			}
			next = binary.BigEndian.Uint64(k)
			if bytes.Equal(k[8:], suffix) {
				chunk = append(chunk, entry{next, clone(v)})
			}
			k, v = c.Next()
		}
		if k == nil {
			done = true
		}
		for _, e := range chunk {
			ch, err := decodeChange(tk, e.seq, e.v)
			if err != nil {
				return err
			}
			more, err := fn(ch)
			if err != nil || !more {
				return err
			}
			if visited++; limit > 0 && visited >= limit {
				return nil
			}
		}
	}
	return nil
}

func decodeChange(tk persistence.TableKey, seq uint64, b []byte) (persistence.RowChange, error) {
	var rec changeRecord
	if err := decodeRecord("change", b, &rec, &rec.V); err != nil {
		return persistence.RowChange{}, err
	}
	key, err := messages.DecodeColumns(rec.RowKey)
	if err != nil {
		return persistence.RowChange{}, corrupt("change row key", err)
	}
	ch := persistence.RowChange{Seq: seq, Schema: tk.Schema, Table: tk.Table, Key: key, Exists: rec.Exists,
		Cause: persistence.ChangeCause(rec.Cause), Cleared: slices.Clone(rec.Cleared)}
	if ch.Existence, err = fromClockRecord(rec.Existence); err != nil {
		return ch, corrupt("change existence", err)
	}
	if ch.Tomb, err = fromClockRecord(rec.Tomb); err != nil {
		return ch, corrupt("change tomb", err)
	}
	if ch.Event, err = fromClockRecord(rec.Event); err != nil {
		return ch, corrupt("change event", err)
	}
	if len(rec.Cells) > 0 {
		ch.Cells = make(map[string]persistence.Cell, len(rec.Cells))
		for n, c := range rec.Cells {
			clk, err := fromClockRecord(c.Clock)
			if err != nil {
				return ch, corrupt("change cell", err)
			}
			ch.Cells[n] = persistence.Cell{Value: messages.Value(c.Value), Clock: clk}
		}
	}
	return ch, nil
}
