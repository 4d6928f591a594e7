// Command todo is a replicated todo list on three syncmesh nodes in one
// process (alice, bob and carol, each with its own bbolt file): a table
// with typed columns and an index, a batch write, queries by the index,
// and a live query on carol that prints the todos entering, changing in
// and leaving her list of open todos as the others' writes arrive.
//
//	go run ./examples/todo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

func main() {
	dir := flag.String("dir", "", "keep the nodes' data here (default: a temporary directory, removed at exit)")
	flag.Parse()
	if _, err := run(context.Background(), *dir); err != nil {
		fmt.Fprintln(os.Stderr, "todo:", err)
		os.Exit(1)
	}
}

// todos is the table: typed columns (a write of another type is refused)
// and an index over (done, due), so "open todos by due date" is one range
// read, in that order.
var todos = runtime.TableDef{
	Schema: "app", Table: "todos",
	KeyColumns: []string{"id"},
	Columns:    []string{"title", "done", "due"},
	Types: map[string]runtime.ColumnType{
		"id": runtime.TypeInteger, "title": runtime.TypeText, "done": runtime.TypeBool, "due": runtime.TypeInteger,
	},
	Indexes: []runtime.IndexDef{{Name: "by_done", Columns: []string{"done", "due"}}},
}

// openTodos is carol's live query: the open todos, soonest due first.
var openTodos = runtime.Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{false}, Limit: 50}

// todo is a row of the table read through struct mapping.
type todo struct {
	ID    int64  `syncmesh:"id,key"`
	Title string `syncmesh:"title"`
	Done  bool   `syncmesh:"done"`
	Due   int64  `syncmesh:"due"`
}

// result is what a run showed, for its test.
type result struct {
	// Live is carol's live list of open todos (titles, in due order) at
	// the end; Open is the same query run at the end on each node.
	Live []string
	Open map[string][]string
	// Events counts carol's live events by kind.
	Events map[runtime.LiveKind]int
	// Done lists the done todos (a query by the index on alice).
	Done []string
	// TypeRefused is the error of a write of a text into the bool column.
	TypeRefused error
}

type node struct {
	name string
	*runtime.Node
}

