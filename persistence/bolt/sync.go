package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"unsafe"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// sequentialFill is the FillPercent of buckets whose keys are appended in
// increasing order (the event log): full pages instead of half-empty splits.
const sequentialFill = 1.0

// rowsFill is the FillPercent of the rows bucket: rows are rewritten in
// place and change size a little (a cell's value, a clock gaining an id),
// so its pages keep room for that instead of splitting at the next byte.
const rowsFill = 0.9

// scanChunk is how many entries a scan copies out of a cursor before it
// calls back, so a callback may write to the transaction safely.
const scanChunk = 256

var errTxDone = fmt.Errorf("bolt: transaction used after it ended: %w", persistence.ErrClosed)

// Sync returns the sync-plane store over the file. Closing the returned
// store closes only that handle; DB.Close releases the file.
func (d *DB) Sync() persistence.SyncStore { return &syncStore{handle{d: d, plane: "sync"}} }

// handle is one store view over the file; closing it closes only the view.
type handle struct {
	d      *DB
	plane  string
	closed atomic.Bool
}

func (h *handle) check(ctx context.Context, op string) error {
	if h.closed.Load() {
		return fmt.Errorf("bolt: %s %s: %w", h.plane, op, persistence.ErrClosed)
	}
	return h.d.begin(ctx, h.plane+" "+op)
}

// Close closes this handle (not the file: see DB.Close). It is
// idempotent.
func (h *handle) Close() error {
	h.closed.Store(true)
	return nil
}

type syncStore struct{ handle }

// Update runs fn in one bbolt read-write transaction. Sequence numbers
// assigned inside an Update that does not commit are not consumed: the
// sequence is strictly increasing across committed transactions, and the
// highest ever assigned is stored, so it is never reused after deletions
// or restarts.
func (s *syncStore) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	if err := s.check(ctx, "update"); err != nil {
		return err
	}
	// The scratch serves this transaction alone: taken before bbolt's
	// transaction begins, given back after bbolt.Update returned, when
	// bbolt holds nothing of it (scratch.go).
	sc := s.d.takeScratch()
	err := s.d.update(ctx, func(btx *wtx) error {
		tx, err := newSyncTx(s.d, btx)
		if err != nil {
			return err
		}
		tx.scratch = sc
		defer func() {
			tx.done = true
			sc.keepPending(tx.pendRow, tx.pendTable)
		}()
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.flush(); err != nil {
			return err
		}
		return s.d.failpoint(FailpointSyncUpdateBeforeCommit)
	})
	s.d.releaseScratch(sc)
	if err != nil {
		return mapErr("sync update", err)
	}
	s.d.syncCommits.Add(1)
	return s.d.failpoint(FailpointSyncUpdateAfterCommit)
}

// View runs fn in a bbolt read-only transaction (a consistent snapshot).
func (s *syncStore) View(ctx context.Context, fn func(tx persistence.SyncReader) error) error {
	if err := s.check(ctx, "view"); err != nil {
		return err
	}
	return mapErr("sync view", s.d.view(func(btx *wtx) error {
		tx, err := newSyncTx(s.d, btx)
		if err != nil {
			return err
		}
		defer func() { tx.done = true }()
		return fn(tx)
	}))
}

