package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"sync"

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
	// tables and never reused, across restarts too. Resume a watch after
	// the last Seq you processed.
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
// change sequence that node.db no longer holds because it was restored
// from an older copy: the changes from Lost.From+1 to After (and the rows
// they described) are gone from the store, so what the watcher holds is
// ahead of it. Change sequences are never reused: after such a restore
// the node continues above every sequence it assigned before (kept in
// changes.mark beside node.db), so an old position is recognized instead
// of silently naming other changes. To resume, re-read the table (Scan)
// and Watch again after Resume.
type WatchRestoredError struct {
	Schema, Table string
	// After is the sequence the watcher asked to continue after.
	After uint64
	// Lost is the stretch of sequences the restored store does not hold:
	// (Lost.From, Lost.To].
	Lost ChangeGap
	// Resume is the newest change when the restore was found.
	Resume uint64
}

// ChangeGap is a stretch (From, To] of change sequences assigned before a
// restore of node.db from an older copy and not held by the copy.
type ChangeGap struct{ From, To uint64 }

// Error implements the error interface.
func (e *WatchRestoredError) Error() string {
	return fmt.Sprintf("runtime: watch %s.%s after change %d: node.db was restored from a copy that ends at change %d (changes %d to %d are gone); re-read the table and watch after %d",
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
// the retained log, ErrWatchAhead, or a storage error. Breaking out of the
// loop stops the watch. A watcher holds at most one page of changes in
// memory whatever its speed: a slow one falls behind in the persisted log,
// which is bounded, never in a buffer.
//
// After a restart, Watch after the last Seq processed continues without
// loss or duplicates.
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
				var oldest uint64
				var err error
				if oldest, last, err = tx.ChangeBounds(); err != nil {
					return err
				}
				if after > last {
					werr = fmt.Errorf("%w: after %d, newest is %d", ErrWatchAhead, after, last)
					return nil
				}
				if gap, ok, err := restoredGap(tx, after); err != nil || ok {
					if ok {
						werr = &WatchRestoredError{Schema: schema, Table: table, After: after, Lost: gap, Resume: last}
					}
					return err
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
// after it delivers only changes still to come.
func (n *Node) LastChangeSeq(ctx context.Context) (uint64, error) {
	var last uint64
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		_, last, err = tx.ChangeBounds()
		return err
	})
	return last, err
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
	// metaChangeGaps: the stretches of sequences lost to restores.
	metaChangeGaps = "change_gaps"
	// maxChangeGaps bounds metaChangeGaps; the oldest go first.
	maxChangeGaps = 64
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

func readGaps(tx persistence.SyncReader) ([]ChangeGap, error) {
	v, _, err := tx.Meta(metaChangeGaps)
	if err != nil {
		return nil, err
	}
	if len(v)%16 != 0 {
		return nil, fmt.Errorf("runtime: meta %s of %d bytes: %w", metaChangeGaps, len(v), persistence.ErrCorrupt)
	}
	gaps := make([]ChangeGap, 0, len(v)/16)
	for i := 0; i < len(v); i += 16 {
		gaps = append(gaps, ChangeGap{From: binary.BigEndian.Uint64(v[i:]), To: binary.BigEndian.Uint64(v[i+8:])})
	}
	return gaps, nil
}

// restoredGap reports the restore gap after lies in, if any.
func restoredGap(tx persistence.SyncReader, after uint64) (ChangeGap, bool, error) {
	gaps, err := readGaps(tx)
	for _, g := range gaps {
		if after > g.From && after <= g.To {
			return g, true, err
		}
	}
	return ChangeGap{}, false, err
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
		marks := map[persistence.TableKey]uint64{}
		if _, err = tx.TrimChanges(s.keep, func(t persistence.TableKey, seq uint64) { marks[t] = seq }); err != nil {
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
