package materialize

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// benchRow and benchEvent are the apply benchmark's shape: a row of two
// columns rewritten by an upsert of both.
func benchInputs() (persistence.Row, *messages.Event, messages.EventID) {
	def := propDef
	row := persistence.Row{Schema: def.Schema, Table: def.Table, Key: messages.Columns{"id": messages.MustValue(1)}, Exists: true,
		Existence: messages.Clock{HLC: 1, Site: sites[0]}, Cells: map[string]persistence.Cell{
			"a": {Value: messages.MustValue(1), Clock: messages.Clock{HLC: 1, Site: sites[0]}},
			"b": {Value: messages.MustValue(2), Clock: messages.Clock{HLC: 1, Site: sites[0]}},
		}}
	e := &messages.Event{Site: sites[1], HLC: 5, Schema: def.Schema, Table: def.Table, Key: row.Key,
		Payload: messages.Columns{"a": messages.MustValue(3), "b": messages.MustValue(4)}}
	return row, e, idOf(e)
}

func BenchmarkApplyThenChange(b *testing.B) {
	row, e, id := benchInputs()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := clone(row)
		prev := Snapshot(r)
		nr, _, _ := ApplyOwned(propDef, 0, r, id, e, nil)
		Change(prev, nr, persistence.CauseEvent, e.ClockOf(id))
	}
}

func BenchmarkApplyChange(b *testing.B) {
	row, e, id := benchInputs()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := clone(row)
		ApplyChange(propDef, 0, r, id, e, nil, persistence.CauseEvent)
	}
}
