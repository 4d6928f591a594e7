package materialize

import (
	"fmt"
	"reflect"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var propDef = persistence.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b", "c"}}

// node is a model receiver: the dedupe, horizon and log handling the
// sync-group actor does around Apply, over in-memory state.
type node struct {
	def     persistence.TableDef
	horizon messages.HLC
	seen    map[messages.EventID]bool
	log     map[string][]*messages.Event
	rows    map[string]persistence.Row
	fx      []Effects
}

func newNode(def persistence.TableDef, h messages.HLC) *node {
	return &node{def: def, horizon: h, seen: map[messages.EventID]bool{}, log: map[string][]*messages.Event{}, rows: map[string]persistence.Row{}}
}

func (n *node) apply(t *rapid.T, e *messages.Event) {
	id := idOf(e)
	if n.seen[id] { // idempotent insert keyed on the event id
		return
	}
	if e.HLC < n.horizon { // below the horizon: counts as applied, writes nothing
		return
	}
	n.seen[id] = true
	k := string(e.RowKey())
	n.log[k] = append(n.log[k], e)
	row, fx, err := Apply(n.def, n.horizon, n.rows[k], id, e, func(yield func(messages.EventID, *messages.Event) error) error {
		for _, le := range n.log[k] {
			if err := yield(idOf(le), le); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	n.rows[k] = row
	n.fx = append(n.fx, fx)
}

func (n *node) addColumn(t *rapid.T, col string) {
	n.def.Columns = append(append([]string(nil), n.def.Columns...), col)
	for k, row := range n.rows {
		nr, _, err := AddColumn(n.def, n.horizon, row, col, func(yield func(messages.EventID, *messages.Event) error) error {
			for _, le := range n.log[k] {
				if err := yield(idOf(le), le); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("add column: %v", err)
		}
		n.rows[k] = nr
	}
}

// state is the canonical comparable form: stored rows plus the reader's view.
func (n *node) state() string {
	keys := make([]string, 0, len(n.rows))
	for k := range n.rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := ""
	for _, k := range keys {
		r := n.rows[k]
		out += fmt.Sprintf("row %x exists=%v ex=%v tomb=%v\n", k, r.Exists, r.Existence, r.Tomb)
		names := make([]string, 0, len(r.Cells))
		for c := range r.Cells {
			names = append(names, c)
		}
		sort.Strings(names)
		for _, c := range names {
			out += fmt.Sprintf("  stored %s=%x@%v\n", c, []byte(r.Cells[c].Value), r.Cells[c].Clock)
		}
		for _, c := range n.def.Columns {
			v := ViewOf(r, c)
			out += fmt.Sprintf("  view %s=%v %x@%v\n", c, v.State, []byte(v.Value), v.Clock)
		}
	}
	return out
}

var sites = []messages.SiteID{{1}, {2}, {3}}

// genEvents draws events from 3 sites over 3 rows and columns a, b, c and
// z (z is unknown to the receiver's schema until it is added). Each site's
// HLCs are distinct (SSP/1 §13.5: no HLC reuse); sites may share HLCs,
// which the site tiebreak orders.
func genEvents(t *rapid.T) []*messages.Event {
	n := rapid.IntRange(1, 30).Draw(t, "n")
	used := map[messages.SiteID]map[messages.HLC]bool{}
	var evs []*messages.Event
	for i := 0; i < n; i++ {
		site := sites[rapid.IntRange(0, len(sites)-1).Draw(t, "site")]
		h := messages.HLC(rapid.IntRange(1, 40).Draw(t, "hlc"))
		if used[site] == nil {
			used[site] = map[messages.HLC]bool{}
		}
		if used[site][h] {
			continue
		}
		used[site][h] = true
		e := &messages.Event{Site: site, HLC: h, Schema: "app", Table: "t",
			Key: messages.Columns{"id": messages.MustValue(rapid.IntRange(0, 2).Draw(t, "row"))}}
		if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
			e.Delete = true
		} else {
			e.Payload = messages.Columns{}
			for _, c := range []string{"a", "b", "c", "z"} {
				switch rapid.IntRange(0, 3).Draw(t, "cell") {
				case 1:
					e.Payload[c] = messages.Null // explicit null cell
				case 2, 3:
					e.Payload[c] = messages.MustValue(rapid.IntRange(0, 9).Draw(t, "v"))
				}
			}
		}
		evs = append(evs, e)
	}
	return evs
}

// deliver returns a random delivery: a permutation with duplicates.
func deliver(t *rapid.T, evs []*messages.Event, label string) []*messages.Event {
	out := append([]*messages.Event(nil), evs...)
	for i := rapid.IntRange(0, len(evs)).Draw(t, label+"-dups"); i > 0; i-- {
		out = append(out, evs[rapid.IntRange(0, len(evs)-1).Draw(t, label+"-dup")])
	}
	perm := rapid.Permutation(out).Draw(t, label+"-perm")
	return perm
}

func checkConvergence(t *rapid.T, horizon messages.HLC) {
	evs := genEvents(t)
	ref := newNode(propDef, horizon)
	for _, e := range evs {
		ref.apply(t, e)
	}
	want := ref.state()
	for i := 0; i < 3; i++ {
		n := newNode(propDef, horizon)
		for _, e := range deliver(t, evs, fmt.Sprint("node", i)) {
			n.apply(t, e)
		}
		if got := n.state(); got != want {
			t.Fatalf("node %d diverged (horizon %v)\nwant:\n%s\ngot:\n%s", i, horizon, want, got)
		}
	}
}

// SSP/1 §13.5: same delivered events, same horizons → same state, whatever
// the order and duplication.
func TestConvergenceHorizonZero(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { checkConvergence(t, 0) })
}

func TestConvergenceNonzeroHorizon(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { checkConvergence(t, messages.HLC(rapid.IntRange(5, 25).Draw(t, "horizon"))) })
}

// SSP/1 §13.6: a node that gains column z by migration and rebuilds it
// agrees with a node that had z from the start.
func TestConvergenceAfterAddColumn(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		horizon := messages.HLC(rapid.IntRange(0, 10).Draw(t, "horizon"))
		evs := genEvents(t)
		wide := propDef
		wide.Columns = []string{"a", "b", "c", "z"}
		ref := newNode(wide, horizon)
		for _, e := range deliver(t, evs, "ref") {
			ref.apply(t, e)
		}
		narrow := newNode(propDef, horizon)
		order := deliver(t, evs, "narrow")
		cut := rapid.IntRange(0, len(order)).Draw(t, "migrate-at")
		for _, e := range order[:cut] {
			narrow.apply(t, e)
		}
		narrow.addColumn(t, "z")
		for _, e := range order[cut:] {
			narrow.apply(t, e)
		}
		if got, want := narrow.state(), ref.state(); got != want {
			t.Fatalf("migrated node diverged\nwant:\n%s\ngot:\n%s", want, got)
		}
	})
}

// Equal event sets give equal effects sets where the effect is a property
// of the event set (partial-rebuild flags need equal horizons).
func TestStoredRowsCanonical(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		evs := genEvents(t)
		a, b := newNode(propDef, 0), newNode(propDef, 0)
		for _, e := range deliver(t, evs, "a") {
			a.apply(t, e)
		}
		for _, e := range deliver(t, evs, "b") {
			b.apply(t, e)
		}
		for k, ra := range a.rows {
			rb := b.rows[k]
			if len(ra.Cells) == 0 && len(rb.Cells) == 0 {
				ra.Cells, rb.Cells = nil, nil
			}
			if !reflect.DeepEqual(ra, rb) {
				t.Fatalf("stored rows differ for %x:\n%+v\n%+v", k, ra, rb)
			}
		}
	})
}

