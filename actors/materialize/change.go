package materialize

import (
	"slices"
	"sort"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Change returns what one write did to a row: the state after it and the
// cells whose value or clock changed (Cells) or that went away (Cleared).
// ok is false when next stores exactly what prev did, which is not a
// change (a duplicate, a losing write): the change log records only what
// a reader of the row could see differently (persistence.RowChange).
// cause and by say what made the change (by: the event's clock).
func Change(prev, next persistence.Row, cause persistence.ChangeCause, by messages.Clock) (persistence.RowChange, bool) {
	ch := persistence.RowChange{
		Schema: next.Schema, Table: next.Table, Key: next.Key,
		Exists: next.Exists, Existence: next.Existence, Tomb: next.Tomb,
		Cause: cause, Event: by,
	}
	changed := prev.Exists != next.Exists || prev.Existence != next.Existence || prev.Tomb != next.Tomb
	for name, c := range next.Cells {
		if p, had := prev.Cells[name]; had && p.Clock == c.Clock && p.Value.Equal(c.Value) {
			continue
		}
		if ch.Cells == nil {
			ch.Cells = make(map[string]persistence.Cell, len(next.Cells))
		}
		ch.Cells[name] = persistence.Cell{Value: c.Value.Clone(), Clock: c.Clock}
	}
	for name := range prev.Cells {
		if _, has := next.Cells[name]; !has {
			ch.Cleared = append(ch.Cleared, name)
		}
	}
	sort.Strings(ch.Cleared)
	if !changed && ch.Cells == nil && ch.Cleared == nil {
		return persistence.RowChange{}, false
	}
	return ch, true
}

// Snapshot copies what Change compares of row (its scalars and its cells
// map; values are immutable once stored), for a caller about to hand row
// to ApplyOwned, which updates the cells in place.
func Snapshot(row persistence.Row) persistence.Row {
	out := row
	if row.Cells != nil {
		out.Cells = make(map[string]persistence.Cell, len(row.Cells))
		for k, v := range row.Cells {
			out.Cells[k] = v
		}
	}
	return out
}

// ApplyChange is ApplyOwned that also returns the change it made, as
// Change(prev, next, cause, e.ClockOf(id)) would for the row before and
// after, without copying the row first: the application records the
// cells it writes (each write beats the cell's clock, so it is a change)
// and clears. The apply path calls it once per event in the single
// writer, where the copy and the comparison of every cell cost more than
// the application.
//
// Unlike Apply and Change, the row and the change share the values of e
// and of the log's events instead of copying them: values are immutable
// once decoded, and the caller stores the row and the change (a store
// copies what it is given) and drops them. When the event wrote every
// cell of the row, the change's Cells is the row's own map.
func ApplyChange(def persistence.TableDef, horizon messages.HLC, row persistence.Row, id messages.EventID, e *messages.Event, log Log, cause persistence.ChangeCause) (persistence.Row, Effects, persistence.RowChange, bool, error) {
	prevExists, prevExistence, prevTomb := row.Exists, row.Existence, row.Tomb
	var tr tracker
	next, fx, err := applyOwned(def, horizon, row, id, e, log, &tr)
	if err != nil {
		return persistence.Row{}, Effects{}, persistence.RowChange{}, false, err
	}
	ch := persistence.RowChange{
		Schema: next.Schema, Table: next.Table, Key: next.Key,
		Exists: next.Exists, Existence: next.Existence, Tomb: next.Tomb,
		Cause: cause, Event: e.ClockOf(id),
	}
	changed := prevExists != next.Exists || prevExistence != next.Existence || prevTomb != next.Tomb
	inline, more := tr.written()
	switch {
	case len(inline) == 0:
	case !fx.Resurrected && len(inline)+len(more) == len(next.Cells):
		// Every cell of the row was written (each once: without a rebuild
		// a name is written at most once): the change's cells are the
		// row's, shared like the values.
		ch.Cells = next.Cells
	default:
		ch.Cells = make(map[string]persistence.Cell, len(inline)+len(more))
		for _, names := range [2][]string{inline, more} {
			for _, name := range names {
				// A cell written twice (by the payload, then by a rebuild)
				// is recorded with its final state.
				ch.Cells[name] = next.Cells[name]
			}
		}
	}
	if len(tr.cleared) > 0 {
		ch.Cleared = slices.Clone(tr.cleared)
		sort.Strings(ch.Cleared)
	}
	if !changed && ch.Cells == nil && ch.Cleared == nil {
		return next, fx, persistence.RowChange{}, false, nil
	}
	return next, fx, ch, true, nil
}
