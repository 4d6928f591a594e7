package runtime

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// DefaultChangeLogLimit is how many row changes a node retains for Watch
// unless Config.ChangeLogLimit says otherwise.
const DefaultChangeLogLimit = 100_000

// watchPage is how many changes a watcher reads per read transaction: all
// a watcher ever holds in memory, however far behind it is. What it has
// not read yet waits in the bounded, persisted change log.
const watchPage = 256

// ChangeCause says what made a row change.
type ChangeCause = persistence.ChangeCause

// Change causes.
const (
	// CauseEvent: one event was materialized — a local write, an event
	// received from a peer, or a held event released by DefineTable.
	// Change.Event is that event's clock (HLC, signing site, event id).
	CauseEvent = persistence.CauseEvent
	// CauseAddColumn: AddColumn rebuilt the new column from the retained
	// events (SSP/1 §13.6). No new event caused it; Change.Event is zero.
	CauseAddColumn = persistence.CauseAddColumn
)

// Change is one row change delivered by Watch.
//
// What counts as a change: a write of a row that changes what a reader of
// the row can see — its existence, its existence or tombstone clock, or
// any cell's value or clock (written, overwritten, or cleared by a
// delete). A write that leaves the row as stored (a duplicate, a write
// that loses last-writer-wins, a delete older than everything it could
// clear) is not a change. Changes are recorded in the storage transaction
// that writes the row, so a committed write always has its change and a
// change is never delivered for a write that did not commit.
type Change struct {
	// Seq is the change sequence: strictly increasing across the node's
	// tables and never reused, across restarts and restores too. Resume a
	// watch after the last Seq you processed. Not dense: each Open of an
	// on-disk node continues at least at the wall clock in Unix
	// microseconds (below 2^53 until the year 2255, so exact in JSON
	// numbers), so a node whose whole directory was restored from an
	// older copy does not assign again what its lost history assigned.
	// That holds unless the lost history sustained more than one change
	// per microsecond since its Open, or the wall clock was set back
	// past it; an in-memory node starts at 1.
	Seq           uint64
	Schema, Table string
	Key           messages.Columns
	// The row's state after the change.
	Exists    bool
	Existence messages.Clock
	Tomb      messages.Clock
	// Cells holds only the value columns the change touched, as a reader
	// now sees them: Written (value and clock of the winning write) or
	// Cleared (null at the tombstone clock).
	Cells map[string]Cell
	Cause ChangeCause
	// Event is the clock of the event that caused the change (its HLC and
	// signing site: Event.HLC, Event.Site) when Cause is CauseEvent; zero
	// otherwise.
	Event messages.Clock
}

// Value decodes changed column col into out, as Row.Value does: it
// reports Unmaterialized for a column the change did not touch, and out
// is untouched unless the state is Written or Cleared.
func (c Change) Value(col string, out any) (CellState, error) {
	return Row{Cells: c.Cells}.Value(col, out)
}

// WatchLagError is the error a watcher gets when changes it has not read
// were trimmed from the change log (Config.ChangeLogLimit): it is never
// handed a gap silently. To resume, re-read the table (Scan) and Watch
// again after Resume. Changes committed between Resume and the Scan are
// then delivered again; each carries its clocks, so a change whose clocks
// are not newer than what the reader holds changes nothing.
type WatchLagError struct {
	Schema, Table string
	// After is the sequence the watcher asked to continue after.
	After uint64
	// Oldest is the oldest change still retained (0: none is).
	Oldest uint64
	// Resume is the newest change when the lag was found.
	Resume uint64
}

// Error implements the error interface.
func (e *WatchLagError) Error() string {
	return fmt.Sprintf("runtime: watch %s.%s after change %d: changes up to %d were trimmed (oldest retained %d); re-read the table and watch after %d",
		e.Schema, e.Table, e.After, e.Oldest-1, e.Oldest, e.Resume)
}

// Is makes errors.Is(err, ErrWatchLagged) match.
func (e *WatchLagError) Is(target error) bool { return target == ErrWatchLagged }

