package materialize

import (
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestChangeTable pins what counts as a change (persistence.RowChange).
func TestChangeTable(t *testing.T) {
	c1 := messages.Clock{HLC: 1, Site: messages.SiteID{1}}
	c2 := messages.Clock{HLC: 2, Site: messages.SiteID{1}}
	v := func(s string) messages.Value { return messages.MustValue(s) }
	base := persistence.Row{Schema: "s", Table: "t", Key: messages.Columns{"id": v("k")}, Exists: true, Existence: c1,
		Cells: map[string]persistence.Cell{"a": {Value: v("x"), Clock: c1}, "b": {Value: v("y"), Clock: c1}}}
	with := func(f func(r *persistence.Row)) persistence.Row {
		r := Snapshot(base)
		f(&r)
		return r
	}
	tests := []struct {
		name    string
		next    persistence.Row
		changed bool
		cells   []string
		cleared []string
	}{
		{"identical row: none", with(func(*persistence.Row) {}), false, nil, nil},
		{"a cell's value", with(func(r *persistence.Row) { r.Cells["a"] = persistence.Cell{Value: v("z"), Clock: c2} }), true, []string{"a"}, nil},
		{"a cell's clock only", with(func(r *persistence.Row) { r.Cells["b"] = persistence.Cell{Value: v("y"), Clock: c2} }), true, []string{"b"}, nil},
		{"a new cell", with(func(r *persistence.Row) { r.Cells["c"] = persistence.Cell{Value: messages.Null, Clock: c2} }), true, []string{"c"}, nil},
		{"existence clock only", with(func(r *persistence.Row) { r.Existence = c2 }), true, nil, nil},
		{"delete clears cells", with(func(r *persistence.Row) {
			r.Exists, r.Existence, r.Tomb = false, c2, c2
			delete(r.Cells, "a")
			delete(r.Cells, "b")
		}), true, nil, []string{"a", "b"}},
		{"tomb only", with(func(r *persistence.Row) { r.Tomb = c1 }), true, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch, ok := Change(base, tc.next, persistence.CauseEvent, c2)
			if ok != tc.changed {
				t.Fatalf("changed = %v, want %v", ok, tc.changed)
			}
			if !ok {
				return
			}
			var cells []string
			for n, c := range ch.Cells {
				if c.Clock != tc.next.Cells[n].Clock || !c.Value.Equal(tc.next.Cells[n].Value) {
					t.Fatalf("cell %s = %+v, want the new state %+v", n, c, tc.next.Cells[n])
				}
				cells = append(cells, n)
			}
			slices.Sort(cells)
			if !slices.Equal(cells, tc.cells) || !slices.Equal(ch.Cleared, tc.cleared) {
				t.Fatalf("cells %v cleared %v; want %v, %v", cells, ch.Cleared, tc.cells, tc.cleared)
			}
			if ch.Exists != tc.next.Exists || ch.Existence != tc.next.Existence || ch.Tomb != tc.next.Tomb || ch.Event != c2 || ch.Cause != persistence.CauseEvent {
				t.Fatalf("row state or cause not the new one: %+v", ch)
			}
		})
	}
}

// ApplyChange returns the row ApplyOwned returns and the change Change
// computes from a copy of the row taken before — for every event of random
// deliveries (upserts, deletes, resurrections with rebuilds, duplicates,
// losing writes, unknown columns), at horizon zero and above it.
func TestApplyChangeEqualsChangeOfASnapshot(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs := genEvents(t)
		horizon := messages.HLC(rapid.IntRange(0, 10).Draw(t, "horizon"))
		log := map[string][]*messages.Event{}
		rows := map[string]persistence.Row{}
		changes, applied := 0, 0
		for _, e := range deliver(t, evs, "d") {
			if e.HLC < horizon {
				continue
			}
			applied++
			id := idOf(e)
			k := string(e.RowKey())
			log[k] = append(log[k], e)
			rowLog := func(yield func(messages.EventID, *messages.Event) error) error {
				for _, le := range log[k] {
					if err := yield(idOf(le), le); err != nil {
						return err
					}
				}
				return nil
			}
			prev := rows[k]
			snap := Snapshot(prev)
			want, wantFx, err := ApplyOwned(propDef, horizon, clone(prev), id, e, rowLog)
			if err != nil {
				t.Fatal(err)
			}
			wantCh, wantOK := Change(snap, want, persistence.CauseEvent, e.ClockOf(id))
			got, gotFx, gotCh, gotOK, err := ApplyChange(propDef, horizon, clone(prev), id, e, rowLog, persistence.CauseEvent)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotFx, wantFx) {
				t.Fatalf("event %v: ApplyChange's row or effects differ from ApplyOwned's:\n%+v\n%+v", e, got, want)
			}
			if gotOK != wantOK || !reflect.DeepEqual(gotCh, wantCh) {
				t.Fatalf("event %v: change %v %+v, Change of a snapshot gives %v %+v", e, gotOK, gotCh, wantOK, wantCh)
			}
			if gotOK {
				changes++
			}
			rows[k] = got
		}
		if applied > 0 && changes == 0 {
			t.Fatalf("no event of %d applied changed a row", applied)
		}
	})
}