func run(ctx context.Context, dir string) (result, error) {
	res := result{Open: map[string][]string{}, Events: map[runtime.LiveKind]int{}}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-todo-")
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	network := runtime.NewNetwork(1)
	var nodes []*node
	for _, name := range []string{"alice", "bob", "carol"} {
		n, err := runtime.Open(ctx, runtime.Config{Dir: dir + "/" + name, MeshID: []byte("todo-mesh"), Name: name, SyncInterval: -1})
		if err != nil {
			return res, err
		}
		defer n.Close()
		network.Register(name, n)
		if err := n.EnsureTable(ctx, todos); err != nil {
			return res, err
		}
		nodes = append(nodes, &node{name, n})
	}
	alice, bob, carol := nodes[0], nodes[1], nodes[2]
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			id := b.Identity()
			if err := a.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
				return res, err
			}
			if err := a.AddPeer(b.name, network.Transport(a.name), ""); err != nil {
				return res, err
			}
		}
	}
	syncAll := func() error {
		for _, a := range nodes {
			for _, b := range nodes {
				if a == b {
					continue
				}
				if rep, err := a.SyncNow(ctx, b.name, ""); err != nil || rep.Err != nil {
					return errors.Join(err, rep.Err)
				}
			}
		}
		return nil
	}

	// Carol keeps her list of open todos live: each event says which todo
	// entered, changed in or left the answer; LiveSettled ends a refresh.
	live := &liveList{rows: map[string]runtime.Row{}, events: res.Events}
	feed := make(chan runtime.LiveEvent)
	liveCtx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	go func() {
		defer close(feed)
		for e, err := range carol.Live(liveCtx, openTodos, runtime.LivePosition{}) {
			if err != nil {
				return
			}
			feed <- e
		}
	}()
	catchUp := func() error {
		// Wait for a refresh that read every change carol holds.
		target, err := carol.LastChangeSeq(ctx)
		if err != nil {
			return err
		}
		for !live.settled || live.pos < target {
			e, ok := <-feed
			if !ok {
				return fmt.Errorf("carol's live query ended: %w", ctx.Err())
			}
			live.apply(e)
		}
		return nil
	}
	if err := catchUp(); err != nil {
		return res, err
	}

	step("1. alice writes five todos in one batch: one transaction, one fsync, five signed events")
	var b runtime.Batch
	for i, title := range []string{"buy milk", "call mum", "fix bike", "pay rent", "water plants"} {
		b.Upsert("app", "todos", map[string]any{"id": i + 1}, map[string]any{"title": title, "done": false, "due": 10 * (5 - i)})
	}
	if _, err := alice.Write(ctx, &b); err != nil {
		return res, err
	}
	if err := syncAll(); err != nil {
		return res, err
	}
	if err := catchUp(); err != nil {
		return res, err
	}

	step("2. bob ticks two off; carol renames one; the writes sync")
	for _, id := range []int{2, 5} {
		if _, err := bob.Upsert(ctx, "app", "todos", map[string]any{"id": id}, map[string]any{"done": true}); err != nil {
			return res, err
		}
	}
	if _, err := carol.UpsertStruct(ctx, "app", "todos", todo{ID: 1, Title: "buy oat milk", Due: 50}); err != nil {
		return res, err
	}
	if err := syncAll(); err != nil {
		return res, err
	}
	if err := catchUp(); err != nil {
		return res, err
	}

	step("3. a column is typed: a text written to the bool column is refused, nothing written")
	_, res.TypeRefused = alice.Upsert(ctx, "app", "todos", map[string]any{"id": 3}, map[string]any{"done": "yes"})
	fmt.Printf("   %v\n", res.TypeRefused)

	step("4. queries by the index: the done todos on alice, the open ones on every node")
	for r, err := range alice.Query(ctx, runtime.Query{Schema: "app", Table: "todos", Index: "by_done", Eq: []any{true}}) {
		if err != nil {
			return res, err
		}
		res.Done = append(res.Done, title(r))
	}
	fmt.Printf("   done on alice: %s\n", strings.Join(res.Done, ", "))
	for _, n := range nodes {
		for r, err := range n.Query(ctx, openTodos) {
			if err != nil {
				return res, err
			}
			res.Open[n.name] = append(res.Open[n.name], title(r))
		}
		fmt.Printf("   open on %-7s %s\n", n.name+":", strings.Join(res.Open[n.name], ", "))
	}
	res.Live = live.titles()
	fmt.Printf("   carol's live list: %s\n", strings.Join(res.Live, ", "))
	if !slices.Equal(res.Live, res.Open["carol"]) {
		return res, fmt.Errorf("carol's live list %v differs from the query %v", res.Live, res.Open["carol"])
	}
	for _, n := range nodes {
		if !slices.Equal(res.Open[n.name], res.Open["alice"]) {
			return res, fmt.Errorf("%s's open todos %v differ from alice's %v", n.name, res.Open[n.name], res.Open["alice"])
		}
	}
	return res, nil
}

// liveList is carol's copy of the live answer.
type liveList struct {
	rows    map[string]runtime.Row
	pos     uint64
	settled bool
	events  map[runtime.LiveKind]int
}

func (l *liveList) apply(e runtime.LiveEvent) {
	l.events[e.Kind]++
	k := string(e.Row.Key.Encode())
	switch e.Kind {
	case runtime.LiveEnter, runtime.LiveUpdate:
		l.rows[k] = e.Row
		fmt.Printf("   carol live: %-6s %s\n", e.Kind, title(e.Row))
	case runtime.LiveLeave:
		fmt.Printf("   carol live: %-6s %s\n", e.Kind, title(l.rows[k]))
		delete(l.rows, k)
	case runtime.LiveSettled:
		l.pos, l.settled = e.Seq, true
		fmt.Printf("   carol live: settled at change %d, %d open\n", e.Seq, len(l.rows))
	}
}

// titles lists the held rows in the query's order (Row.Cursor).
func (l *liveList) titles() []string {
	rows := make([]runtime.Row, 0, len(l.rows))
	for _, r := range l.rows {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b runtime.Row) int { return strings.Compare(string(a.Cursor), string(b.Cursor)) })
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		out = append(out, title(r))
	}
	return out
}

func title(r runtime.Row) string {
	var s string
	if _, err := r.Value("title", &s); err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return s
}

func step(s string) { fmt.Printf("\n%s\n", s) }
