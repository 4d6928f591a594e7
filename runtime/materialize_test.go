package runtime

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// ---- SSP/1 §13.6, one test per table row ----

// Row "Destination table missing": group held, retried after DefineTable;
// the watermark does not advance past it.
func TestHeldDestinationTableMissingRetriedAfterDefineTable(t *testing.T) {
	n := openTestNode(t, Config{})
	ns := n.collect()
	p := newPeer(t, 1)
	n.trust(p)
	now := n.wall.MS()
	raw := p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "waiting"})
	out := n.apply(raw)
	if out.Kind != messages.Held || out.AdvancesWatermark() {
		t.Fatalf("missing table: %v", out)
	}
	ns.waitFor(t, "held", func(x messages.Notice) bool { _, ok := x.(messages.GroupHeld); return ok })
	// Re-offered while still held: still held, not "duplicate".
	if out := n.apply(raw); out.Kind != messages.Held {
		t.Fatalf("re-offer while held: %v", out)
	}
	n.define(defT)
	ns.waitFor(t, "released", func(x messages.Notice) bool { r, ok := x.(messages.GroupReleased); return ok && r.Events == 1 })
	r, ok := n.get(1)
	if !ok {
		t.Fatal("held event not materialized after DefineTable")
	}
	if v, st := cellString(t, r, "a"); v != "waiting" || st != Written {
		t.Fatalf("a = %q (%v)", v, st)
	}
	if out := n.apply(raw); out.Kind != messages.Duplicate {
		t.Fatalf("after release: %v", out)
	}
}

// Row "Signature verification fails": dropped and surfaced, watermark advances.
func TestDroppedSignatureVerificationFails(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	raw := p.upsert(hlcAt(n.wall.MS(), 1), 1, map[string]any{"a": "x"})
	raw[len(raw)-3] ^= 0x40
	out := n.apply(raw)
	if out.Kind != messages.Dropped || out.Reason != messages.ReasonSignature || !out.AdvancesWatermark() {
		t.Fatalf("%v", out)
	}
}

func keyEvent(n *testNode, p *peer, key any) []byte {
	return p.rawEvent(map[string]any{"v": 1, "site": siteBytes(p), "hlc": uint64(hlcAt(n.wall.MS(), 1)), "schema": "app", "table": "t",
		"key": key, "payload": map[string]any{"a": "x"}})
}

func siteBytes(p *peer) []byte { s := p.signer.Site(); return s[:] }

// Row "row_key is null or an empty map": dropped and surfaced.
func TestDroppedRowKeyNull(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	ns := n.collect()
	out := n.apply(keyEvent(n, p, nil))
	if out.Kind != messages.Dropped || out.Reason != messages.ReasonEmptyRowKey || !out.AdvancesWatermark() {
		t.Fatalf("%v", out)
	}
	ns.waitFor(t, "dropped", func(x messages.Notice) bool {
		d, ok := x.(messages.EventDropped)
		return ok && d.Outcome.Reason == messages.ReasonEmptyRowKey && d.Outcome.Site == p.signer.Site()
	})
}

func TestDroppedRowKeyEmptyMap(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	out := n.apply(keyEvent(n, p, map[string]any{}))
	if out.Kind != messages.Dropped || out.Reason != messages.ReasonEmptyRowKey {
		t.Fatalf("%v", out)
	}
}