// equivocation is a forced (site, HLC) reuse: distinct events one site
// signed with one HLC for one row.
type equivocation struct {
	site messages.SiteID
	hlc  messages.HLC
	evs  []*messages.Event
}

// genEquivocation ALWAYS returns at least three distinct events with one
// (site, HLC) on one row: two upserts writing the same column with
// different values (the cell and the existence clock tie) and a delete
// (the tombstone clock and the existence tie with both upserts), plus up
// to one more at the same stamp. The stamp lies at or above minHLC, so the
// horizon never hides it.
func genEquivocation(t *rapid.T, minHLC messages.HLC, cols []string) equivocation {
	site := sites[rapid.IntRange(0, len(sites)-1).Draw(t, "eq-site")]
	h := messages.HLC(rapid.IntRange(int(minHLC), 45).Draw(t, "eq-hlc"))
	key := messages.Columns{"id": messages.MustValue(rapid.IntRange(0, 2).Draw(t, "eq-row"))}
	col := rapid.SampledFrom(cols).Draw(t, "eq-col")
	mk := func(del bool, payload messages.Columns) *messages.Event {
		e := &messages.Event{Site: site, HLC: h, Schema: "app", Table: "t", Key: key, Delete: del}
		if !del {
			e.Payload = payload
		}
		return e
	}
	v1 := rapid.IntRange(0, 9).Draw(t, "eq-v1")
	v2 := v1 + 1 + rapid.IntRange(0, 8).Draw(t, "eq-v2") // ≠ v1: distinct events
	eq := equivocation{site: site, hlc: h, evs: []*messages.Event{
		mk(false, messages.Columns{col: messages.MustValue(v1)}),
		mk(false, messages.Columns{col: messages.MustValue(v2)}),
		mk(true, nil),
	}}
	for i := rapid.IntRange(0, 1).Draw(t, "eq-extra"); i > 0; i-- {
		p := messages.Columns{col: messages.MustValue(100 + i)}
		for _, c := range cols {
			if c != col && rapid.Bool().Draw(t, "eq-extra-col") {
				p[c] = messages.MustValue(rapid.IntRange(0, 9).Draw(t, "eq-extra-v"))
			}
		}
		eq.evs = append(eq.evs, mk(false, p))
	}
	ids := map[messages.EventID]bool{}
	for _, e := range eq.evs {
		if ids[idOf(e)] {
			t.Fatalf("generator produced two identical equivocating events")
		}
		ids[idOf(e)] = true
	}
	return eq
}