// WatchRestoredError is the error a watcher gets when it resumes after a
// change sequence the store never assigned in its current history: the
// store was restored from an older copy (node.db alone, or the whole
// directory), so the changes the watcher saw after Lost.From (and the
// rows they described) are gone from it, and what the watcher holds is
// ahead of the store. Change sequences are never reused: every Open
// continues above every sequence the node may have assigned before — the
// change mark beside node.db and the wall clock in microseconds (see
// Change.Seq) — and records the stretch it skips, so an old position is
// recognized instead of silently naming other changes. To resume,
// re-read the table (Rows) and Watch again after Resume.
type WatchRestoredError struct {
	Schema, Table string
	// After is the sequence the watcher asked to continue after.
	After uint64
	// Lost is the stretch of sequences the store does not hold and
	// After lies in: (Lost.From, Lost.To]. Changes of it the watcher saw
	// came from a history the store no longer has.
	Lost ChangeGap
	// Resume is the newest change the store held when the error was
	// found.
	Resume uint64
}

// ChangeGap is a stretch (From, To] of change sequences the store skipped
// at an Open: numbers a lost history (the part of node.db a restore from
// an older copy dropped) may have assigned, and the store never will.
// The node keeps the newest 1024 stretches; past that the two oldest
// merge, and the merged one also spans old changes of the current
// history (a watcher still there is told to re-read, never misled).
type ChangeGap struct{ From, To uint64 }

// Error implements the error interface.
func (e *WatchRestoredError) Error() string {
	return fmt.Sprintf("runtime: watch %s.%s after change %d: the store never assigned it (restored from a copy that ends at change %d; sequences %d to %d are not in it); re-read the table and watch after %d",
		e.Schema, e.Table, e.After, e.Lost.From, e.Lost.From+1, e.Lost.To, e.Resume)
}

// Is makes errors.Is(err, ErrWatchRestored) match.
func (e *WatchRestoredError) Is(target error) bool { return target == ErrWatchRestored }

// Watch returns the changes of one table's rows with Seq > after, in
// sequence order, local and remote alike: it yields what is already in
// the change log, then waits for more until ctx ends or the node closes.
// The table need not be defined yet (events held for it materialize when
// DefineTable runs, and those are changes too).
//
// The iteration ends after yielding a non-nil error: ctx.Err(), ErrClosed,
// a *WatchLagError (matching ErrWatchLagged) when the watcher fell behind
// the retained log, a *WatchRestoredError (matching ErrWatchRestored)
// when after is a position of a history the store lost to a restore from
// an older copy (node.db alone or the whole directory), ErrWatchAhead
// when after is above every sequence the node skipped or assigned, or a
// storage error. After a lag or restore error, re-read the table and
// watch again after the error's Resume. Breaking out of the
// loop stops the watch. A watcher holds at most one page of changes in
// memory whatever its speed: a slow one falls behind in the persisted log,
// which is bounded, never in a buffer.
//
// After a restart, Watch after the last Seq processed continues without
// loss or duplicates; the sequences jump at the restart (see Change.Seq).
func (n *Node) Watch(ctx context.Context, schema, table string, after uint64) iter.Seq2[Change, error] {
	return func(yield func(Change, error) bool) {
		t := persistence.TableKey{Schema: schema, Table: table}
		for {
			if n.isClosed() {
				yield(Change{}, ErrClosed)
				return
			}
			// Taken before the read: a change committed after the read
			// has closed this channel already.
			wake := n.changes.wait(t)
			var page []persistence.RowChange
			var werr error
			var last uint64
			err := n.store.View(ctx, func(tx persistence.SyncReader) error {
				var oldest, top uint64
				var err error
				if oldest, top, err = tx.ChangeBounds(); err != nil {
					return err
				}
				if after > top {
					werr = fmt.Errorf("%w: after %d, newest is %d", ErrWatchAhead, after, top)
					return nil
				}
				gaps, err := n.changes.readGaps(tx)
				if err != nil {
					return err
				}
				last = changePosition(top, gaps)
				if gap, ok := gapOf(gaps, after); ok {
					werr = &WatchRestoredError{Schema: schema, Table: table, After: after, Lost: gap, Resume: last}
					return nil
				}
				// Lag is judged by this table's own trimmed changes: other
				// tables filling the log do not make its watcher lag.
				trimmed, err := tableTrimmed(tx, t)
				if err != nil {
					return err
				}
				if trimmed > after {
					werr = &WatchLagError{Schema: schema, Table: table, After: after, Oldest: oldest, Resume: last}
					return nil
				}
				return tx.ChangesAfter(t, after, watchPage, func(c persistence.RowChange) (bool, error) {
					page = append(page, c)
					return true, nil
				})
			})
			if err == nil {
				err = werr
			}
			if err != nil {
				if n.isClosed() && !errors.Is(err, ErrWatchLagged) {
					err = ErrClosed
				}
				yield(Change{}, err)
				return
			}
			for _, c := range page {
				after = c.Seq
				if !yield(viewChange(c), nil) {
					return
				}
			}
			if len(page) == watchPage {
				continue
			}
			// The read saw every change of the table up to last: the
			// next read starts there, so a quiet table's watcher never
			// walks the same stretch of other tables' changes twice.
			after = max(after, last)
			select {
			case <-wake:
			case <-ctx.Done():
				yield(Change{}, ctx.Err())
				return
			case <-n.closed:
				yield(Change{}, ErrClosed)
				return
			}
		}
	}
}