// syncTx implements persistence.SyncTx over one bbolt transaction. Bucket
// handles are looked up once per transaction.
type syncTx struct {
	d    *DB
	tx   *wtx
	done bool

	meta, tables, events, ids, rowIdx, tableIdx, rows, horizons, held, smeta, sealed, keys *wbucket
	// rowIndexes is the secondary indexes' bucket (layout 14, indexes.go);
	// defs caches the table definitions rows are keyed by (PutTable drops
	// an entry).
	rowIndexes *wbucket
	defs       map[persistence.TableKey]persistence.TableDef

	lastSeq   uint64
	seqLoaded bool
	seqDirty  bool

	// The change log's bucket and last sequence (changes.go), kept like
	// lastSeq: loaded once, written back by flush.
	changesB                  *wbucket
	changeSeq                 uint64
	changeLoaded, changeDirty bool

	// missed is the last id Event found absent, so the AppendEvent that
	// usually follows (the apply path's "seen? else append") need not
	// search the id index again. Any append clears it.
	missed    persistence.EventID
	hasMissed bool
	// noneAt: Event found no event at all at (noneAtSite, noneAtHLC), so
	// EventIDsAt there is empty. Only an append can make it false
	// (deletions keep it true), and every append clears it.
	noneAt     bool
	noneAtSite messages.SiteID
	noneAtHLC  messages.HLC

	// Per-transaction scratch for the apply path (one Get, one Put and one
	// AppendEvent per event): cursors reused for point lookups (Bucket.Get
	// allocates a cursor and its stack every call), a key buffer (bbolt
	// copies keys on Put and never keeps a lookup key) and an arena for
	// small values bbolt must keep until commit.
	idsCur, rowsCur *wcursor
	keyBuf, idBuf   []byte
	values          []byte                      // valueBuf's current chunk
	names           nameCache                   // the column names RowWithKey read
	cells           map[string]persistence.Cell // RowForUpdate's
	// The row RowForUpdate last lent, as stored (bbolt's memory or a
	// value in rowsOut: neither changes before the transaction ends or a
	// PutRow), so that PutRow can leave a row it would rewrite with the
	// same bytes alone. lent is cleared by every PutRow.
	lent             bool
	lentKey, lentVal []byte
	// scratch, when set (Update), lends the chunks valueBuf carves and
	// the transaction's working slices and maps, reused by the next
	// transaction (scratch.go); nil allocates them.
	scratch *txScratch

	// The row and table index entries AppendEvent added, not yet Put:
	// flushIndexes puts them in key order before the commit and before
	// anything reads or deletes those indexes in this transaction. bbolt
	// keeps a transaction's new entries in the in-memory node they land
	// in and splits it only at commit, so an entry put in the middle of
	// that node moves every entry after it: in the order the apply path
	// produces them (groups one after the other, rows at random) a
	// transaction of n events moved O(n²) index entries, a quarter of the
	// commit's CPU at a million events. In key order each entry is
	// appended after the one before.
	pendRow, pendTable [][]byte

	// rowsOut holds the rows PutRow encoded in this transaction, by bucket
	// key, until flushRows puts them in key order (before the commit and
	// before a scan of the rows bucket): a batch rewrites its rows many
	// times over (rows of one table shared by every site's events), and
	// each rewrite read the row back from bbolt and put it again.
	rowsOut map[string][]byte

	// sums holds the range-sum changes of this transaction by record key
	// until flushSums (reconcile_sums.go); psums the prepared shares of
	// appended events, added to sums there (prepare.go).
	sums  map[string]*sumDelta
	psums persistence.PreparedSums
}

// flushRows puts the rows written in this transaction, in key order.
func (t *syncTx) flushRows() error {
	if len(t.rowsOut) == 0 {
		return nil
	}
	t.d.rowsHint.Store(int64(len(t.rowsOut)))
	var keys []string
	if t.scratch != nil {
		keys = t.scratch.keys[:0]
	}
	for k := range t.rowsOut {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		// Put copies the key: one buffer serves them all.
		t.keyBuf = append(t.keyBuf[:0], k...)
		if err := t.rows.Put(t.keyBuf, t.rowsOut[k]); err != nil {
			return err
		}
	}
	clear(t.rowsOut)
	clear(keys) // the strings are garbage now
	if t.scratch != nil {
		t.scratch.keys = keys[:0]
	}
	return nil
}

// pendKey copies key into the transaction's value memory (kept until
// the transaction ends; bbolt copies keys on Put).
func (t *syncTx) pendKey(key []byte) []byte {
	return append(t.valueBuf(len(key)), key...)
}

// flushIndexes puts the pending row and table index entries, each index
// in key order.
func (t *syncTx) flushIndexes() error {
	if n := len(t.pendRow); n > 0 {
		t.d.pendHint.Store(int64(n))
	}
	for _, p := range []struct {
		b    *wbucket
		keys *[][]byte
	}{{t.rowIdx, &t.pendRow}, {t.tableIdx, &t.pendTable}} {
		keys := *p.keys
		slices.SortFunc(keys, bytes.Compare)
		for _, k := range keys {
			if err := p.b.Put(k, empty); err != nil {
				return err
			}
		}
		*p.keys = keys[:0]
	}
	return nil
}

// get is Bucket.Get through a reused cursor: the value stored at key, nil
// when absent. Seek repositions from the root, so it is valid after writes.
func get(cur **wcursor, b *wbucket, key []byte) []byte {
	if *cur == nil {
		*cur = b.Cursor()
	}
	// As Bucket.Get: Seek yields a nil value for a nested bucket.
	k, v := (*cur).Seek(key)
	if !bytes.Equal(k, key) {
		return nil
	}
	return v
}

// valueChunk is the size of the chunks valueBuf carves record values from.
const valueChunk = 64 << 10

// valueBuf returns an empty slice with capacity n for a record value that
// bbolt keeps until the commit: values of the apply path (an event, a row
// and a change record per event) are carved from shared chunks instead of
// one allocation each, and the chunks are the scratch's, reused by the
// next transaction. The capacity is exact, so an encoder that writes past
// n reallocates instead of overwriting the next value. Nothing carved
// from a chunk may outlive the transaction: every read returns copies.
func (t *syncTx) valueBuf(n int) []byte {
	if n > valueChunk/4 {
		return make([]byte, 0, n)
	}
	if cap(t.values)-len(t.values) < n {
		t.values = t.scratch.chunk()
	}
	at := len(t.values)
	t.values = t.values[:at+n]
	return t.values[at : at : at+n]
}

