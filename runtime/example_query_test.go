package runtime_test

import (
	"context"
	"fmt"
	"log"

	"github.com/syncmesh/syncmesh/runtime"
)

// A secondary index and a query over it: equality on the leading column,
// a range on the next, in the index's natural order, a page at a time.
func ExampleNode_Query() {
	ctx := context.Background()
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh")})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	tasks := runtime.TableDef{Schema: "app", Table: "tasks", KeyColumns: []string{"id"}, Columns: []string{"owner", "prio", "title"},
		Types:   map[string]runtime.ColumnType{"id": runtime.TypeInteger, "owner": runtime.TypeText, "prio": runtime.TypeInteger, "title": runtime.TypeText},
		Indexes: []runtime.IndexDef{{Name: "by_owner_prio", Columns: []string{"owner", "prio"}}}}
	if err := n.EnsureTable(ctx, tasks); err != nil {
		log.Fatal(err)
	}
	var b runtime.Batch
	for i, t := range []struct {
		owner string
		prio  int
		title string
	}{{"ann", 2, "water plants"}, {"bob", 1, "pay rent"}, {"ann", -1, "someday"}, {"ann", 10, "file taxes"}, {"ann", 3, "call mum"}} {
		b.Upsert("app", "tasks", map[string]any{"id": i + 1}, map[string]any{"owner": t.owner, "prio": t.prio, "title": t.title})
	}
	if _, err := n.Write(ctx, &b); err != nil {
		log.Fatal(err)
	}

	// Ann's tasks with priority 0 and up, two at a time.
	q := runtime.Query{Schema: "app", Table: "tasks", Index: "by_owner_prio", Eq: []any{"ann"}, From: 0, Limit: 2}
	for page := 1; ; page++ {
		var last runtime.Cursor
		for r, err := range n.Query(ctx, q) {
			if err != nil {
				log.Fatal(err)
			}
			var title string
			var prio int
			_, _ = r.Value("title", &title)
			_, _ = r.Value("prio", &prio)
			fmt.Printf("page %d: %d %s\n", page, prio, title)
			last = r.Cursor
		}
		if last == nil {
			break
		}
		q.After = last
	}
	// Output:
	// page 1: 2 water plants
	// page 1: 3 call mum
	// page 2: 10 file taxes
}
