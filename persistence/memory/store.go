// Package memory implements persistence.SyncStore in memory, without
// encryption: the same contract as persistence/bolt, for tests, property
// tests and simulations.
//
// Every Update works on a copy-on-write image of the committed state and
// publishes it atomically on success, so an Update whose fn fails leaves
// nothing behind and a View reads one consistent snapshot without blocking
// writers. Updates run one at a time.
package memory

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// errTxDone is returned by a transaction used after its fn returned.
var errTxDone = fmt.Errorf("memory: transaction used after it ended: %w", persistence.ErrClosed)

type rowID struct {
	schema, table, key string
}

type indexID struct {
	schema, table, index string
}

type smetaKey struct {
	t   persistence.RecordType
	key string
}

// state is one committed image of the store. Committed states are immutable.
type state struct {
	lastSeq     uint64
	tables      cowMap[persistence.TableKey, persistence.TableDef]
	events      cowMap[uint64, *persistence.StoredEvent] // immutable once stored
	ids         cowMap[persistence.EventID, uint64]
	stamps      cowMap[stamp, []persistence.EventID]   // (site, HLC) → ids, ascending; shared slices, copied on write
	rowEvents   cowMap[rowID, []uint64]                // ascending seqs
	tableEvents cowMap[persistence.TableKey, []uint64] // ascending seqs
	rows        cowMap[rowID, *persistence.Row]        // deep copies, never mutated
	rowKeys     cowMap[persistence.TableKey, []string] // sorted storage keys (persistence.RowStorageKey) of a table's rows
	indexes     cowMap[indexID, []string]              // sorted entries (persistence.IndexEntry) of an index
	horizons    cowMap[persistence.TableKey, messages.HLC]
	held        cowMap[persistence.GroupKey, []uint64] // ascending seqs
	meta        cowMap[string, []byte]
	smeta       cowMap[smetaKey, []byte]
	keys        cowMap[string, persistence.KeyEntry]
	// SSP/1 §14 delivery state (syncdelivery.go).
	cursors    cowMap[string, persistence.SenderCursor]
	watermarks cowMap[persistence.GroupKey, persistence.Watermark]
	peers      cowMap[string, persistence.PeerProgress]
	heldUsage  cowMap[messages.SiteID, persistence.HeldUsage]
	// The change log (changes.go): dense sequences oldestChange..lastChange.
	changes                  cowMap[uint64, *persistence.RowChange]
	oldestChange, lastChange uint64
	// Reconciliation's range sums (reconcile.go), and the prepared shares
	// of this transaction's appended events not added to them yet (nil in
	// a committed state: Update resolves them before it commits).
	sums  cowMap[sumKey, *persistence.RangeSum]
	psums persistence.PreparedSums
}

func (s *state) begin(gen uint64) {
	s.tables.begin(gen)
	s.events.begin(gen)
	s.ids.begin(gen)
	s.stamps.begin(gen)
	s.rowEvents.begin(gen)
	s.tableEvents.begin(gen)
	s.rows.begin(gen)
	s.rowKeys.begin(gen)
	s.indexes.begin(gen)
	s.horizons.begin(gen)
	s.held.begin(gen)
	s.meta.begin(gen)
	s.smeta.begin(gen)
	s.keys.begin(gen)
	s.cursors.begin(gen)
	s.watermarks.begin(gen)
	s.peers.begin(gen)
	s.heldUsage.begin(gen)
	s.changes.begin(gen)
	s.sums.begin(gen)
}

// backing is the data shared by every handle opened over it (Reopen).
type backing struct {
	wmu sync.Mutex // one writer at a time
	gen uint64     // guarded by wmu
	cur atomic.Pointer[state]
}

// Store is an in-memory persistence.SyncStore.
type Store struct {
	b      *backing
	closed atomic.Bool
}

var _ persistence.SyncStore = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	b := &backing{}
	b.cur.Store(&state{})
	return &Store{b: b}
}

// Reopen returns a new open handle over the same committed data, as a
// restart would see it (the memory analogue of closing and reopening a
// file). s may be closed.
func (s *Store) Reopen() *Store { return &Store{b: s.b} }

// Close marks the handle closed; later calls on it return
// persistence.ErrClosed. The data stays reachable through Reopen. Close
// is idempotent (a second call returns nil).
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// Update runs fn in one atomic transaction (see persistence.SyncStore).
// Sequence numbers assigned inside an Update whose fn fails are not
// consumed: the sequence is strictly increasing across committed
// transactions.
func (s *Store) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	if s.closed.Load() {
		return fmt.Errorf("memory: update: %w", persistence.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: update: %w", err)
	}
	s.b.wmu.Lock()
	defer s.b.wmu.Unlock()
	if s.closed.Load() {
		return fmt.Errorf("memory: update: %w", persistence.ErrClosed)
	}
	s.b.gen++
	next := *s.b.cur.Load()
	next.begin(s.b.gen)
	tx := &txn{st: &next, write: true}
	err := fn(tx)
	tx.done = true
	if err != nil {
		return err
	}
	next.resolveSums()
	s.b.cur.Store(&next)
	return nil
}