// own returns a copy of b in memory that lives until the transaction ends
// (bbolt keeps Put values by reference until commit).
func (t *syncTx) own(b []byte) []byte {
	return append(t.valueBuf(len(b)), b...)
}

func newSyncTx(d *DB, btx *wtx) (*syncTx, error) {
	t := &syncTx{d: d, tx: btx}
	for _, b := range []struct {
		dst  **wbucket
		name []byte
	}{
		{&t.meta, bucketMeta}, {&t.tables, bucketSyncTables}, {&t.events, bucketSyncEvents},
		{&t.ids, bucketSyncEventKeys}, {&t.rowIdx, bucketSyncRowGens}, {&t.tableIdx, bucketSyncTableIdx},
		{&t.rows, bucketSyncRows}, {&t.horizons, bucketSyncHorizons}, {&t.held, bucketSyncHeld},
		{&t.smeta, bucketSyncMeta}, {&t.sealed, bucketSyncSealed}, {&t.keys, bucketSyncKeys},
		{&t.rowIndexes, bucketSyncIndexes},
	} {
		if *b.dst = btx.Bucket(b.name); *b.dst == nil {
			return nil, fmt.Errorf("bolt: bucket %s missing: %w", b.name, persistence.ErrCorrupt)
		}
	}
	if btx.Writable() {
		// Pages are written whole whatever they hold, and a commit's CPU
		// and bytes go by the pages it writes (about 11 µs each at a
		// million events). bbolt splits a node it spills into pieces of
		// FillPercent of a page, and its default, half, suits keys that
		// land at random in a bucket that is rarely rewritten. These
		// buckets grow at a few places per commit (the log and the change
		// log at their end, the id index at each site's newest HLC, the
		// table index at the newest HLC, the row index in its newest
		// generation), so a piece filled to the brim is never split
		// again; the rows bucket is rewritten page by page on each commit
		// that touches its rows, so a fuller page is fewer pages to write.
		for _, b := range []*wbucket{t.events, t.ids, t.tableIdx, t.rowIdx} {
			b.SetFillPercent(sequentialFill)
		}
		t.rows.SetFillPercent(rowsFill)
	}
	return t, nil
}

func (t *syncTx) check() error {
	if t.done {
		return errTxDone
	}
	return nil
}

// flush writes the pending index entries and the sequence high-water
// mark changed by AppendEvent.
func (t *syncTx) flush() error {
	if err := t.flushIndexes(); err != nil {
		return err
	}
	if err := t.flushRows(); err != nil {
		return err
	}
	if err := t.flushSums(); err != nil {
		return err
	}
	if err := t.flushChangeSeq(); err != nil {
		return err
	}
	if !t.seqDirty {
		return nil
	}
	return t.meta.Put(metaSyncLastSeq, u64(t.lastSeq))
}