// Row "row_key names any column the destination table does not have":
// dropped, no prefix match (the resolvable part addresses nothing).
func TestDroppedRowKeyUnknownColumnNoPrefixMatch(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	if out := n.apply(p.upsert(hlcAt(n.wall.MS(), 1), 7, map[string]any{"a": "original"})); out.Kind != messages.Applied {
		t.Fatal(out)
	}
	out := n.apply(keyEvent(n, p, map[string]any{"id": 7, "bogus": 1}))
	if out.Kind != messages.Dropped || out.Reason != messages.ReasonUnknownKeyColumn || !out.AdvancesWatermark() {
		t.Fatalf("partially resolvable key: %v", out)
	}
	if out := n.apply(keyEvent(n, p, map[string]any{"nope": 7})); out.Kind != messages.Dropped || out.Reason != messages.ReasonUnknownKeyColumn {
		t.Fatalf("unknown key: %v", out)
	}
	if r, _ := n.get(7); func() string { v, _ := cellString(t, r, "a"); return v }() != "original" {
		t.Fatal("a dropped event mutated the row sharing the key prefix")
	}
	// A composite key missing a component does not resolve either.
	n.define(TableDef{Schema: "app", Table: "pair", KeyColumns: []string{"x", "y"}, Columns: []string{"v"}})
	half := p.event(&messages.Event{HLC: hlcAt(n.wall.MS(), 9), Schema: "app", Table: "pair", Key: messages.Columns{"x": messages.MustValue(1)}, Payload: messages.Columns{}})
	if out := n.apply(half); out.Kind != messages.Dropped || out.Reason != messages.ReasonIncompleteKey {
		t.Fatalf("incomplete composite key: %v", out)
	}
}

// Row "payload names columns the destination table does not have": the
// known columns apply, the rest are ignored with clocks untouched, metered.
func TestUnknownPayloadColumnsIgnoredKnownApplied(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	ns := n.collect()
	out := n.apply(p.upsert(hlcAt(n.wall.MS(), 1), 1, map[string]any{"a": "known", "zz": "unknown"}))
	if out.Kind != messages.Applied || !out.AdvancesWatermark() {
		t.Fatalf("%v", out)
	}
	r, _ := n.get(1)
	if v, _ := cellString(t, r, "a"); v != "known" {
		t.Fatalf("a = %q", v)
	}
	if _, has := r.Cells["zz"]; has {
		t.Fatal("ignored column materialized")
	}
	ig := ns.waitFor(t, "ignored", func(x messages.Notice) bool { _, ok := x.(messages.ColumnsIgnored); return ok }).(messages.ColumnsIgnored)
	if len(ig.Columns) != 1 || ig.Columns[0] != "zz" {
		t.Fatalf("ignored = %v", ig.Columns)
	}
	if got := counterValue(t, n, "syncmesh_sync_ignored_column_events_total"); got != 1 {
		t.Fatalf("ignored metric = %v", got)
	}
	// The ignored column's clock was left untouched: gaining the column
	// later rebuilds it from the log (§13.6).
	if err := n.AddColumn(n.ctx, "app", "t", "zz"); err != nil {
		t.Fatal(err)
	}
	r, _ = n.get(1)
	if v, st := cellString(t, r, "zz"); v != "unknown" || st != Written {
		t.Fatalf("zz after AddColumn = %q (%v)", v, st)
	}
}

// An upsert whose payload names no destination column still asserts
// existence; the row is existent and empty, not cleared.
func TestUpsertNamingNoKnownColumnStillAssertsExistence(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	out := n.apply(p.upsert(hlcAt(n.wall.MS(), 1), 1, map[string]any{"zz": 1}))
	if out.Kind != messages.Applied {
		t.Fatal(out)
	}
	r, ok := n.get(1)
	if !ok || !r.Exists {
		t.Fatal("row does not exist")
	}
	for _, c := range defT.Columns {
		if r.Cells[c].State != Unmaterialized || r.Cells[c].Value != nil {
			t.Fatalf("column %s = %+v, want unmaterialized (not a default, zero or null)", c, r.Cells[c])
		}
	}
}

// A reader tells a never-materialized column from a null one.
func TestReaderTellsUnmaterializedFromNull(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": nil}); err != nil {
		t.Fatal(err)
	}
	r, _ := n.get(1)
	if c := r.Cells["a"]; c.State != Written || !c.Value.IsNull() || c.Clock.IsZero() {
		t.Fatalf("explicit null: %+v", c)
	}
	if c := r.Cells["b"]; c.State != Unmaterialized || c.Value != nil || !c.Clock.IsZero() {
		t.Fatalf("never written: %+v", c)
	}
	var s *string
	if st, _ := r.Value("b", &s); st != Unmaterialized {
		t.Fatalf("Value(b) state = %v", st)
	}
}

