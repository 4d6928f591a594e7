package materialize

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var def = persistence.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}

func up(site byte, h messages.HLC, cols map[string]any) *messages.Event {
	p := messages.Columns{}
	for k, v := range cols {
		p[k] = messages.MustValue(v)
	}
	return &messages.Event{Site: messages.SiteID{site}, HLC: h, Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}, Payload: p}
}

func del(site byte, h messages.HLC) *messages.Event {
	return &messages.Event{Site: messages.SiteID{site}, HLC: h, Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}, Delete: true}
}

// idOf gives a test event an id derived from its content, as the BLAKE3
// of its signed bytes is: distinct events, distinct ids.
func idOf(e *messages.Event) messages.EventID {
	b, err := messages.EncodeEvent(e)
	if err != nil {
		panic(err)
	}
	return eventid.Of(b)
}

func logOf(evs ...*messages.Event) Log {
	return func(yield func(messages.EventID, *messages.Event) error) error {
		for _, e := range evs {
			if err := yield(idOf(e), e); err != nil {
				return err
			}
		}
		return nil
	}
}

func mustApply(t *testing.T, h messages.HLC, row persistence.Row, e *messages.Event, log Log) (persistence.Row, Effects) {
	t.Helper()
	r, fx, err := Apply(def, h, row, idOf(e), e, log)
	if err != nil {
		t.Fatal(err)
	}
	return r, fx
}

// §13.4: eviction is lazy, so a receiver often still stores events below
// its horizon; a rebuild must never read them.
func TestRebuildIgnoresStoredEventsBelowHorizon(t *testing.T) {
	var row persistence.Row
	row, _ = mustApply(t, 0, row, del(1, 10), nil)
	below := up(2, 15, map[string]any{"a": "below-horizon"}) // beats the tomb, below the horizon
	res := up(1, 30, map[string]any{"b": "resurrect"})
	row, fx := mustApply(t, 20, row, res, logOf(below, res))
	if !fx.Resurrected || !fx.Partial {
		t.Fatalf("effects %+v: want a partial resurrection (tomb 10 < horizon 20)", fx)
	}
	if v := ViewOf(row, "a"); v.State != Cleared {
		t.Fatalf("a = %+v: an event below the horizon fed the rebuild", v)
	}
	// With the horizon at zero the same log restores it: the rule, not the bytes, decides.
	var row0 persistence.Row
	row0, _ = mustApply(t, 0, row0, del(1, 10), nil)
	row0, fx = mustApply(t, 0, row0, res, logOf(below, res))
	if fx.Partial {
		t.Fatal("complete rebuild reported partial")
	}
	if v := ViewOf(row0, "b"); v.State != Written {
		t.Fatalf("b = %+v", v)
	}
}

// §13.4: the rebuild takes, per column, the highest upsert that carries it
// and beats the tombstone clock — restoring a write that arrived while the
// row was absent from a store that skipped it (simulated by a log holding
// an upsert the row state never saw).
func TestRebuildRestoresHighestCandidatePerColumn(t *testing.T) {
	var row persistence.Row
	row, _ = mustApply(t, 0, row, del(1, 10), nil)
	lost := up(2, 12, map[string]any{"a": "restored"})
	older := up(3, 11, map[string]any{"a": "older"})
	stale := up(3, 9, map[string]any{"a": "below-tomb"})
	res := up(1, 13, map[string]any{"b": "x"})
	row, fx := mustApply(t, 0, row, res, logOf(stale, older, lost, res))
	if !fx.Resurrected || fx.Partial {
		t.Fatalf("%+v", fx)
	}
	v := ViewOf(row, "a")
	if v.State != Written || !v.Value.Equal(messages.MustValue("restored")) || v.Clock.HLC != 12 {
		t.Fatalf("a = %+v", v)
	}
}