func (t *syncTx) loadSeq() (uint64, error) {
	if !t.seqLoaded {
		v := t.meta.Get(metaSyncLastSeq)
		switch len(v) {
		case 0:
		case 8:
			t.lastSeq = binary.BigEndian.Uint64(v)
		default:
			return 0, fmt.Errorf("bolt: last seq of %d bytes: %w", len(v), persistence.ErrCorrupt)
		}
		t.seqLoaded = true
	}
	return t.lastSeq, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// scan calls fn for the entries of b from start on while their key has
// prefix, copying them out of the cursor in chunks first so fn may write.
func scan(b *wbucket, start, prefix []byte, fn func(k, v []byte) (bool, error)) error {
	return scanChunks(b, start, prefix, scanChunk, fn)
}

// scanChunks is scan with a first chunk of first entries, doubling up to
// scanChunk.
func scanChunks(b *wbucket, start, prefix []byte, first int, fn func(k, v []byte) (bool, error)) error {
	type kv struct{ k, v []byte }
	chunk := first
	buf := make([]kv, 0, chunk)
	seek := start
	skipFirst := false
	for {
		buf = buf[:0]
		c := b.Cursor()
		k, v := c.Seek(seek)
		if skipFirst && k != nil && bytes.Equal(k, seek) {
			k, v = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(buf) < chunk; k, v = c.Next() {
			buf = append(buf, kv{clone(k), clone(v)})
		}
		more := k != nil && bytes.HasPrefix(k, prefix)
		for _, e := range buf {
			cont, err := fn(e.k, e.v)
			if err != nil || !cont {
				return err
			}
		}
		if !more || len(buf) == 0 {
			return nil
		}
		seek, skipFirst = buf[len(buf)-1].k, true
		chunk = min(2*chunk, scanChunk)
	}
}

func tableKeyOf(schema, table string) persistence.TableKey {
	return persistence.TableKey{Schema: schema, Table: table}
}

func (t *syncTx) Table(k persistence.TableKey) (persistence.TableDef, bool, error) {
	if err := t.check(); err != nil {
		return persistence.TableDef{}, false, err
	}
	v := t.tables.Get(tablePrefix(nil, k))
	if v == nil {
		return persistence.TableDef{}, false, nil
	}
	d, err := decodeTable(v)
	return d, err == nil, err
}

func decodeTable(v []byte) (persistence.TableDef, error) {
	var rec tableRecord
	if err := decodeRecord("table", v, &rec, &rec.V); err != nil {
		return persistence.TableDef{}, err
	}
	d := persistence.TableDef{Schema: rec.Schema, Table: rec.Table, KeyColumns: rec.KeyColumns, Columns: rec.Columns}
	for c, t := range rec.Types {
		if d.Types == nil {
			d.Types = make(map[string]messages.ColumnType, len(rec.Types))
		}
		d.Types[c] = messages.ColumnType(t)
	}
	for _, x := range rec.Indexes {
		d.Indexes = append(d.Indexes, persistence.IndexDef{Name: x.Name, Columns: x.Columns})
	}
	return d, nil
}

func (t *syncTx) Tables() ([]persistence.TableDef, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	var out []persistence.TableDef
	err := t.tables.ForEach(func(_, v []byte) error {
		d, err := decodeTable(v)
		out = append(out, d)
		return err
	})
	return out, err
}

// decodeEvent decodes an event record without opening Raw.
func decodeEvent(seq uint64, v []byte) (persistence.StoredEvent, error) {
	var rec eventRecord
	if err := decodeRecord("event", v, &rec, &rec.V); err != nil {
		return persistence.StoredEvent{}, err
	}
	ev := persistence.StoredEvent{
		Seq: seq, Raw: rec.Raw, HLC: messages.HLC(rec.HLC),
		Schema: rec.Schema, Table: rec.Table, RowKey: rec.RowKey,
	}
	if len(rec.ID) != len(ev.ID) {
		return ev, corrupt("event", fmt.Errorf("id of %d bytes", len(rec.ID)))
	}
	copy(ev.ID[:], rec.ID)
	site, err := siteFrom(rec.Site)
	if err != nil {
		return ev, corrupt("event", err)
	}
	ev.Site = site
	return ev, nil
}

// event loads the event at seq and opens its Raw. want, when non-nil, is
// the id the caller's index expects there.
func (t *syncTx) event(seq uint64, want *persistence.EventID) (persistence.StoredEvent, error) {
	v := t.events.Get(u64(seq))
	if v == nil {
		return persistence.StoredEvent{}, fmt.Errorf("bolt: index points at missing event %d: %w", seq, persistence.ErrCorrupt)
	}
	ev, err := decodeEvent(seq, v)
	if err != nil {
		return ev, err
	}
	if want != nil && ev.ID != *want {
		return ev, fmt.Errorf("bolt: event %d holds id %s, index says %s: %w", seq, ev.ID, *want, persistence.ErrCorrupt)
	}
	if s := t.d.opts.Sealer; s != nil {
		raw, err := s.Open(persistence.RecordEvent, ev.ID[:], ev.Raw)
		if err != nil {
			return ev, fmt.Errorf("bolt: open event %d: %w: %w", seq, persistence.ErrCorrupt, err)
		}
		ev.Raw = raw
	}
	// decodeEvent's slices alias nothing in bbolt's memory (CBOR copies),
	// so the returned event is the caller's own copy.
	return ev, nil
}

func (t *syncTx) Event(site messages.SiteID, h messages.HLC, id persistence.EventID) (persistence.StoredEvent, bool, error) {
	if err := t.check(); err != nil {
		return persistence.StoredEvent{}, false, err
	}
	// One seek to the (site, HLC) prefix: the id, if present, is among
	// the few entries there, and finding none at all answers the
	// EventIDsAt the apply path asks next without a second search.
	t.keyBuf = eventKey(t.keyBuf[:0], site, h, id)
	if t.idsCur == nil {
		t.idsCur = t.ids.Cursor()
	}
	prefix := t.keyBuf[:len(site)+8]
	var v []byte
	others := 0
	for k, kv := t.idsCur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, kv = t.idsCur.Next() {
		if bytes.Equal(k, t.keyBuf) {
			v = kv
			break
		}
		if others++; others > 2 {
			// Many events at one (site, HLC) (a hostile site): look the
			// id up directly.
			v = get(&t.idsCur, t.ids, t.keyBuf)
			break
		}
	}
	if v == nil {
		t.missed, t.hasMissed = id, true
		if others == 0 {
			t.noneAt, t.noneAtSite, t.noneAtHLC = true, site, h
		}
		return persistence.StoredEvent{}, false, nil
	}
	if len(v) != 8 {
		return persistence.StoredEvent{}, false, fmt.Errorf("bolt: id index value of %d bytes: %w", len(v), persistence.ErrCorrupt)
	}
	ev, err := t.event(binary.BigEndian.Uint64(v), &id)
	return ev, err == nil, err
}

func (t *syncTx) EventsAfter(after uint64, limit int, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if after == ^uint64(0) {
		return nil
	}
	n := 0
	return scan(t.events, u64(after+1), nil, func(k, v []byte) (bool, error) {
		if len(k) != 8 {
			return false, fmt.Errorf("bolt: event key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		ev, err := readEvent(binary.BigEndian.Uint64(k), v) // event_read.go: a sender reads every event it pushes
		if err != nil {
			return false, err
		}
		if s := t.d.opts.Sealer; s != nil {
			if ev.Raw, err = s.Open(persistence.RecordEvent, ev.ID[:], ev.Raw); err != nil {
				return false, fmt.Errorf("bolt: open event %d: %w: %w", ev.Seq, persistence.ErrCorrupt, err)
			}
		}
		more, err := fn(ev)
		n++
		return more && (limit <= 0 || n < limit), err
	})
}

// visitIndex calls fn for the events whose index keys (under prefix, of
// length len(prefix)+tail) end in a seq.
func (t *syncTx) visitIndex(b *wbucket, prefix []byte, tail int, fn func(persistence.StoredEvent) (bool, error)) error {
	return scan(b, prefix, prefix, func(k, _ []byte) (bool, error) {
		if len(k) != len(prefix)+tail {
			return false, fmt.Errorf("bolt: index key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		ev, err := t.event(binary.BigEndian.Uint64(k[len(k)-8:]), nil)
		if err != nil {
			return false, err
		}
		return fn(ev)
	})
}

func (t *syncTx) RowEvents(k persistence.TableKey, rowKey []byte, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if err := t.flushIndexes(); err != nil {
		return err
	}
	return rowEventSeqs(t.rowIdx, k, rowKey, func(seqs []uint64) (bool, error) {
		for _, seq := range seqs {
			ev, err := t.event(seq, nil)
			if err != nil {
				return false, err
			}
			if more, err := fn(ev); err != nil || !more {
				return false, err
			}
		}
		return true, nil
	})
}

func (t *syncTx) TableEvents(k persistence.TableKey, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if err := t.flushIndexes(); err != nil {
		return err
	}
	return t.visitIndex(t.tableIdx, tablePrefix(nil, k), 16, fn)
}

func (t *syncTx) LastSeq() (uint64, error) {
	if err := t.check(); err != nil {
		return 0, err
	}
	return t.loadSeq()
}

func (t *syncTx) Row(k persistence.TableKey, rowKey []byte) (persistence.Row, bool, error) {
	return t.RowWithKey(k, rowKey, nil)
}

// rowRecord returns the stored record of row rowKey of k (nil: none),
// the transaction's unflushed write first; t.keyBuf holds the row's
// storage key. key, when not nil, is rowKey's columns (no decoding).
func (t *syncTx) rowRecord(k persistence.TableKey, rowKey []byte, key messages.Columns) ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	def, err := t.tableDef(k)
	if err != nil {
		return nil, err
	}
	t.keyBuf = tablePrefix(t.keyBuf[:0], k)
	if key != nil {
		t.keyBuf = ordkey.AppendRowKey(t.keyBuf, def.KeyColumns, key)
	} else if len(def.KeyColumns) == 0 {
		t.keyBuf = append(t.keyBuf, rowKey...)
	} else if t.keyBuf, err = ordkey.RowKeyFromEncoded(t.keyBuf, def.KeyColumns, rowKey); err != nil {
		return nil, nil // not a key PutRow stores: no such row
	}
	return t.storedRow(t.keyBuf), nil
}

// storedRow returns the record stored under the full rows-bucket key sk
// (nil: none), the transaction's unflushed write first.
func (t *syncTx) storedRow(sk []byte) []byte {
	if v, ok := t.rowsOut[string(sk)]; ok {
		return v
	}
	return get(&t.rowsCur, t.rows, sk)
}

// RowWithKey is Row for a caller that already holds the row's key columns
// (the apply path has the event's key, whose encoding is rowKey): the
// returned row's Key is key instead of a fresh decoding of rowKey. A nil
// key decodes rowKey as Row does. The caller vouches that
// key.Encode() equals rowKey.
func (t *syncTx) RowWithKey(k persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error) {
	v, err := t.rowRecord(k, rowKey, key)
	if v == nil || err != nil {
		return persistence.Row{}, false, err
	}
	row, err := readRowKeyed(k, rowKey, key, v, &t.names)
	return row, err == nil, err
}

// RowForUpdate is RowWithKey for the apply path, which writes the row
// back (PutRow, AppendChange) before it reads the next: the returned row
// is the transaction's scratch instead of the caller's own copy. Its Cells
// map is the one the previous RowForUpdate returned, emptied and filled
// again, and its cell values share one copy of the record in the
// transaction's value memory; both are valid until the next RowForUpdate
// on this transaction or the transaction's end, whichever comes first
// (TestRowForUpdateLendsTheTransactionsMemory). Reading a row per applied
// event, a new map and copy per read were the largest allocation of the
// store's share of the apply path.
func (t *syncTx) RowForUpdate(k persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error) {
	v, err := t.rowRecord(k, rowKey, key)
	if v == nil || err != nil {
		return persistence.Row{}, false, err
	}
	if t.cells == nil {
		t.cells = make(map[string]persistence.Cell, 8)
	}
	t.lent, t.lentKey, t.lentVal = true, append(t.lentKey[:0], t.keyBuf...), v
	// A copy, so that a caller changing a value in place changes neither
	// bbolt's memory nor a row this transaction has yet to put.
	row, err := readRowInto(k, rowKey, key, t.own(v), &t.names, t.cells)
	return row, err == nil, err
}

func (t *syncTx) Rows(k persistence.TableKey, after []byte, fn func(rowKey []byte, row persistence.Row) (bool, error)) error {
	if err := t.check(); err != nil {
		return err
	}
	if err := t.flushRows(); err != nil {
		return err
	}
	def, err := t.tableDef(k)
	if err != nil {
		return err
	}
	prefix := tablePrefix(nil, k)
	start := clone(prefix)
	if after != nil {
		if len(def.KeyColumns) == 0 {
			start = append(start, after...)
		} else if start, err = ordkey.RowKeyFromEncoded(start, def.KeyColumns, after); err != nil {
			return fmt.Errorf("bolt: rows after %x: %w", after, err)
		}
	}
	return scan(t.rows, start, prefix, func(key, v []byte) (bool, error) {
		_, rowKey, err := ordkey.SplitRowKey(len(def.KeyColumns), key[len(prefix):])
		if err != nil {
			return false, corrupt("row key", err)
		}
		if after != nil && bytes.Equal(rowKey, after) {
			return true, nil
		}
		row, err := readRow(k, rowKey, v)
		if err != nil {
			return false, err
		}
		more, err := fn(rowKey, row)
		if err == nil && len(t.rowsOut) > 0 {
			// What fn wrote is in the bucket before the scan reads on,
			// as if PutRow had put it at once.
			err = t.flushRows()
		}
		return more, err
	})
}

func (t *syncTx) Horizon(k persistence.TableKey) (messages.HLC, error) {
	if err := t.check(); err != nil {
		return 0, err
	}
	v := t.horizons.Get(tablePrefix(nil, k))
	switch len(v) {
	case 0:
		return 0, nil
	case 8:
		return messages.HLC(binary.BigEndian.Uint64(v)), nil
	}
	return 0, fmt.Errorf("bolt: horizon of %d bytes: %w", len(v), persistence.ErrCorrupt)
}

func (t *syncTx) HeldGroups() ([]persistence.GroupKey, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	var out []persistence.GroupKey
	err := t.held.ForEach(func(k, _ []byte) error {
		g, _, err := parseGroupKey(k)
		if err != nil {
			return err
		}
		if len(out) == 0 || out[len(out)-1] != g {
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

func (t *syncTx) HeldEvents(g persistence.GroupKey) ([]uint64, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	prefix := groupPrefix(nil, g)
	var out []uint64
	err := scan(t.held, prefix, prefix, func(k, _ []byte) (bool, error) {
		if len(k) != len(prefix)+8 {
			return false, fmt.Errorf("bolt: held key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		out = append(out, binary.BigEndian.Uint64(k[len(prefix):]))
		return true, nil
	})
	return out, err
}

func (t *syncTx) Meta(key string) ([]byte, bool, error) {
	if err := t.check(); err != nil {
		return nil, false, err
	}
	v := t.smeta.Get([]byte(key))
	if v == nil {
		return nil, false, nil
	}
	return clone(v), true, nil
}

func sealedKey(rt persistence.RecordType, key string) []byte {
	return append([]byte{byte(rt)}, key...)
}

func (t *syncTx) SealedMeta(rt persistence.RecordType, key string) ([]byte, bool, error) {
	if err := t.check(); err != nil {
		return nil, false, err
	}
	v := t.sealed.Get(sealedKey(rt, key))
	if v == nil {
		return nil, false, nil
	}
	s := t.d.opts.Sealer
	if s == nil {
		return clone(v), true, nil
	}
	p, err := s.Open(rt, []byte(key), clone(v))
	if err != nil {
		return nil, false, fmt.Errorf("bolt: open sealed meta %q: %w: %w", key, persistence.ErrCorrupt, err)
	}
	return p, true, nil
}

func (t *syncTx) Keys() ([]persistence.KeyEntry, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	var out []persistence.KeyEntry
	err := t.keys.ForEach(func(_, v []byte) error {
		var rec keyRecord
		if err := decodeRecord("key", v, &rec, &rec.V); err != nil {
			return err
		}
		site, err := siteFrom(rec.Site)
		if err != nil {
			return corrupt("key", err)
		}
		out = append(out, persistence.KeyEntry{Kid: rec.Kid, Site: site, PublicKey: rec.PublicKey, Cutoff: messages.HLC(rec.Cutoff)})
		return nil
	})
	return out, err
}

// --- writes ---

var errReadOnly = errors.New("bolt: write in a read-only transaction")

func (t *syncTx) checkWrite() error {
	if t.done {
		return errTxDone
	}
	if !t.tx.Writable() {
		return errReadOnly
	}
	return nil
}

func (t *syncTx) PutTable(def persistence.TableDef) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	rec := tableRecord{V: recordVersion, Schema: def.Schema, Table: def.Table, KeyColumns: def.KeyColumns, Columns: def.Columns}
	for c, t := range def.Types {
		if t == messages.TypeAny {
			continue // the default: not stored
		}
		if rec.Types == nil {
			rec.Types = map[string]uint8{}
		}
		rec.Types[c] = uint8(t)
	}
	for _, x := range def.Indexes {
		rec.Indexes = append(rec.Indexes, indexRecord{Name: x.Name, Columns: x.Columns})
	}
	v, err := messages.Marshal(&rec)
	if err != nil {
		return fmt.Errorf("bolt: put table: %w", err)
	}
	delete(t.defs, tableKeyOf(def.Schema, def.Table))
	return t.tables.Put(tablePrefix(nil, tableKeyOf(def.Schema, def.Table)), v)
}

var empty = []byte{}

func (t *syncTx) AppendEvent(ev persistence.StoredEvent) (uint64, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	knownAbsent := t.hasMissed && t.missed == ev.ID
	t.hasMissed, t.noneAt = false, false
	t.keyBuf = eventKey(t.keyBuf[:0], ev.Site, ev.HLC, ev.ID)
	if !knownAbsent && get(&t.idsCur, t.ids, t.keyBuf) != nil {
		return 0, fmt.Errorf("bolt: append event %s: %w", ev.ID, persistence.ErrDuplicate)
	}
	last, err := t.loadSeq()
	if err != nil {
		return 0, err
	}
	seq := last + 1
	tk := tableKeyOf(ev.Schema, ev.Table)
	// The id as a slice of per-transaction memory: slicing ev.ID itself
	// for the Sealer (an interface) would move all of ev to the heap.
	t.idBuf = append(t.idBuf[:0], ev.ID[:]...)
	raw := ev.Raw
	if s := t.d.opts.Sealer; s != nil {
		if sealed := ev.Prepared.Sealed(&ev, s); sealed != nil {
			raw = sealed // sealed off the writer (PrepareEvents)
		} else if raw, err = s.Seal(persistence.RecordEvent, t.idBuf, ev.Raw); err != nil {
			return 0, fmt.Errorf("bolt: seal event %s: %w", ev.ID, err)
		}
	}
	rec := eventRecord{
		V: recordVersion, ID: t.idBuf, Site: ev.Site[:], HLC: uint64(ev.HLC),
		Schema: ev.Schema, Table: ev.Table, RowKey: ev.RowKey, Raw: raw,
	}
	v := encodeEventTo(t.valueBuf(eventLen(&rec)), &rec)
	// bbolt copies keys on Put but keeps values until commit: the keys
	// come from the scratch buffer, the seq value from the arena.
	t.keyBuf = binary.BigEndian.AppendUint64(t.keyBuf[:0], seq)
	seqVal := t.own(t.keyBuf)
	if err := t.events.Put(t.keyBuf, v); err != nil {
		return 0, err
	}
	t.keyBuf = eventKey(t.keyBuf[:0], ev.Site, ev.HLC, ev.ID)
	if err := t.ids.Put(t.keyBuf, seqVal); err != nil {
		return 0, err
	}
	// The row and table index entries are put in key order at the end
	// (flushIndexes).
	if t.pendRow == nil {
		t.pendRow, t.pendTable = t.scratch.pending(t.d.pendHint.Load())
	}
	t.keyBuf = rowIdxKey(t.keyBuf[:0], tk, ev.RowKey, seq)
	t.pendRow = append(t.pendRow, t.pendKey(t.keyBuf))
	t.keyBuf = tableIdxKey(t.keyBuf[:0], tk, ev.HLC, seq)
	t.pendTable = append(t.pendTable, t.pendKey(t.keyBuf))
	if !t.psums.Append(&ev) { // prepared: its group's sum is added at flushSums
		t.sumChange(tk, ev.Site, ev.HLC, ev.ID, true)
	}
	t.lastSeq, t.seqDirty = seq, true
	return seq, nil
}

func (t *syncTx) DeleteEventsBelow(k persistence.TableKey, h messages.HLC) (int, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	if err := t.flushIndexes(); err != nil {
		return 0, err
	}
	prefix := tablePrefix(nil, k)
	end := binary.BigEndian.AppendUint64(clone(prefix), uint64(h))
	var idxKeys [][]byte
	c := t.tableIdx.Cursor()
	for key, _ := c.Seek(prefix); key != nil && bytes.Compare(key, end) < 0; key, _ = c.Next() {
		if len(key) != len(prefix)+16 {
			return 0, fmt.Errorf("bolt: table index key of %d bytes: %w", len(key), persistence.ErrCorrupt)
		}
		idxKeys = append(idxKeys, clone(key))
	}
	for _, key := range idxKeys {
		seqKey := key[len(key)-8:]
		v := t.events.Get(seqKey)
		if v == nil {
			return 0, fmt.Errorf("bolt: table index points at a missing event: %w", persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(binary.BigEndian.Uint64(seqKey), v)
		if err != nil {
			return 0, err
		}
		for _, del := range []struct {
			b   *wbucket
			key []byte
		}{
			{t.events, seqKey}, {t.ids, eventKey(nil, ev.Site, ev.HLC, ev.ID)}, {t.rowIdx, rowIdxKey(nil, k, ev.RowKey, ev.Seq)}, {t.tableIdx, key},
		} {
			if err := del.b.Delete(del.key); err != nil {
				return 0, err
			}
		}
		t.sumChange(k, ev.Site, ev.HLC, ev.ID, false)
	}
	return len(idxKeys), nil
}

// validRowKey reports why a row's key cannot be stored (Columns.Encode
// needs well-formed values; SSP/1 §13.6 a non-empty key).
func validRowKey(key messages.Columns) error {
	if len(key) == 0 {
		return fmt.Errorf("bolt: put row: %w", messages.ErrEmptyRowKey)
	}
	for n, v := range key {
		if err := messages.Wellformed(v); err != nil {
			return fmt.Errorf("bolt: put row: key column %q: %w", n, err)
		}
	}
	return nil
}

func (t *syncTx) PutRow(row persistence.Row) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	if err := validRowKey(row.Key); err != nil {
		return err
	}
	tk := tableKeyOf(row.Schema, row.Table)
	def, err := t.tableDef(tk)
	if err != nil {
		return err
	}
	v := encodeRowTo(t.valueBuf(rowLen(&row)), &row)
	t.keyBuf = tablePrefix(t.keyBuf[:0], tk)
	pl := len(t.keyBuf)
	t.keyBuf = ordkey.AppendRowKey(t.keyBuf, def.KeyColumns, row.Key)
	if len(t.keyBuf) > bbolt.MaxKeySize {
		return fmt.Errorf("bolt: put row: %w", bolterrors.ErrKeyTooLarge) // as Put would, at once
	}
	var old []byte
	if t.lent {
		t.lent = false
		if bytes.Equal(t.keyBuf, t.lentKey) {
			if bytes.Equal(v, t.lentVal) {
				// The row lent for this update, unchanged (an event that
				// won no cell): what is stored already is these bytes, and
				// a Put would only dirty its page for the commit to
				// rewrite.
				return nil
			}
			old = t.lentVal
		}
	}
	if len(def.Indexes) > 0 {
		if old == nil {
			old = t.storedRow(t.keyBuf)
		}
		// updateIndexes leaves t.keyBuf alone.
		if err := t.updateIndexes(tk, def, t.keyBuf[:pl], t.keyBuf[pl:], old, &row); err != nil {
			return err
		}
	}
	if t.rowsOut == nil {
		t.rowsOut = t.scratch.rows(t.d.rowsHint.Load())
	}
	// flushRows puts it. The map's key is a string over a copy of the key
	// in the transaction's value memory, which nothing writes over before
	// the transaction ends, and the map is emptied before then (flushRows,
	// or txScratch.reset drops it): string(t.keyBuf) was an allocation per
	// row written.
	k := t.pendKey(t.keyBuf)
	t.rowsOut[unsafe.String(unsafe.SliceData(k), len(k))] = v
	return nil
}

func (t *syncTx) SetHorizon(k persistence.TableKey, h messages.HLC) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	return t.horizons.Put(tablePrefix(nil, k), u64(uint64(h)))
}

func (t *syncTx) PutMeta(key string, value []byte) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	if key == "" {
		return errors.New("bolt: put meta: empty key")
	}
	return t.smeta.Put([]byte(key), clone(nonNil(value)))
}

func nonNil(b []byte) []byte {
	if b == nil {
		return empty
	}
	return b
}

func (t *syncTx) PutSealedMeta(rt persistence.RecordType, key string, value []byte) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	v := clone(nonNil(value))
	if s := t.d.opts.Sealer; s != nil {
		var err error
		if v, err = s.Seal(rt, []byte(key), value); err != nil {
			return fmt.Errorf("bolt: seal meta %q: %w", key, err)
		}
	}
	return t.sealed.Put(sealedKey(rt, key), v)
}

func (t *syncTx) PutKey(k persistence.KeyEntry) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	if len(k.Kid) == 0 {
		return errors.New("bolt: put key: empty kid")
	}
	v, err := messages.Marshal(&keyRecord{V: recordVersion, Kid: k.Kid, Site: k.Site[:], PublicKey: k.PublicKey, Cutoff: uint64(k.Cutoff)})
	if err != nil {
		return fmt.Errorf("bolt: put key: %w", err)
	}
	return t.keys.Put(clone(k.Kid), v)
}