// LastChangeSeq returns the newest change sequence (0 if none): Watch
// after it delivers only changes still to come. It is the sequence of a
// change the store assigned, never a number skipped at Open.
func (n *Node) LastChangeSeq(ctx context.Context) (uint64, error) {
	var last uint64
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		last, err = n.changes.lastPosition(tx)
		return err
	})
	return last, err
}

// lastPosition is the newest position a reader is handed (LastChangeSeq,
// a Resume, a LiveSettled): the newest assigned change.
func (f *changeFeed) lastPosition(tx persistence.SyncReader) (uint64, error) {
	_, top, err := tx.ChangeBounds()
	if err != nil {
		return 0, err
	}
	gaps, err := f.readGaps(tx)
	return changePosition(top, gaps), err
}

// changePosition maps the highest sequence reserved (top) to the newest
// one assigned. Right after an Open skipped (From, To], top is To, a
// number no change has; handing it out would name a position inside the
// stretch, which reads as one of a lost history. So it is From, the
// newest change before the skip (or 0).
func changePosition(top uint64, gaps []ChangeGap) uint64 {
	if len(gaps) > 0 && gaps[len(gaps)-1].To == top {
		return gaps[len(gaps)-1].From
	}
	return top
}

func viewChange(c persistence.RowChange) Change {
	out := Change{Seq: c.Seq, Schema: c.Schema, Table: c.Table, Key: c.Key, Exists: c.Exists,
		Existence: c.Existence, Tomb: c.Tomb, Cause: c.Cause, Event: c.Event,
		Cells: make(map[string]Cell, len(c.Cells)+len(c.Cleared))}
	for name, cell := range c.Cells {
		out.Cells[name] = Cell{State: Written, Value: cell.Value, Clock: cell.Clock}
	}
	for _, name := range c.Cleared {
		out.Cells[name] = Cell{State: Cleared, Value: messages.Null, Clock: c.Tomb}
	}
	return out
}

// changeFeed wakes watchers when a transaction added changes, and keeps
// the change mark file ahead of the sequences assigned.
type changeFeed struct {
	mu  sync.Mutex
	chs map[persistence.TableKey]chan struct{} // by table: closed on its next change

	gapCache atomic.Pointer[gapCache]

	markMu   sync.Mutex
	markPath string // "": no mark file (in-memory store)
	noSync   bool
	mark     uint64 // what the file holds: above every sequence assigned
}

// changeMarkLease is how far ahead of the last assigned change sequence
// the mark file is written: one file write per this many changes.
const changeMarkLease = 1 << 16

// markAhead makes sure the mark file is above last before the
// transaction assigning it commits.
func (f *changeFeed) markAhead(last uint64) error {
	f.markMu.Lock()
	defer f.markMu.Unlock()
	if f.markPath == "" || last < f.mark {
		return nil
	}
	return f.writeMarkLocked(last + changeMarkLease)
}

func (f *changeFeed) writeMarkLocked(m uint64) error {
	if err := writeFileAtomic(f.markPath, encodeChangeMark(m), f.noSync); err != nil {
		return fmt.Errorf("runtime: write change mark: %w", err)
	}
	f.mark = m
	return nil
}