// View runs fn over the committed snapshot current when View starts.
func (s *Store) View(ctx context.Context, fn func(tx persistence.SyncReader) error) error {
	if s.closed.Load() {
		return fmt.Errorf("memory: view: %w", persistence.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: view: %w", err)
	}
	tx := &txn{st: s.b.cur.Load()}
	err := fn(tx)
	tx.done = true
	return err
}

// txn implements persistence.SyncTx over a state image.
type txn struct {
	st    *state
	write bool
	done  bool
	// Index slices this transaction already copied: appends to them happen
	// in place, so a batch of appends to one table costs one copy.
	ownTable map[persistence.TableKey]bool
	ownRow   map[rowID]bool
}

// appendOwned appends seq to the slice at k of m, copying it the first time
// this transaction touches it (committed slices are shared with snapshots).
func appendOwned[K comparable](m *cowMap[K, []uint64], own map[K]bool, k K, seq uint64) {
	s, _ := m.get(k)
	if !own[k] {
		s = append(make([]uint64, 0, len(s)+16), s...)
		own[k] = true
	}
	m.put(k, append(s, seq))
}

func (t *txn) check(write bool) error {
	if t.done {
		return errTxDone
	}
	if write && !t.write {
		return errors.New("memory: write in a read-only transaction")
	}
	return nil
}

func tableSortKey(schema, table string) []byte {
	b := binary.AppendUvarint(nil, uint64(len(schema)))
	b = append(b, schema...)
	b = binary.AppendUvarint(b, uint64(len(table)))
	return append(b, table...)
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func cloneEvent(ev persistence.StoredEvent) persistence.StoredEvent {
	ev.Raw = cloneBytes(ev.Raw)
	ev.RowKey = cloneBytes(ev.RowKey)
	ev.Prepared = nil // the caller's, never stored
	return ev
}

// PrepareEvents sums the reconciliation keys of evs ahead of their
// transaction (persistence.PreparedEvent); the memory store seals nothing.
func (s *Store) PrepareEvents(evs []*persistence.StoredEvent) { persistence.PrepareEvents(evs, nil) }

func cloneDef(d persistence.TableDef) persistence.TableDef {
	d.KeyColumns = slices.Clone(d.KeyColumns)
	d.Columns = slices.Clone(d.Columns)
	d.Types = maps.Clone(d.Types)
	d.Indexes = persistence.CloneIndexes(d.Indexes)
	return d
}

func cloneKey(k persistence.KeyEntry) persistence.KeyEntry {
	k.Kid = cloneBytes(k.Kid)
	k.PublicKey = cloneBytes(k.PublicKey)
	return k
}

func cloneRow(r persistence.Row) persistence.Row {
	if r.Key != nil {
		k := make(messages.Columns, len(r.Key))
		for n, v := range r.Key {
			k[n] = v.Clone()
		}
		r.Key = k
	}
	if r.Cells != nil {
		c := make(map[string]persistence.Cell, len(r.Cells))
		for n, v := range r.Cells {
			v.Value = v.Value.Clone()
			c[n] = v
		}
		r.Cells = c
	}
	return r
}

// insertSorted returns a new slice holding s plus v (kept sorted, no duplicates).
func insertSorted[E cmp.Ordered](s []E, v E) []E {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	out := make([]E, 0, len(s)+1)
	out = append(out, s[:i]...)
	out = append(out, v)
	return append(out, s[i:]...)
}

// removeSorted returns a new slice without v.
func removeSorted[E cmp.Ordered](s []E, v E) []E {
	i, found := slices.BinarySearch(s, v)
	if !found {
		return s
	}
	out := make([]E, 0, len(s)-1)
	out = append(out, s[:i]...)
	return append(out, s[i+1:]...)
}

func (t *txn) Table(k persistence.TableKey) (persistence.TableDef, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.TableDef{}, false, err
	}
	d, ok := t.st.tables.get(k)
	if !ok {
		return persistence.TableDef{}, false, nil
	}
	return cloneDef(d), true, nil
}

func (t *txn) Tables() ([]persistence.TableDef, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	var out []persistence.TableDef
	t.st.tables.each(func(_ persistence.TableKey, d persistence.TableDef) { out = append(out, cloneDef(d)) })
	slices.SortFunc(out, func(a, b persistence.TableDef) int {
		return bytes.Compare(tableSortKey(a.Schema, a.Table), tableSortKey(b.Schema, b.Table))
	})
	return out, nil
}

func (t *txn) Event(site messages.SiteID, h messages.HLC, id persistence.EventID) (persistence.StoredEvent, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.StoredEvent{}, false, err
	}
	seq, ok := t.st.ids.get(id)
	if !ok {
		return persistence.StoredEvent{}, false, nil
	}
	ev, ok := t.st.events.get(seq)
	if !ok {
		return persistence.StoredEvent{}, false, fmt.Errorf("memory: event index points at missing seq %d: %w", seq, persistence.ErrCorrupt)
	}
	if ev.Site != site || ev.HLC != h {
		return persistence.StoredEvent{}, false, nil // the bolt index is keyed by (site, HLC, id)
	}
	return cloneEvent(*ev), true, nil
}