// interleave delivers the background events in a random order with
// duplicates and inserts the forced events, in the given order, at random
// positions.
func interleave(t *rapid.T, background, forced []*messages.Event, label string) []*messages.Event {
	out := deliver(t, background, label)
	for _, e := range forced {
		at := rapid.IntRange(0, len(out)).Draw(t, label+"-at")
		out = append(out[:at], append([]*messages.Event{e}, out[at:]...)...)
	}
	return out
}

// checkEquivocationConverges: every permutation of the equivocating events
// (all of them, exhaustively), each interleaved at random with a random
// background, gives the state of the reference node. migrateAt ≥ 0 makes
// the receiver gain column z by migration (AddColumn rebuild) after that
// many deliveries.
func checkEquivocationConverges(t *rapid.T, horizon messages.HLC, addColumn bool) {
	background := genEvents(t)
	eq := genEquivocation(t, horizon, []string{"a", "b", "c", "z"})
	wide := propDef
	wide.Columns = []string{"a", "b", "c", "z"}
	ref := newNode(wide, horizon)
	for _, e := range append(append([]*messages.Event(nil), background...), eq.evs...) {
		ref.apply(t, e)
	}
	want := ref.state()
	for i, order := range permutations(eq.evs) {
		label := fmt.Sprint("perm", i)
		delivery := interleave(t, background, order, label)
		var n *node
		if addColumn {
			n = newNode(propDef, horizon)
			cut := rapid.IntRange(0, len(delivery)).Draw(t, label+"-migrate-at")
			for _, e := range delivery[:cut] {
				n.apply(t, e)
			}
			n.addColumn(t, "z")
			delivery = delivery[cut:]
		} else {
			n = newNode(wide, horizon)
		}
		for _, e := range delivery {
			n.apply(t, e)
		}
		if got := n.state(); got != want {
			t.Fatalf("equivocation at %v@%v: permutation %d diverged (horizon %v, add column %v)\nwant:\n%s\ngot:\n%s",
				eq.hlc, eq.site, i, horizon, addColumn, want, got)
		}
	}
}

func permutations(evs []*messages.Event) [][]*messages.Event {
	if len(evs) <= 1 {
		return [][]*messages.Event{append([]*messages.Event(nil), evs...)}
	}
	var out [][]*messages.Event
	for i := range evs {
		rest := append(append([]*messages.Event(nil), evs[:i]...), evs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]*messages.Event{evs[i]}, p...))
		}
	}
	return out
}

// Equivocation (SSP/1 §13.5): a site reusing an HLC for the same cell, the existence
// and the tombstone does not fork receivers — column clocks, existence and
// tombstone clocks break the (HLC, site) tie by event id.
func TestEquivocationConvergesEveryPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { checkEquivocationConverges(t, 0, false) })
}

func TestEquivocationConvergesNonzeroHorizon(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkEquivocationConverges(t, messages.HLC(rapid.IntRange(5, 25).Draw(t, "horizon")), false)
	})
}

// The resurrection and AddColumn rebuild pick candidates by the same full
// clock: a receiver that gains the equivocated column late agrees.
func TestEquivocationConvergesThroughAddColumnRebuild(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkEquivocationConverges(t, messages.HLC(rapid.IntRange(0, 10).Draw(t, "horizon")), true)
	})
}

// The tie is broken by the event id, both ways: the event with the higher
// id wins the cell and the existence whichever arrives first.
func TestTieBrokenByEventID(t *testing.T) {
	u1, u2, d := up(1, 7, map[string]any{"a": "one"}), up(1, 7, map[string]any{"a": "two"}), del(1, 7)
	hi, lo := u1, u2
	if idOf(u2).String() > idOf(u1).String() {
		hi, lo = u2, u1
	}
	for _, order := range [][]*messages.Event{{lo, hi}, {hi, lo}} {
		var row persistence.Row
		for _, e := range order {
			row, _ = mustApply(t, 0, row, e, nil)
		}
		if c := row.Cells["a"]; c.Clock != hi.ClockOf(idOf(hi)) || !c.Value.Equal(hi.Payload["a"]) {
			t.Fatalf("cell %+v: want the higher id's write", c)
		}
	}
	// A delete with the same stamp wins existence iff its id is higher.
	var row persistence.Row
	row, _ = mustApply(t, 0, row, u1, logOf(u1))
	row, _ = mustApply(t, 0, row, d, nil)
	if want := idOf(d).String() > idOf(u1).String(); row.Exists == want {
		t.Fatalf("exists=%v with delete id %s, upsert id %s", row.Exists, idOf(d), idOf(u1))
	}
}