// wait returns a channel closed by the next commit that adds a change of
// table t: a watcher of a quiet table is never woken by other tables.
func (f *changeFeed) wait(t persistence.TableKey) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.chs[t]
	if ch == nil {
		if f.chs == nil {
			f.chs = map[persistence.TableKey]chan struct{}{}
		}
		ch = make(chan struct{})
		f.chs[t] = ch
	}
	return ch
}

// notify wakes the watchers of tables.
func (f *changeFeed) notify(tables map[persistence.TableKey]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t := range tables {
		if ch := f.chs[t]; ch != nil {
			close(ch)
			delete(f.chs, t)
		}
	}
}

// wrap returns s with the change log kept to limit entries (trimmed in
// the transaction that added to it) and watchers woken after each commit
// that added changes.
func (f *changeFeed) wrap(s persistence.SyncStore, limit int) persistence.SyncStore {
	if limit <= 0 {
		limit = DefaultChangeLogLimit
	}
	return watchedSync{SyncStore: s, f: f, keep: uint64(limit)}
}

type watchedSync struct {
	persistence.SyncStore
	f    *changeFeed
	keep uint64
}

// Meta keys of the change log's bookkeeping (plain meta values: no layout
// change; a store without them reads as "nothing recorded").
const (
	// metaChangeTrimFloor: every table may have lost changes at or below
	// it (the log was trimmed before per-table marks were kept).
	metaChangeTrimFloor = "change_trim_floor"
	// metaChangeTrimPrefix + schema + "\x00" + table: the highest
	// sequence of that table's changes trimmed.
	metaChangeTrimPrefix = "change_trim/"
	// metaChangeGaps: the stretches of sequences skipped at Opens
	// (From, To big endian, oldest first).
	metaChangeGaps = "change_gaps"
	// maxChangeGaps bounds metaChangeGaps (16 KiB); past it the two
	// oldest merge (addGap).
	maxChangeGaps = 1024
)

func trimKey(t persistence.TableKey) string {
	return metaChangeTrimPrefix + t.Schema + "\x00" + t.Table
}

func metaU64(tx persistence.SyncReader, key string) (uint64, error) {
	v, ok, err := tx.Meta(key)
	if err != nil || !ok {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("runtime: meta %s of %d bytes: %w", key, len(v), persistence.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), nil
}

// tableTrimmed is the highest sequence at or below which table t may have
// lost changes to trimming.
func tableTrimmed(tx persistence.SyncReader, t persistence.TableKey) (uint64, error) {
	floor, err := metaU64(tx, metaChangeTrimFloor)
	if err != nil {
		return 0, err
	}
	mark, err := metaU64(tx, trimKey(t))
	return max(floor, mark), err
}

// readGaps reads the stretches skipped at Opens, oldest first: disjoint,
// each above the one before.
func readGaps(tx persistence.SyncReader) ([]ChangeGap, error) {
	v, _, err := tx.Meta(metaChangeGaps)
	if err != nil {
		return nil, err
	}
	return decodeGaps(v)
}

// gapCache is the last stretch list decoded, by its stored bytes.
type gapCache struct {
	raw  []byte
	gaps []ChangeGap // read only
}

// readGaps is readGaps for the readers and writers of a running node:
// the list changes only at Open, so each read compares the stored bytes
// with the last decoded ones (up to 16 KiB) instead of decoding them
// again on every commit and every watcher's read.
func (f *changeFeed) readGaps(tx persistence.SyncReader) ([]ChangeGap, error) {
	v, _, err := tx.Meta(metaChangeGaps)
	if err != nil {
		return nil, err
	}
	if c := f.gapCache.Load(); c != nil && bytes.Equal(c.raw, v) {
		return c.gaps, nil
	}
	gaps, err := decodeGaps(v)
	if err != nil {
		return nil, err
	}
	f.gapCache.Store(&gapCache{raw: bytes.Clone(v), gaps: gaps})
	return gaps, nil
}

func decodeGaps(v []byte) ([]ChangeGap, error) {
	if len(v)%16 != 0 || len(v) > 16*maxChangeGaps {
		return nil, fmt.Errorf("runtime: meta %s of %d bytes: %w", metaChangeGaps, len(v), persistence.ErrCorrupt)
	}
	gaps := make([]ChangeGap, 0, len(v)/16)
	for i := 0; i < len(v); i += 16 {
		g := ChangeGap{From: binary.BigEndian.Uint64(v[i:]), To: binary.BigEndian.Uint64(v[i+8:])}
		if g.From >= g.To || (len(gaps) > 0 && g.From < gaps[len(gaps)-1].To) {
			return nil, fmt.Errorf("runtime: meta %s: stretch (%d, %d] out of order: %w", metaChangeGaps, g.From, g.To, persistence.ErrCorrupt)
		}
		gaps = append(gaps, g)
	}
	return gaps, nil
}

func encodeGaps(gaps []ChangeGap) []byte {
	v := make([]byte, 0, 16*len(gaps))
	for _, g := range gaps {
		v = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(v, g.From), g.To)
	}
	return v
}