func (t *txn) EventsAfter(after uint64, limit int, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	n := 0
	for seq := after + 1; seq > after && seq <= t.st.lastSeq; seq++ {
		ev, ok := t.st.events.get(seq)
		if !ok {
			continue
		}
		more, err := fn(cloneEvent(*ev))
		if err != nil {
			return err
		}
		n++
		if !more || (limit > 0 && n >= limit) {
			return nil
		}
	}
	return nil
}

func (t *txn) visitSeqs(seqs []uint64, fn func(persistence.StoredEvent) (bool, error)) error {
	for _, seq := range seqs {
		ev, ok := t.st.events.get(seq)
		if !ok {
			return fmt.Errorf("memory: index points at missing seq %d: %w", seq, persistence.ErrCorrupt)
		}
		more, err := fn(cloneEvent(*ev))
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func (t *txn) RowEvents(k persistence.TableKey, rowKey []byte, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	seqs, _ := t.st.rowEvents.get(rowID{k.Schema, k.Table, string(rowKey)})
	return t.visitSeqs(seqs, fn)
}

func (t *txn) TableEvents(k persistence.TableKey, fn func(persistence.StoredEvent) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	seqs, _ := t.st.tableEvents.get(k)
	return t.visitSeqs(seqs, fn)
}

func (t *txn) LastSeq() (uint64, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.st.lastSeq, nil
}

func (t *txn) Row(k persistence.TableKey, rowKey []byte) (persistence.Row, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.Row{}, false, err
	}
	r, ok := t.st.rows.get(rowID{k.Schema, k.Table, string(rowKey)})
	if !ok {
		return persistence.Row{}, false, nil
	}
	return cloneRow(*r), true, nil
}

func (t *txn) Rows(k persistence.TableKey, after []byte, fn func(rowKey []byte, row persistence.Row) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	def, _, _ := t.Table(k)
	keys, _ := t.st.rowKeys.get(k)
	i := 0
	if after != nil {
		from := after
		if len(def.KeyColumns) > 0 {
			var err error
			if from, err = ordkey.RowKeyFromEncoded(nil, def.KeyColumns, after); err != nil {
				return fmt.Errorf("memory: rows after %x: %w", after, err)
			}
		}
		var found bool
		i, found = slices.BinarySearch(keys, string(from))
		if found {
			i++
		}
	}
	for _, sk := range keys[i:] {
		_, key, err := ordkey.SplitRowKey(len(def.KeyColumns), []byte(sk))
		if err != nil {
			return fmt.Errorf("memory: row key: %w: %w", persistence.ErrCorrupt, err)
		}
		r, ok := t.st.rows.get(rowID{k.Schema, k.Table, string(key)})
		if !ok {
			return fmt.Errorf("memory: row index points at a missing row: %w", persistence.ErrCorrupt)
		}
		more, err := fn(key, cloneRow(*r))
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func (t *txn) IndexRange(k persistence.TableKey, index string, from []byte, fn func(entry []byte, row persistence.Row) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	def, _, _ := t.Table(k)
	var entries []string
	var x persistence.IndexDef
	if index == "" {
		entries, _ = t.st.rowKeys.get(k)
	} else {
		var ok bool
		if x, ok = def.Index(index); !ok {
			return fmt.Errorf("memory: index range: %q of %s.%s: %w", index, k.Schema, k.Table, persistence.ErrNotFound)
		}
		entries, _ = t.st.indexes.get(indexID{k.Schema, k.Table, index})
	}
	i, _ := slices.BinarySearch(entries, string(from))
	for _, e := range entries[i:] {
		sk, err := persistence.IndexRowKey(len(x.Columns), []byte(e))
		if err != nil {
			return fmt.Errorf("memory: index entry: %w: %w", persistence.ErrCorrupt, err)
		}
		_, key, err := ordkey.SplitRowKey(len(def.KeyColumns), sk)
		if err != nil {
			return fmt.Errorf("memory: index entry: %w: %w", persistence.ErrCorrupt, err)
		}
		r, ok := t.st.rows.get(rowID{k.Schema, k.Table, string(key)})
		if !ok {
			return fmt.Errorf("memory: index entry points at a missing row: %w", persistence.ErrCorrupt)
		}
		more, err := fn([]byte(e), cloneRow(*r))
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func (t *txn) IndexRow(k persistence.TableKey, index string, row persistence.Row) error {
	if err := t.check(true); err != nil {
		return err
	}
	def, _, _ := t.Table(k)
	x, ok := def.Index(index)
	if !ok {
		return fmt.Errorf("memory: index row: %q of %s.%s: %w", index, k.Schema, k.Table, persistence.ErrNotFound)
	}
	if e, ok := persistence.IndexEntry(nil, def, x, row); ok {
		id := indexID{k.Schema, k.Table, index}
		es, _ := t.st.indexes.get(id)
		t.st.indexes.put(id, insertSorted(es, string(e)))
	}
	return nil
}

func (t *txn) Horizon(k persistence.TableKey) (messages.HLC, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	h, _ := t.st.horizons.get(k)
	return h, nil
}

func groupSortKey(g persistence.GroupKey) []byte {
	return append(append([]byte{}, g.Site[:]...), tableSortKey(g.Schema, g.Table)...)
}

func (t *txn) HeldGroups() ([]persistence.GroupKey, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	var out []persistence.GroupKey
	t.st.held.each(func(g persistence.GroupKey, _ []uint64) { out = append(out, g) })
	slices.SortFunc(out, func(a, b persistence.GroupKey) int { return bytes.Compare(groupSortKey(a), groupSortKey(b)) })
	return out, nil
}

func (t *txn) HeldEvents(g persistence.GroupKey) ([]uint64, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	s, _ := t.st.held.get(g)
	return slices.Clone(s), nil
}

func (t *txn) Meta(key string) ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	v, ok := t.st.meta.get(key)
	return cloneBytes(v), ok, nil
}

func (t *txn) SealedMeta(rt persistence.RecordType, key string) ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	v, ok := t.st.smeta.get(smetaKey{rt, key})
	return cloneBytes(v), ok, nil
}

func (t *txn) Keys() ([]persistence.KeyEntry, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	var out []persistence.KeyEntry
	t.st.keys.each(func(_ string, k persistence.KeyEntry) { out = append(out, cloneKey(k)) })
	slices.SortFunc(out, func(a, b persistence.KeyEntry) int { return bytes.Compare(a.Kid, b.Kid) })
	return out, nil
}

func (t *txn) PutTable(def persistence.TableDef) error {
	if err := t.check(true); err != nil {
		return err
	}
	t.st.tables.put(persistence.TableKey{Schema: def.Schema, Table: def.Table}, cloneDef(def))
	return nil
}

func (t *txn) AppendEvent(ev persistence.StoredEvent) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if _, dup := t.st.ids.get(ev.ID); dup {
		return 0, fmt.Errorf("memory: append event %s: %w", ev.ID, persistence.ErrDuplicate)
	}
	t.st.lastSeq++
	if !t.st.psums.Append(&ev) { // prepared: its group's sum is added by resolveSums
		t.st.changeSum(&ev, true)
	}
	ev = cloneEvent(ev)
	ev.Seq = t.st.lastSeq
	t.st.events.put(ev.Seq, &ev)
	t.st.ids.put(ev.ID, ev.Seq)
	t.st.addStamp(ev)
	if t.ownTable == nil {
		t.ownTable, t.ownRow = map[persistence.TableKey]bool{}, map[rowID]bool{}
	}
	appendOwned(&t.st.rowEvents, t.ownRow, rowID{ev.Schema, ev.Table, string(ev.RowKey)}, ev.Seq)
	appendOwned(&t.st.tableEvents, t.ownTable, persistence.TableKey{Schema: ev.Schema, Table: ev.Table}, ev.Seq)
	return ev.Seq, nil
}

func (t *txn) DeleteEventsBelow(k persistence.TableKey, h messages.HLC) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	seqs, _ := t.st.tableEvents.get(k)
	keep := make([]uint64, 0, len(seqs))
	n := 0
	for _, seq := range seqs {
		ev, ok := t.st.events.get(seq)
		if !ok {
			return 0, fmt.Errorf("memory: table index points at missing seq %d: %w", seq, persistence.ErrCorrupt)
		}
		if ev.HLC >= h {
			keep = append(keep, seq)
			continue
		}
		n++
		t.st.events.del(seq)
		t.st.ids.del(ev.ID)
		t.st.removeStamp(ev)
		t.st.changeSum(ev, false)
		rid := rowID{ev.Schema, ev.Table, string(ev.RowKey)}
		rs, _ := t.st.rowEvents.get(rid)
		delete(t.ownRow, rid) // removeSorted returns a fresh slice or the shared one
		if rs = removeSorted(rs, seq); len(rs) == 0 {
			t.st.rowEvents.del(rid)
		} else {
			t.st.rowEvents.put(rid, rs)
		}
	}
	if n > 0 {
		delete(t.ownTable, k)
		if len(keep) == 0 {
			t.st.tableEvents.del(k)
		} else {
			t.st.tableEvents.put(k, keep)
		}
	}
	return n, nil
}

// validRowKey reports why a row's key cannot be stored (Columns.Encode
// requires well-formed values and SSP/1 §13.6 a non-empty key).
func validRowKey(key messages.Columns) error {
	if len(key) == 0 {
		return fmt.Errorf("memory: put row: %w", messages.ErrEmptyRowKey)
	}
	for n, v := range key {
		if err := messages.Wellformed(v); err != nil {
			return fmt.Errorf("memory: put row: key column %q: %w", n, err)
		}
	}
	return nil
}

func (t *txn) PutRow(row persistence.Row) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := validRowKey(row.Key); err != nil {
		return err
	}
	key := string(row.Key.Encode())
	tk := persistence.TableKey{Schema: row.Schema, Table: row.Table}
	def, _, _ := t.Table(tk)
	rid := rowID{row.Schema, row.Table, key}
	old, had := t.st.rows.get(rid)
	if !had {
		ks, _ := t.st.rowKeys.get(tk)
		t.st.rowKeys.put(tk, insertSorted(ks, string(persistence.RowStorageKey(nil, def, row.Key))))
	}
	// The row's index entries move in the same transaction.
	for _, x := range def.Indexes {
		var a, b []byte
		var hadOld, hasNew bool
		if had {
			a, hadOld = persistence.IndexEntry(nil, def, x, *old)
		}
		b, hasNew = persistence.IndexEntry(nil, def, x, row)
		if hadOld && hasNew && bytes.Equal(a, b) {
			continue
		}
		id := indexID{row.Schema, row.Table, x.Name}
		es, _ := t.st.indexes.get(id)
		if hadOld {
			es = removeSorted(es, string(a))
		}
		if hasNew {
			es = insertSorted(es, string(b))
		}
		t.st.indexes.put(id, es)
	}
	row = cloneRow(row)
	t.st.rows.put(rid, &row)
	return nil
}

