package runtime

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syncmesh/syncmesh/messages"
)

var defTyped = TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"i", "f", "s", "b", "ok", "at", "x"},
	Types: map[string]ColumnType{"id": TypeInteger, "i": TypeInteger, "f": TypeFloat, "s": TypeText, "b": TypeBytes, "ok": TypeBool, "at": TypeTimestamp}}

// Local writes are checked against the declared types, key columns
// included: a value of another kind is a *TypeError (ErrTypeMismatch) and
// nothing is written; null passes every type, and "any" takes anything.
func TestTypedColumnsLocalWrites(t *testing.T) {
	now := time.UnixMicro(1_800_000_000_123_456)
	cases := []struct {
		col  string
		v    any
		okay bool
	}{
		{"i", 7, true}, {"i", int64(-3), true}, {"i", "seven", false}, {"i", 1.5, false}, {"i", nil, true},
		{"f", 1.5, true}, {"f", 2, true}, {"f", "1.5", false}, {"f", true, false},
		{"s", "hello", true}, {"s", 7, false}, {"s", []byte("hi"), false},
		{"b", []byte{1, 2}, true}, {"b", "hi", false},
		{"ok", true, true}, {"ok", false, true}, {"ok", "yes", false}, {"ok", 1, false}, {"ok", map[string]any{"a": 1}, false},
		{"at", now, true}, {"at", int64(1_800_000_000), true}, {"at", "2027-01-01", false},
		{"x", map[string]any{"a": 1}, true}, {"x", "anything", true},
	}
	n := openTestNode(t, Config{})
	n.define(defTyped)
	for i, c := range cases {
		_, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{c.col: c.v})
		var te *TypeError
		if c.okay != (err == nil) || !c.okay && (!errors.Is(err, ErrTypeMismatch) || !errors.As(err, &te) || te.Column != c.col) {
			t.Fatalf("%s = %#v: err %v, want ok=%v", c.col, c.v, err, c.okay)
		}
		if _, found := n.get(i); found != c.okay {
			t.Fatalf("%s = %#v: row written %v", c.col, c.v, found)
		}
	}
	// A typed key column refuses "seven" where it takes 7.
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": "seven"}, nil); !errors.Is(err, ErrTypeMismatch) {
		t.Fatalf("text key in an integer key column: %v", err)
	}
	// In a batch, the mistyped write refuses the whole batch.
	var b Batch
	b.Upsert("app", "t", map[string]any{"id": 100}, map[string]any{"i": 1})
	b.Upsert("app", "t", map[string]any{"id": 101}, map[string]any{"ok": "yes"})
	var be *BatchError
	if _, err := n.Write(n.ctx, &b); !errors.Is(err, ErrTypeMismatch) || !errors.As(err, &be) || be.Index != 1 {
		t.Fatalf("batch with a mistyped write: %v", err)
	}
	if _, found := n.get(100); found {
		t.Fatal("a refused batch wrote a row")
	}
	// Typed values read back into their Go types; a timestamp into a
	// time.Time, to the microsecond (float seconds, messages.TypeTimestamp).
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 200}, map[string]any{"at": now, "f": 2}); err != nil {
		t.Fatal(err)
	}
	r, _ := n.get(200)
	var at time.Time
	var f float64
	if _, err := r.Value("at", &at); err != nil || at.Sub(now).Abs() >= time.Microsecond {
		t.Fatalf("timestamp read back as %v (%v), want %v", at, err, now)
	}
	if _, err := r.Value("f", &f); err != nil || f != 2 {
		t.Fatalf("float column holding an integer read back as %v (%v)", f, err)
	}
}