// addGap records the stretch g skipped at an Open (g.From is the highest
// sequence reserved before it, so at or above every recorded stretch).
// A stretch that starts where the newest ends (no change in between)
// extends it. Past maxChangeGaps the two oldest merge: the positions
// between them (changes assigned long ago) then read as lost too, which
// costs a watcher holding one a re-read, never a silent reuse.
func addGap(gaps []ChangeGap, g ChangeGap) []ChangeGap {
	gaps = slices.Clone(gaps)
	if n := len(gaps); n > 0 && gaps[n-1].To >= g.From {
		gaps[n-1].To = max(gaps[n-1].To, g.To)
		return gaps
	}
	gaps = append(gaps, g)
	if len(gaps) > maxChangeGaps {
		gaps[1].From = gaps[0].From
		gaps = gaps[1:]
	}
	return gaps
}

// trimWindow is how many sequence numbers, counting down from last, hold
// the newest keep changes: TrimChanges keeps a window of numbers, and the
// stretches skipped at Opens hold none. Between two stretches every number
// was assigned. The oldest stretch of a full list may be two merged ones
// (addGap) spanning assigned numbers, so it counts as assigned: the
// window is then smaller, never larger, and the log never holds more than
// keep changes.
func trimWindow(gaps []ChangeGap, last, keep uint64) uint64 {
	need, hi := keep, last
	for i := len(gaps) - 1; i >= 0; i-- {
		g := gaps[i]
		if i == 0 && len(gaps) == maxChangeGaps {
			break
		}
		n := hi - g.To
		if n >= need {
			break
		}
		need, hi = need-n, g.From
	}
	if hi < need {
		return last // everything
	}
	return last - (hi - need)
}

// gapOf reports the skipped stretch after lies in, if any.
func gapOf(gaps []ChangeGap, after uint64) (ChangeGap, bool) {
	for _, g := range gaps {
		if after > g.From && after <= g.To {
			return g, true
		}
	}
	return ChangeGap{}, false
}

// restoredGap reports the skipped stretch after lies in, if any.
func (f *changeFeed) restoredGap(tx persistence.SyncReader, after uint64) (ChangeGap, bool, error) {
	gaps, err := f.readGaps(tx)
	if err != nil {
		return ChangeGap{}, false, err
	}
	g, ok := gapOf(gaps, after)
	return g, ok, nil
}

func (s watchedSync) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	var tables map[persistence.TableKey]bool
	err := s.SyncStore.Update(ctx, func(tx persistence.SyncTx) error {
		_, before, err := tx.ChangeBounds()
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		_, last, err := tx.ChangeBounds()
		if err != nil || last == before {
			return err
		}
		if err := s.f.markAhead(last); err != nil {
			return err
		}
		// The entries this transaction added, keys only: which tables'
		// watchers to wake. (Always: a watcher may begin waiting before
		// this commit and after any check made here.)
		tables = map[persistence.TableKey]bool{}
		if err := tx.ChangeTablesAfter(before, func(t persistence.TableKey, _ uint64) bool {
			tables[t] = true
			return true
		}); err != nil {
			return err
		}
		gaps, err := s.f.readGaps(tx)
		if err != nil {
			return err
		}
		marks := map[persistence.TableKey]uint64{}
		if _, err = tx.TrimChanges(trimWindow(gaps, last, s.keep), func(t persistence.TableKey, seq uint64) { marks[t] = seq }); err != nil {
			return err
		}
		for t, seq := range marks {
			if err := tx.PutMeta(trimKey(t), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && len(tables) > 0 {
		s.f.notify(tables)
	}
	return err
}