// ---- §13.1–13.4 ----

// §13.1: resolution is per column: concurrent edits of different columns
// both survive; a losing write leaves the column clock untouched.
func TestPerColumnLWW(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	a, b := newPeer(t, 1), newPeer(t, 2)
	n.trust(a)
	n.trust(b)
	now := n.wall.MS()
	n.apply(a.upsert(hlcAt(now, 5), 1, map[string]any{"a": "A5"}))
	n.apply(b.upsert(hlcAt(now, 6), 1, map[string]any{"b": "B6"}))
	n.apply(b.upsert(hlcAt(now, 3), 1, map[string]any{"a": "B3-loses"}))
	r, _ := n.get(1)
	va, _ := cellString(t, r, "a")
	vb, _ := cellString(t, r, "b")
	if va != "A5" || vb != "B6" {
		t.Fatalf("a=%q b=%q", va, vb)
	}
	if r.Cells["a"].Clock.HLC != hlcAt(now, 5) {
		t.Fatalf("losing write moved the clock: %v", r.Cells["a"].Clock)
	}
	// Same HLC: the site id breaks the tie (site 2 > site 1).
	n.apply(a.upsert(hlcAt(now, 9), 1, map[string]any{"c": "site1"}))
	n.apply(b.upsert(hlcAt(now, 9), 1, map[string]any{"c": "site2"}))
	r, _ = n.get(1)
	if v, _ := cellString(t, r, "c"); v != "site2" {
		t.Fatalf("tiebreak: c=%q", v)
	}
}

// §13.1: an explicit null is an ordinary clocked write: it wins and loses
// like any value.
func TestExplicitNullIsClockedWrite(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	now := n.wall.MS()
	n.apply(p.upsert(hlcAt(now, 2), 1, map[string]any{"a": "v2", "b": "keep"}))
	n.apply(p.upsert(hlcAt(now, 3), 1, map[string]any{"a": nil}))
	n.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "older"}))
	r, _ := n.get(1)
	if c := r.Cells["a"]; !c.Value.IsNull() || c.State != Written || c.Clock.HLC != hlcAt(now, 3) {
		t.Fatalf("a = %+v", c)
	}
	if v, _ := cellString(t, r, "b"); v != "keep" {
		t.Fatalf("clearing one column touched another: b=%q", v)
	}
}

// §13.2 and §13.3: a delete tombstones the row; a later upsert resurrects
// it (surfaced); a losing delete still clears the columns it beats and
// raises the tombstone clock.
func TestDeleteResurrectAndLosingDelete(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	ns := n.collect()
	p, q := newPeer(t, 1), newPeer(t, 2)
	n.trust(p)
	n.trust(q)
	now := n.wall.MS()
	n.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "a1", "b": "b1"}))
	n.apply(p.del(hlcAt(now, 2), 1))
	if _, ok := n.get(1); ok {
		t.Fatal("deleted row visible")
	}
	r, _ := n.get(1)
	if c := r.Cells["a"]; c.State != Cleared || !c.Value.IsNull() || c.Clock.HLC != hlcAt(now, 2) {
		t.Fatalf("cleared cell: %+v", c)
	}
	n.apply(q.upsert(hlcAt(now, 4), 1, map[string]any{"b": "b4"}))
	ns.waitFor(t, "resurrection", func(x messages.Notice) bool {
		res, ok := x.(messages.Resurrection)
		return ok && res.Tomb.HLC == hlcAt(now, 2) && res.By.HLC == hlcAt(now, 4)
	})
	r, ok := n.get(1)
	if !ok {
		t.Fatal("not resurrected")
	}
	if c := r.Cells["a"]; c.State != Cleared {
		t.Fatalf("a after resurrection = %+v (the delete cleared it)", c)
	}
	if v, _ := cellString(t, r, "b"); v != "b4" {
		t.Fatalf("b = %q", v)
	}
	// A losing delete (existence stays with the upsert at 4) at HLC 3
	// still raises the tombstone clock and clears what it beats: nothing
	// here, since b was written at 4 and a was cleared at 2 → now 3.
	n.apply(q.del(hlcAt(now, 3), 1))
	r, ok = n.get(1)
	if !ok || r.Tomb.HLC != hlcAt(now, 3) {
		t.Fatalf("losing delete: exists=%v tomb=%v", ok, r.Tomb)
	}
	if c := r.Cells["a"]; c.State != Cleared || c.Clock.HLC != hlcAt(now, 3) {
		t.Fatalf("a = %+v", c)
	}
	// A late write below the tombstone clock is rejected whichever order.
	n.apply(p.upsert(hlcAt(now, 2)+1, 1, map[string]any{"c": "late"}))
	r, _ = n.get(1)
	if c := r.Cells["c"]; c.State == Written {
		t.Fatalf("write below the tombstone applied: %+v", c)
	}
}