// A received value of the wrong type is kept and materialized as signed,
// so a node that declares the column untyped holds the same bytes; it is
// surfaced (TypeMismatch notice, metric) and reads back as a typed error
// with the destination untouched — never dropped, never a zero.
func TestTypedColumnsReceivedMismatchKeptAndSurfaced(t *testing.T) {
	typed, p := nodeWithPeerDef(t, defTyped)
	untyped := defTyped
	untyped.Types = nil
	plain, _ := nodeWithPeerDef(t, untyped)
	plain.trust(p)
	ns := typed.collect()
	raw := p.event(&messages.Event{HLC: hlcAt(typed.wall.MS(), 1), Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)},
		Payload: messages.Columns{"ok": messages.MustValue("yes"), "s": messages.MustValue("fine")}})
	for _, n := range []*testNode{typed, plain} {
		if out := n.apply(raw); out.Kind != messages.Applied {
			t.Fatalf("apply: %+v", out)
		}
	}
	ns.waitFor(t, "TypeMismatch", func(x messages.Notice) bool {
		m, ok := x.(messages.TypeMismatch)
		return ok && len(m.Columns) == 1 && m.Columns[0] == "ok" && m.Table == "t"
	})
	if got := testutil.ToFloat64(typed.metrics.mistyped); got != 1 {
		t.Fatalf("type mismatch metric %v, want 1", got)
	}
	r, ok := typed.get(1)
	if !ok {
		t.Fatal("row with a mistyped value missing")
	}
	okv := true
	st, err := r.Value("ok", &okv)
	var te *TypeError
	if st != Written || !errors.Is(err, ErrTypeMismatch) || !errors.As(err, &te) || te.Want != TypeBool || te.Got != "text" || !okv {
		t.Fatalf("reading the mistyped cell: state %v err %v out %v", st, err, okv)
	}
	if s, _ := cellString(t, r, "s"); s != "fine" {
		t.Fatalf("the well-typed cell of the same event: %q", s)
	}
	// Both nodes hold the same cells, whatever they declare.
	r2, _ := plain.get(1)
	for _, c := range defTyped.Columns {
		if a, b := r.Cells[c], r2.Cells[c]; a.State != b.State || !a.Value.Equal(b.Value) || a.Clock != b.Clock {
			t.Fatalf("column %s: typed node %+v, untyped node %+v", c, a, b)
		}
	}
	var s string
	if _, err := r2.Value("ok", &s); err != nil || s != "yes" {
		t.Fatalf("untyped node reads %q, %v", s, err)
	}
}

func nodeWithPeerDef(t *testing.T, def TableDef) (*testNode, *peer) {
	t.Helper()
	n := openTestNode(t, Config{})
	n.define(def)
	p := newPeer(t, 1)
	n.trust(p)
	return n, p
}

// Types are part of the persisted definition: they survive a restart,
// DefineTable compares them, and EnsureTable types a column stored as any,
// keeps a stored type it is not told about, and refuses a changed one.
func TestTypedColumnsPersistedAndEvolved(t *testing.T) {
	dir := t.TempDir()
	n := openTestNode(t, Config{Dir: dir})
	def := TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}
	n.define(def)
	typed := def
	typed.Types = map[string]ColumnType{"a": TypeText}
	if err := n.DefineTable(n.ctx, typed); !errors.Is(err, ErrTableConflict) {
		t.Fatalf("DefineTable with a new type: %v", err)
	}
	if err := n.EnsureTable(n.ctx, typed); err != nil {
		t.Fatalf("EnsureTable typing an untyped column: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openTestNode(t, Config{Dir: dir})
	defs, err := n.Tables(n.ctx)
	if err != nil || len(defs) != 1 || defs[0].TypeOf("a") != TypeText || defs[0].TypeOf("b") != TypeAny {
		t.Fatalf("after a restart: %+v %v", defs, err)
	}
	if err := n.DefineTable(n.ctx, typed); err != nil {
		t.Fatalf("DefineTable with the stored definition: %v", err)
	}
	if err := n.EnsureTable(n.ctx, def); err != nil { // an older build: no types
		t.Fatalf("EnsureTable without types: %v", err)
	}
	if defs, _ := n.Tables(n.ctx); defs[0].TypeOf("a") != TypeText {
		t.Fatalf("the stored type was dropped: %+v", defs[0])
	}
	changed := def
	changed.Types = map[string]ColumnType{"a": TypeInteger}
	if err := n.EnsureTable(n.ctx, changed); !errors.Is(err, ErrTableConflict) {
		t.Fatalf("EnsureTable changing a type: %v", err)
	}
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": 5}); !errors.Is(err, ErrTypeMismatch) {
		t.Fatalf("write after the restart: %v", err)
	}
	bad := def
	bad.Types = map[string]ColumnType{"nope": TypeText}
	if err := n.EnsureTable(n.ctx, bad); err == nil {
		t.Fatal("a type for a column the table does not list was accepted")
	}
}

