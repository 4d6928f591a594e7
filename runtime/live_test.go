package runtime

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"pgregory.net/rapid"
)

// fataler is what the live consumer needs of a *testing.T or *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// liveDef is the todo-like table of the live query tests: typed columns
// and an index over (done, rank).
func liveDef(table string) TableDef {
	return TableDef{Schema: "app", Table: table, KeyColumns: []string{"id"}, Columns: []string{"title", "done", "rank"},
		Types:   map[string]ColumnType{"id": TypeInteger, "title": TypeText, "done": TypeBool, "rank": TypeInteger},
		Indexes: []IndexDef{{Name: "by_done", Columns: []string{"done", "rank"}}}}
}

// liveConsumer applies a live query's events to the rows it holds, as an
// application would.
type liveConsumer struct {
	q    Query
	pos  uint64
	held map[string]Row
	// settled is set by the first LiveSettled.
	settled bool
	next    func() (LiveEvent, error, bool)
	stop    func()
	events  []LiveEvent
}

func startConsumer(ctx context.Context, n *Node, q Query, c *liveConsumer) *liveConsumer {
	if c == nil {
		c = &liveConsumer{q: q, held: map[string]Row{}}
	}
	var rows []Row
	for _, r := range c.held {
		rows = append(rows, r)
	}
	c.settled = false
	c.next, c.stop = iter.Pull2(n.Live(ctx, q, LivePosition{After: c.pos, Held: rows}))
	return c
}

// apply handles one event.
func (c *liveConsumer) apply(t fataler, e LiveEvent) {
	t.Helper()
	c.events = append(c.events, e)
	k := string(e.Row.Key.Encode())
	switch e.Kind {
	case LiveEnter:
		if _, ok := c.held[k]; ok {
			t.Fatalf("%s: enter of a row already held: %x", c.q.Table, k)
		}
		c.held[k] = e.Row
	case LiveUpdate:
		if _, ok := c.held[k]; !ok {
			t.Fatalf("%s: update of a row not held: %x", c.q.Table, k)
		}
		c.held[k] = e.Row
	case LiveLeave:
		if _, ok := c.held[k]; !ok {
			t.Fatalf("%s: leave of a row not held: %x", c.q.Table, k)
		}
		delete(c.held, k)
	case LiveSettled:
		c.pos, c.settled = e.Seq, true
	default:
		t.Fatalf("event of kind %v", e.Kind)
	}
}

// catchUp handles events until a refresh settled at or after the newest
// change sequence.
func (c *liveConsumer) catchUp(t fataler, n *Node) {
	t.Helper()
	target, err := n.LastChangeSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for !c.settled || c.pos < target {
		e, err, ok := c.next()
		if !ok || err != nil {
			t.Fatalf("%s: live query ended before change %d: %v", c.q.Table, target, err)
		}
		c.apply(t, e)
	}
}