// §13.4: a resurrection whose tombstone clock lies below the eviction
// horizon is surfaced as partial, naming the row and the horizon.
func TestPartialRebuildSurfacedNamingRowAndHorizon(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	ns := n.collect()
	now := n.wall.MS()
	n.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "old"}))
	n.apply(p.del(hlcAt(now, 2), 1))
	h := hlcAt(now, 5)
	if _, err := n.SetHorizon(n.ctx, "app", "t", h); err != nil {
		t.Fatal(err)
	}
	n.apply(p.upsert(hlcAt(now, 6), 1, map[string]any{"b": "new"}))
	pr := ns.waitFor(t, "partial rebuild", func(x messages.Notice) bool { _, ok := x.(messages.PartialRebuild); return ok }).(messages.PartialRebuild)
	if pr.Horizon != h || pr.Tomb.HLC != hlcAt(now, 2) || !pr.Key["id"].Equal(messages.MustValue(1)) || pr.Table != "t" {
		t.Fatalf("partial rebuild notice: %+v", pr)
	}
	if got := counterValue(t, n, "syncmesh_sync_partial_rebuilds_total"); got != 1 {
		t.Fatalf("metric = %v", got)
	}
	// A complete rebuild (tomb at or above the horizon) is not partial.
	n.apply(p.del(hlcAt(now, 7), 1))
	n.apply(p.upsert(hlcAt(now, 8), 1, map[string]any{"b": "again"}))
	ns.waitFor(t, "second resurrection", func(x messages.Notice) bool {
		r, ok := x.(messages.Resurrection)
		return ok && r.By.HLC == hlcAt(now, 8)
	})
	if got := counterValue(t, n, "syncmesh_sync_partial_rebuilds_total"); got != 1 {
		t.Fatalf("complete rebuild counted partial: %v", got)
	}
}

// §13.5: an event below the horizon counts as applied and writes nothing;
// SetHorizon reclaims the log below it.
func TestEventBelowHorizonCountsAppliedWritesNothing(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	now := n.wall.MS()
	n.apply(p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "x"}))
	n.apply(p.upsert(hlcAt(now, 2), 2, map[string]any{"a": "y"}))
	reclaimed, err := n.SetHorizon(n.ctx, "app", "t", hlcAt(now, 2))
	if err != nil || reclaimed != 1 {
		t.Fatalf("reclaimed %d, %v", reclaimed, err)
	}
	out := n.apply(p.upsert(hlcAt(now, 0), 3, map[string]any{"a": "below"}))
	if out.Kind != messages.Applied || !out.BelowHorizon || !out.AdvancesWatermark() {
		t.Fatalf("%v", out)
	}
	if _, ok := n.get(3); ok {
		t.Fatal("event below the horizon wrote a row")
	}
	if h, _ := n.Horizon(n.ctx, "app", "t"); h != hlcAt(now, 2) {
		t.Fatalf("horizon = %v", h)
	}
}