// Two nodes on different schema versions — one declares types and a
// column fewer, the other no types — receive the same signed events in
// different orders, with values of every kind: they hold the same bytes
// and clocks in the columns they share, and the typed node reads every
// mistyped cell as ErrTypeMismatch, never as a zero.
func TestPropertyTypedAndUntypedNodesConverge(t *testing.T) {
	v1 := TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"},
		Types: map[string]ColumnType{"a": TypeInteger, "b": TypeText}}
	v2 := TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b", "c"}}
	kinds := []any{nil, 7, -2, "text", []byte{1}, true, 1.5, map[string]any{"m": 1}}
	// One pair of nodes, a fresh table per run (opening nodes per run
	// would cost more than the run).
	typed, p := openTestNode(t, Config{}), newPeer(t, 1)
	plain := openTestNode(t, Config{})
	typed.trust(p)
	plain.trust(p)
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		v1, v2 := v1, v2
		v1.Table, v2.Table = fmt.Sprintf("t%d", run), fmt.Sprintf("t%d", run)
		typed.define(v1)
		plain.define(v2)
		base := typed.wall.MS()
		key := func(id int) messages.Columns { return messages.Columns{"id": messages.MustValue(id)} }
		var raws [][]byte
		for i, n := 0, rapid.IntRange(1, 20).Draw(rt, "events"); i < n; i++ {
			h, id := hlcAt(base, uint16(i+1)), rapid.IntRange(0, 3).Draw(rt, "row")
			if rapid.IntRange(0, 4).Draw(rt, "op") == 0 {
				raws = append(raws, p.event(&messages.Event{HLC: h, Schema: "app", Table: v1.Table, Key: key(id), Delete: true}))
				continue
			}
			cols := messages.Columns{}
			for _, c := range []string{"a", "b", "c"} {
				if rapid.Bool().Draw(rt, "has") {
					cols[c] = messages.MustValue(kinds[rapid.IntRange(0, len(kinds)-1).Draw(rt, "kind")])
				}
			}
			raws = append(raws, p.event(&messages.Event{HLC: h, Schema: "app", Table: v1.Table, Key: key(id), Payload: cols}))
		}
		perm := rapid.Permutation(raws).Draw(rt, "order")
		applyAll(t, typed.Node, raws)
		applyAll(t, plain.Node, perm)
		get := func(n *testNode, id int) (Row, bool) {
			r, ok, err := n.Get(n.ctx, "app", v1.Table, map[string]any{"id": id})
			if err != nil {
				rt.Fatal(err)
			}
			return r, ok
		}
		for id := range 4 {
			r1, ok1 := get(typed, id)
			r2, ok2 := get(plain, id)
			if ok1 != ok2 {
				rt.Fatalf("row %d: exists %v vs %v", id, ok1, ok2)
			}
			for _, c := range v1.Columns {
				a, b := r1.Cells[c], r2.Cells[c]
				if a.State != b.State || !a.Value.Equal(b.Value) || a.Clock != b.Clock {
					rt.Fatalf("row %d column %s: typed %+v, untyped %+v", id, c, a, b)
				}
				var out any
				_, err := r1.Value(c, &out)
				if want := v1.TypeOf(c).Check(c, a.Value); (err == nil) != (want == nil) || err != nil && !errors.Is(err, ErrTypeMismatch) {
					rt.Fatalf("row %d column %s (%x): read error %v, want %v", id, c, []byte(a.Value), err, want)
				}
			}
		}
	})
}