// liveView renders rows (keys and what a reader sees) sorted by key.
func liveView(rows []Row) string {
	var out []string
	for _, r := range rows {
		out = append(out, fmt.Sprintf("%x:%x", r.Key.Encode(), liveDigest(r)))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// check: what the consumer holds is the query's answer now.
func (c *liveConsumer) check(t fataler, n *Node) {
	t.Helper()
	c.catchUp(t, n)
	want, _, err := n.QueryPage(context.Background(), c.q)
	if errors.Is(err, ErrUnknownTable) {
		err = nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []Row
	for _, r := range c.held {
		got = append(got, r)
	}
	if liveView(got) != liveView(want) {
		t.Fatalf("%s index %q eq %v limit %d: live result (%d rows)\n%s\nquery (%d rows)\n%s", c.q.Table, c.q.Index, c.q.Eq, c.q.Limit, len(got), liveView(got), len(want), liveView(want))
	}
}

func TestLiveEntersUpdatesAndLeaves(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	def := liveDef("todos")
	if err := n.EnsureTable(ctx, def); err != nil {
		t.Fatal(err)
	}
	upsert := func(id int, vals map[string]any) {
		t.Helper()
		if _, err := n.Upsert(ctx, "app", "todos", map[string]any{"id": id}, vals); err != nil {
			t.Fatal(err)
		}
	}
	upsert(1, map[string]any{"title": "milk", "done": false, "rank": 2})
	upsert(2, map[string]any{"title": "eggs", "done": true, "rank": 1})
	open := Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{false}}
	c := startConsumer(ctx, n.Node, open, nil)
	defer c.stop()
	kinds := func() string {
		var b []string
		for _, e := range c.events {
			var id int64
			if e.Kind != LiveSettled {
				_ = e.Row.Key["id"].Decode(&id)
			}
			b = append(b, fmt.Sprintf("%v:%d", e.Kind, id))
		}
		c.events = nil
		return strings.Join(b, " ")
	}
	step := func(want string) {
		t.Helper()
		c.check(t, n.Node)
		if got := kinds(); got != want {
			t.Fatalf("events %q, want %q", got, want)
		}
	}
	step("enter:1 settled:0")
	upsert(3, map[string]any{"title": "bread", "done": false, "rank": 0})
	step("enter:3 settled:0")
	upsert(1, map[string]any{"title": "oat milk"})
	step("update:1 settled:0")
	upsert(1, map[string]any{"done": true}) // leaves: no longer matches
	step("leave:1 settled:0")
	upsert(2, map[string]any{"done": false}) // enters: matches now
	step("enter:2 settled:0")
	if _, err := n.Delete(ctx, "app", "todos", map[string]any{"id": 3}); err != nil {
		t.Fatal(err)
	}
	step("leave:3 settled:0")
	// A write of another row that stays out of the answer is a refresh
	// that yields only its LiveSettled.
	upsert(1, map[string]any{"title": "soy milk"})
	step("settled:0")
	// Several changes read as one refresh: the answer, not every write.
	upsert(5, map[string]any{"title": "jam", "done": false, "rank": 9})
	upsert(5, map[string]any{"title": "honey"})
	upsert(2, map[string]any{"done": true})
	step("leave:2 enter:5 settled:0")
	// Settled events carry the position: the last one is the newest change.
	last, _ := n.LastChangeSeq(ctx)
	if c.pos != last {
		t.Fatalf("settled at %d, newest change %d", c.pos, last)
	}
}

// A limited live query keeps the first rows of its order: when one
// leaves, the next one enters.
func TestLiveLimitPromotesTheNextRow(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	if err := n.EnsureTable(ctx, liveDef("todos")); err != nil {
		t.Fatal(err)
	}
	var b Batch
	for i := range 5 {
		b.Upsert("app", "todos", map[string]any{"id": i}, map[string]any{"title": "x", "done": false, "rank": i})
	}
	if _, err := n.Write(ctx, &b); err != nil {
		t.Fatal(err)
	}
	c := startConsumer(ctx, n.Node, Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{false}, Limit: 2}, nil)
	defer c.stop()
	c.check(t, n.Node)
	if len(c.held) != 2 {
		t.Fatalf("holds %d rows, want 2", len(c.held))
	}
	if _, err := n.Delete(ctx, "app", "todos", map[string]any{"id": 0}); err != nil {
		t.Fatal(err)
	}
	c.events = nil
	c.check(t, n.Node)
	if len(c.events) != 3 || c.events[0].Kind != LiveLeave || c.events[1].Kind != LiveEnter || c.events[2].Kind != LiveSettled {
		t.Fatalf("after deleting the first row: %v, want leave, enter, settled", c.events)
	}
	var id int64
	if _ = c.events[1].Row.Key["id"].Decode(&id); id != 2 {
		t.Fatalf("row %d entered, want 2 (the next in rank order)", id)
	}
}

func TestLiveErrors(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	ctx := n.ctx
	first := func(q Query) error {
		for _, err := range n.Live(ctx, q, LivePosition{}) {
			if err != nil {
				return err
			}
			break
		}
		return nil
	}
	if err := first(Query{Table: "todos"}); !errors.Is(err, ErrInvalidLiveQuery) {
		t.Fatalf("no schema: %v, want ErrInvalidLiveQuery", err)
	}
	if err := n.EnsureTable(ctx, liveDef("todos")); err != nil {
		t.Fatal(err)
	}
	if err := first(Query{Schema: "app", Table: "todos", Index: "nope"}); !errors.Is(err, ErrUnknownIndex) {
		t.Fatalf("unknown index: %v, want ErrUnknownIndex", err)
	}
	if err := first(Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{"yes"}}); !errors.Is(err, ErrTypeMismatch) {
		t.Fatalf("a text value for a bool column: %v, want ErrTypeMismatch", err)
	}
	// Breaking out, cancelling and closing end the iteration.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got []error
	for e, err := range n.Live(cctx, Query{Schema: "app", Table: "todos"}, LivePosition{}) {
		if err != nil {
			got = append(got, err)
			continue
		}
		if e.Kind == LiveSettled {
			cancel()
		}
	}
	if len(got) != 1 || !errors.Is(got[0], context.Canceled) {
		t.Fatalf("after cancel: %v, want one context.Canceled", got)
	}
	next, stop := iter.Pull2(n.Live(ctx, Query{Schema: "app", Table: "todos"}, LivePosition{}))
	defer stop()
	if e, err, _ := next(); err != nil || e.Kind != LiveSettled {
		t.Fatalf("first event of an empty answer: %v %v, want settled", e, err)
	}
	go func() { _ = n.Close() }()
	if _, err, _ := next(); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// A table not defined yet has an empty answer; its definition brings the
// rows of the events held for it.
func TestLiveOfTableDefinedLater(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	p := newPeer(t, 1)
	n.trust(p)
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	c := startConsumer(ctx, n.Node, Query{Schema: "app", Table: "t"}, nil)
	defer c.stop()
	c.check(t, n.Node)
	if o := n.apply(p.upsert(hlcAt(n.wall.MS(), 0), 1, map[string]any{"a": "x"})); o.Kind != messages.Held {
		t.Fatalf("event for an undefined table: %v", o)
	}
	n.define(defT)
	c.check(t, n.Node)
	if len(c.held) != 1 {
		t.Fatalf("after DefineTable the live result holds %d rows, want 1", len(c.held))
	}
}

// The live result equals the query's answer after any sequence of
// upserts, deletes, resurrections, AddColumn, consumer pauses (changes
// read as one refresh) and restarts (bolt: the node reopened and each
// query resumed from its position and held rows; memory: each query
// resumed on the open node), for a key range, an index equality and a
// limited index query, on both stores.
func TestPropertyLiveResultEqualsQuery(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			dir := ""
			if store == "bolt" {
				dir = t.TempDir()
			}
			w := newWall()
			open := func() *Node {
				// NoSync: a crash is not what this test is about, and fsyncs
				// would be most of its time.
				cfg := Config{MeshID: testMesh, Wall: w.Now, SyncInterval: -1, InMemory: dir == "", Dir: dir, NoSync: true}
				n, err := Open(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			n := open()
			defer func() { _ = n.Close() }()
			run := 0
			rapid.Check(t, func(rt *rapid.T) {
				run++
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				table := fmt.Sprintf("t%d", run)
				if err := n.EnsureTable(ctx, liveDef(table)); err != nil {
					rt.Fatal(err)
				}
				queries := []Query{
					{Schema: "app", Table: table, From: 2, To: 6},
					{Schema: "app", Table: table, Index: "by_done", Eq: []any{false}},
					{Schema: "app", Table: table, Index: "by_done", Eq: []any{true}, Limit: 2},
				}
				cons := make([]*liveConsumer, len(queries))
				for i, q := range queries {
					cons[i] = startConsumer(ctx, n, q, nil)
				}
				defer func() {
					for _, c := range cons {
						c.stop()
					}
				}()
				added := false
				for i, ops := 0, rapid.IntRange(1, 25).Draw(rt, "ops"); i < ops; i++ {
					key := map[string]any{"id": rapid.IntRange(0, 7).Draw(rt, "row")}
					switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
					case op < 5:
						vals := map[string]any{}
						if rapid.Bool().Draw(rt, "setDone") {
							vals["done"] = rapid.Bool().Draw(rt, "done")
						}
						if rapid.Bool().Draw(rt, "setRank") {
							vals["rank"] = rapid.IntRange(-3, 3).Draw(rt, "rank")
						}
						if rapid.Bool().Draw(rt, "setTitle") {
							vals["title"] = rapid.SampledFrom([]any{"a", "b", nil}).Draw(rt, "title")
						}
						if added && rapid.Bool().Draw(rt, "setNote") {
							vals["note"] = rapid.IntRange(0, 3).Draw(rt, "note")
						}
						if _, err := n.Upsert(ctx, "app", table, key, vals); err != nil {
							rt.Fatal(err)
						}
					case op < 7:
						if _, err := n.Delete(ctx, "app", table, key); err != nil {
							rt.Fatal(err)
						}
					case op == 7 && !added:
						if err := n.AddColumn(ctx, "app", table, "note"); err != nil {
							rt.Fatal(err)
						}
						added = true
					case op == 8:
						// Restart: stop the consumers, reopen (bolt), resume.
						for _, c := range cons {
							c.stop()
						}
						if dir != "" {
							if err := n.Close(); err != nil {
								rt.Fatal(err)
							}
							// The clock's high-water mark is leased ahead
							// of the wall: a restart an hour later stays
							// within the skew bound.
							w.Advance(time.Hour)
							n = open()
						}
						for j := range cons {
							startConsumer(ctx, n, queries[j], cons[j])
						}
					default:
						// The consumers catch up only here: the changes
						// between checks are read together.
						for _, c := range cons {
							c.check(rt, n)
						}
					}
				}
				for _, c := range cons {
					c.check(rt, n)
				}
			})
		})
	}
}

