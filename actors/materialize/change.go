package materialize

import (
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