func TestResolveKey(t *testing.T) {
	two := persistence.TableDef{KeyColumns: []string{"x", "y"}}
	v := messages.MustValue(1)
	for _, c := range []struct {
		key  messages.Columns
		want error
	}{
		{messages.Columns{"x": v, "y": v}, nil},
		{messages.Columns{"x": v}, ErrIncompleteKey},
		{messages.Columns{"x": v, "y": v, "z": v}, ErrUnknownKeyColumn},
		{messages.Columns{"z": v}, ErrUnknownKeyColumn},
		{messages.Columns{}, messages.ErrEmptyRowKey},
	} {
		if err := ResolveKey(two, c.key); !errors.Is(err, c.want) && !(err == nil && c.want == nil) {
			t.Errorf("%v: got %v want %v", c.key.Names(), err, c.want)
		}
	}
}

// §13.1: a rejected write leaves the clock untouched; §13.3: a losing
// delete clears the columns it beats and raises the tombstone clock.
func TestLosingDeleteAndRejectedWrite(t *testing.T) {
	var row persistence.Row
	row, _ = mustApply(t, 0, row, up(1, 5, map[string]any{"a": "a5"}), nil)
	row, _ = mustApply(t, 0, row, up(1, 20, map[string]any{"b": "b20"}), nil)
	row, _ = mustApply(t, 0, row, del(2, 10), nil) // loses existence to 20
	if !row.Exists || row.Tomb.HLC != 10 {
		t.Fatalf("exists=%v tomb=%v", row.Exists, row.Tomb)
	}
	if v := ViewOf(row, "a"); v.State != Cleared || v.Clock.HLC != 10 {
		t.Fatalf("a = %+v", v)
	}
	if v := ViewOf(row, "b"); v.State != Written || v.Clock.HLC != 20 {
		t.Fatalf("b = %+v", v)
	}
	before := row.Cells["b"].Clock
	row, _ = mustApply(t, 0, row, up(3, 15, map[string]any{"b": "loses"}), nil)
	if row.Cells["b"].Clock != before || !row.Cells["b"].Value.Equal(messages.MustValue("b20")) {
		t.Fatal("a rejected write moved the column")
	}
	if _, fx := mustApply(t, 0, row, up(3, 21, map[string]any{"zz": 1}), nil); len(fx.Ignored) != 1 {
		t.Fatalf("ignored = %v", fx.Ignored)
	}
}

// The shortcut ResolveKey takes for a key with exactly the table's key
// columns gives the verdict of the full check on every definition and key,
// duplicated key columns included.
func TestResolveKeyShortcutAgreesWithFullCheck(t *testing.T) {
	names := []string{"x", "y", "z"}
	v := messages.MustValue(1)
	rapid.Check(t, func(t *rapid.T) {
		def := persistence.TableDef{KeyColumns: rapid.SliceOfN(rapid.SampledFrom(names), 0, 4).Draw(t, "keyColumns")}
		key := messages.Columns{}
		for _, n := range rapid.SliceOfN(rapid.SampledFrom(names), 0, 4).Draw(t, "key") {
			key[n] = v
		}
		got := ResolveKey(def, key)
		want := fullResolve(def, key)
		if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
			t.Fatalf("def %v key %v: got %v, full check %v", def.KeyColumns, key.Names(), got, want)
		}
		if resolves(def.KeyColumns, key) && want != nil {
			t.Fatalf("def %v key %v: shortcut resolves, full check says %v", def.KeyColumns, key.Names(), want)
		}
	})
}

// fullResolve is ResolveKey's check without the shortcut.
func fullResolve(def persistence.TableDef, key messages.Columns) error {
	if len(key) == 0 {
		return messages.ErrEmptyRowKey
	}
	for name := range key {
		if !contains(def.KeyColumns, name) {
			return ErrUnknownKeyColumn
		}
	}
	for _, name := range def.KeyColumns {
		if _, ok := key[name]; !ok {
			return ErrIncompleteKey
		}
	}
	return nil
}