// A live query resumed after the change log trimmed the changes it
// missed (where Watch answers *WatchLagError) delivers the difference
// without an error: it compares answers, it does not replay changes.
func TestLiveResumesPastATrimmedLog(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1, ChangeLogLimit: 4})
	ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
	defer cancel()
	if err := n.EnsureTable(ctx, liveDef("todos")); err != nil {
		t.Fatal(err)
	}
	q := Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{false}}
	for i := range 3 {
		if _, err := n.Upsert(ctx, "app", "todos", map[string]any{"id": i}, map[string]any{"done": false, "rank": i}); err != nil {
			t.Fatal(err)
		}
	}
	c := startConsumer(ctx, n.Node, q, nil)
	c.check(t, n.Node)
	c.stop()
	after := c.pos
	// While the consumer is away: one row leaves, one enters, one changes,
	// and more changes than the log keeps push them out.
	writes := []struct {
		id   int
		vals map[string]any
	}{{0, map[string]any{"done": true}}, {7, map[string]any{"done": false, "rank": 7}}, {1, map[string]any{"title": "x"}}}
	for _, w := range writes {
		if _, err := n.Upsert(ctx, "app", "todos", map[string]any{"id": w.id}, w.vals); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if _, err := n.Upsert(ctx, "app", "todos", map[string]any{"id": 100 + i}, map[string]any{"done": true}); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range n.Watch(ctx, "app", "todos", after) {
		if !errors.Is(err, ErrWatchLagged) {
			t.Fatalf("watch after %d: %v, want ErrWatchLagged (the log must have trimmed what the consumer missed)", after, err)
		}
		break
	}
	c.events = nil
	startConsumer(ctx, n.Node, q, c)
	defer c.stop()
	c.check(t, n.Node)
	var kinds []string
	for _, e := range c.events {
		kinds = append(kinds, e.Kind.String())
	}
	if got := strings.Join(kinds, " "); got != "leave update enter settled" {
		t.Fatalf("resumed past a trimmed log: %s, want leave update enter settled", got)
	}
}
