// Package materialize is the deterministic core of SSP/1 §13: pure
// functions from (table definition, horizon, row state, event) to the new
// row state and the effects to surface. It does no I/O; the sync-group
// actor runs it inside one storage transaction and publishes the effects
// after the transaction is durable.
//
// The state it produces is a pure function of the delivered event set, the
// table's columns and the eviction horizon (SSP/1 §13.5): per-column
// last-writer-wins bounded by the tombstone clock, existence by the
// highest existence event, and deletes that clear every column they beat.
//
// Every comparison is on the full clock (HLC, site, event id): the id
// settles two distinct events one site signed with one HLC, which SSP/1
// §13.5 forbids but a hostile site can send. Without it the first of the
// two to arrive would win and two nodes holding the same events would
// disagree for good: a site that reused an HLC would fork the mesh.
package materialize

import (
	"fmt"
	"slices"
	"sort"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Effects are what one application of an event surfaces.
type Effects struct {
	// Resurrected: the event was an upsert that brought a tombstoned row back.
	Resurrected bool
	// Partial: the resurrection rebuild was partial (tomb below horizon).
	Partial bool
	// Tomb is the row's tombstone clock at the resurrection.
	Tomb messages.Clock
	// Ignored lists payload columns the table does not have, sorted.
	Ignored []string
}

// ResolveKey checks that key resolves as a whole against def: every column
// it names is a key column of the table and every key column is present
// (SSP/1 §13.6: no prefix match).
func ResolveKey(def persistence.TableDef, key messages.Columns) error {
	if len(key) == 0 {
		return messages.ErrEmptyRowKey
	}
	if resolves(def.KeyColumns, key) {
		return nil
	}
	for name := range key {
		if !contains(def.KeyColumns, name) {
			return fmt.Errorf("%w: %q", ErrUnknownKeyColumn, name)
		}
	}
	for _, name := range def.KeyColumns {
		if _, ok := key[name]; !ok {
			return fmt.Errorf("%w: %q", ErrIncompleteKey, name)
		}
	}
	return nil
}

// resolves is ResolveKey's verdict for the common case without ranging
// over key (it runs once per applied event): key is not empty and has as
// many columns as the table has key columns, all different, and each of them is in key,
// so key names no other. Any other case is left to the full check, which
// also says why a key does not resolve.
func resolves(cols []string, key messages.Columns) bool {
	if len(key) == 0 || len(key) != len(cols) {
		return false
	}
	for i, name := range cols {
		if _, ok := key[name]; !ok || slices.Contains(cols[:i], name) {
			return false
		}
	}
	return true
}

// Log yields the retained events of one row (any order), each with its
// event id. A rebuild feeds it only events at or above the horizon,
// whatever else is still stored (SSP/1 §13.4: eviction is lazy, the
// horizon is what counts).
type Log func(yield func(id messages.EventID, e *messages.Event) error) error

// Apply materializes one event, whose id is id, into row. The caller has
// resolved the key (ResolveKey) and handled events below the horizon (they
// write nothing). row is the zero Row when the row has no state yet. log
// must include e itself when it is an upsert (the caller appends before
// applying).
func Apply(def persistence.TableDef, horizon messages.HLC, row persistence.Row, id messages.EventID, e *messages.Event, log Log) (persistence.Row, Effects, error) {
	return ApplyOwned(def, horizon, clone(row), id, e, log)
}

// ApplyOwned is Apply for a caller that hands over row (a fresh copy read
// from storage): it updates row's cells in place instead of copying them.
func ApplyOwned(def persistence.TableDef, horizon messages.HLC, row persistence.Row, id messages.EventID, e *messages.Event, log Log) (persistence.Row, Effects, error) {
	return applyOwned(def, horizon, row, id, e, log, nil)
}

// applyOwned is ApplyOwned that records in tr (when not nil) the cells it
// wrote and cleared.
func applyOwned(def persistence.TableDef, horizon messages.HLC, row persistence.Row, id messages.EventID, e *messages.Event, log Log, tr *tracker) (persistence.Row, Effects, error) {
	if row.Cells == nil {
		row.Cells = make(map[string]persistence.Cell)
	}
	row.Schema, row.Table = def.Schema, def.Table
	if row.Key == nil {
		row.Key = e.Key
	}
	c := e.ClockOf(id)
	var fx Effects
	if e.Delete {
		applyDelete(def, &row, c, tr)
		return row, fx, nil
	}

	// §13.2: existence by the highest existence event.
	if c.Beats(row.Existence) {
		wasTombstoned := !row.Exists && !row.Existence.IsZero()
		row.Existence = c
		row.Exists = true
		if wasTombstoned {
			fx.Resurrected = true
			fx.Tomb = row.Tomb
		}
	}
	// §13.1: per-column LWW bounded by the tombstone clock; a losing write
	// leaves the clock untouched.
	for name, v := range e.Payload {
		if !contains(def.Columns, name) {
			fx.Ignored = append(fx.Ignored, name)
			continue
		}
		writeIfBeats(&row, name, v, c, tr)
	}
	sort.Strings(fx.Ignored)

	if fx.Resurrected {
		// §13.4: rebuild the row's columns from the retained log.
		if err := rebuild(def, horizon, &row, def.Columns, log, tr); err != nil {
			return persistence.Row{}, Effects{}, err
		}
		fx.Partial = row.Tomb.HLC < horizon
	}
	return row, fx, nil
}

// applyDelete implements §13.2 and §13.3 for a delete, winning or losing.
func applyDelete(def persistence.TableDef, row *persistence.Row, c messages.Clock, tr *tracker) {
	if c.Beats(row.Existence) {
		row.Existence = c
		row.Exists = false
	}
	if c.Beats(row.Tomb) {
		row.Tomb = c
	}
	// §13.3: clear every column whose clock the delete beats. The stored
	// form of "cleared" is an absent cell under a non-zero tombstone clock:
	// readers see it as null at the tombstone clock (View). Keeping only
	// cells that beat the tombstone makes the stored row canonical, so two
	// nodes holding the same events hold the same bytes, and leaves the
	// tombstone clock as the one bound that rejects a late write below it.
	for name, cell := range row.Cells {
		if c.Beats(cell.Clock) {
			delete(row.Cells, name)
			tr.clear(name)
		}
	}
}

func writeIfBeats(row *persistence.Row, name string, v messages.Value, c messages.Clock, tr *tracker) bool {
	if !c.Beats(row.Cells[name].Clock) || !c.Beats(row.Tomb) {
		return false
	}
	if tr == nil {
		v = v.Clone()
	} // else ApplyChange: the row shares the event's values (ApplyChange)
	row.Cells[name] = persistence.Cell{Value: v, Clock: c}
	tr.write(name)
	return true
}

// tracker records the cells one application wrote and cleared, so its
// change (ApplyChange) needs no copy of the row from before it. A nil
// tracker records nothing.
type tracker struct {
	n       int
	inline  [8]string // the first names written: no allocation for most events
	more    []string
	cleared []string
}

func (tr *tracker) write(name string) {
	switch {
	case tr == nil:
	case tr.n < len(tr.inline):
		tr.inline[tr.n] = name
		tr.n++
	default:
		tr.more = append(tr.more, name)
	}
}

// written returns the names written (the inline ones, then the rest).
func (tr *tracker) written() (inline []string, more []string) { return tr.inline[:tr.n], tr.more }

func (tr *tracker) clear(name string) {
	if tr != nil {
		tr.cleared = append(tr.cleared, name)
	}
}

// rebuild sets each of columns to the highest-clock retained upsert that
// carries it, beats the tombstone clock and is not below the horizon
// (SSP/1 §13.4, §13.6). Columns with no such candidate keep their state:
// a column the delete cleared stays null, which is how a partial rebuild
// "comes back null".
func rebuild(def persistence.TableDef, horizon messages.HLC, row *persistence.Row, columns []string, log Log, tr *tracker) error {
	if log == nil {
		return nil
	}
	type cand struct {
		v messages.Value
		c messages.Clock
	}
	best := make(map[string]cand, len(columns))
	// The callback captures the tombstone clock, not row: a captured row
	// would move every caller's row to the heap (applyOwned runs once per
	// applied event, and rebuilds only on a resurrection).
	tomb := row.Tomb
	err := log(func(id messages.EventID, e *messages.Event) error {
		if e.Delete || e.HLC < horizon {
			return nil
		}
		c := e.ClockOf(id)
		if !c.Beats(tomb) {
			return nil
		}
		for _, name := range columns {
			v, ok := e.Payload[name]
			if !ok {
				continue
			}
			if b, seen := best[name]; !seen || c.Beats(b.c) {
				best[name] = cand{v, c}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("materialize: rebuild: %w", err)
	}
	for name, b := range best {
		writeIfBeats(row, name, b.v, b.c, tr)
	}
	return nil
}

// AddColumn materializes a newly added column of one row from the retained
// log (SSP/1 §13.6) by the resurrection rebuild procedure: the highest-clock
// upsert carrying it that beats the tombstone clock and is not below the
// horizon. Without one the column reads as cleared (a tombstoned row) or
// unmaterialized, exactly as on a node that always had it.
func AddColumn(def persistence.TableDef, horizon messages.HLC, row persistence.Row, column string, log Log) (persistence.Row, bool, error) {
	row = clone(row)
	if row.Cells == nil {
		row.Cells = make(map[string]persistence.Cell)
	}
	before, had := row.Cells[column]
	if err := rebuild(def, horizon, &row, []string{column}, log, nil); err != nil {
		return persistence.Row{}, false, err
	}
	after, has := row.Cells[column]
	changed := had != has || !after.Value.Equal(before.Value) || after.Clock != before.Clock
	return row, changed, nil
}

// CellState says what a reader sees in a column.
type CellState uint8

// Cell states. Unmaterialized is not a null (SSP/1 §13.6).
const (
	// Unmaterialized: no event ever wrote the column here and no delete
	// cleared it; it has no clock. Not a default, not a zero, not a null.
	Unmaterialized CellState = iota
	// Written: an upsert wrote the value (possibly an explicit null) at Clock.
	Written
	// Cleared: a delete cleared the column; the value is null and Clock is
	// the row's tombstone clock.
	Cleared
)

// String returns a readable form of the CellState.
func (s CellState) String() string {
	switch s {
	case Written:
		return "written"
	case Cleared:
		return "cleared"
	}
	return "unmaterialized"
}

// ViewCell is one column as a reader sees it.
type ViewCell struct {
	State CellState
	Value messages.Value // nil when Unmaterialized; messages.Null when Cleared
	Clock messages.Clock // zero when Unmaterialized
}

// View returns what a reader sees in each of def's value columns of row.
// It is a pure function of the stored row, so two nodes with the same
// events and schema present the same view.
func View(def persistence.TableDef, row persistence.Row) map[string]ViewCell {
	out := make(map[string]ViewCell, len(def.Columns))
	for _, name := range def.Columns {
		out[name] = ViewOf(row, name)
	}
	return out
}

// ViewOf returns what a reader sees in one column of row.
func ViewOf(row persistence.Row, name string) ViewCell {
	if c, ok := row.Cells[name]; ok {
		return ViewCell{State: Written, Value: c.Value, Clock: c.Clock}
	}
	if !row.Tomb.IsZero() {
		return ViewCell{State: Cleared, Value: messages.Null, Clock: row.Tomb}
	}
	return ViewCell{}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func clone(r persistence.Row) persistence.Row {
	out := r
	if r.Cells != nil {
		out.Cells = make(map[string]persistence.Cell, len(r.Cells))
		for k, v := range r.Cells {
			out.Cells[k] = v
		}
	}
	return out
}