func (t *txn) SetHorizon(k persistence.TableKey, h messages.HLC) error {
	if err := t.check(true); err != nil {
		return err
	}
	t.st.horizons.put(k, h)
	return nil
}

func (t *txn) PutMeta(key string, value []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	if key == "" {
		return errors.New("memory: put meta: empty key")
	}
	t.st.meta.put(key, append([]byte{}, value...))
	return nil
}

func (t *txn) PutSealedMeta(rt persistence.RecordType, key string, value []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	t.st.smeta.put(smetaKey{rt, key}, append([]byte{}, value...))
	return nil
}

func (t *txn) PutKey(k persistence.KeyEntry) error {
	if err := t.check(true); err != nil {
		return err
	}
	if len(k.Kid) == 0 {
		return errors.New("memory: put key: empty kid")
	}
	t.st.keys.put(string(k.Kid), cloneKey(k))
	return nil
}

// TableEventKeys lists a table's event keys at or above min in (site,
// HLC, id) order (reconciliation's range API).
func (t *txn) TableEventKeys(k persistence.TableKey, min messages.HLC, fn func(persistence.EventKey) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	seqs, _ := t.st.tableEvents.get(k)
	keys := make([]persistence.EventKey, 0, len(seqs))
	for _, seq := range seqs {
		ev, ok := t.st.events.get(seq)
		if !ok {
			return fmt.Errorf("memory: table index points at missing seq %d: %w", seq, persistence.ErrCorrupt)
		}
		if ev.HLC >= min {
			keys = append(keys, persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID})
		}
	}
	slices.SortFunc(keys, persistence.EventKey.Compare)
	for _, key := range keys {
		if more, err := fn(key); err != nil || !more {
			return err
		}
	}
	return nil
}
