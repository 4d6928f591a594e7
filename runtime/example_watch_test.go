package runtime_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/runtime"
)

// Watch streams a table's row changes in change-sequence order. A
// consumer keeps the last Seq it processed and, after a restart, watches
// again after it: nothing is lost or repeated. A consumer that fell
// behind the retained log gets a *runtime.WatchLagError instead of a gap.
func ExampleNode_Watch() {
	ctx := context.Background()
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example"), ChangeLogLimit: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close()
	_ = n.DefineTable(ctx, runtime.TableDef{Schema: "app", Table: "todo", KeyColumns: []string{"id"}, Columns: []string{"title", "done"}})
	_, _ = n.Upsert(ctx, "app", "todo", map[string]any{"id": 1}, map[string]any{"title": "write docs", "done": false})
	_, _ = n.Upsert(ctx, "app", "todo", map[string]any{"id": 1}, map[string]any{"done": true})
	_, _ = n.Delete(ctx, "app", "todo", map[string]any{"id": 1})

	var last uint64
	for c, err := range n.Watch(ctx, "app", "todo", 0) {
		if err != nil {
			fmt.Println(err)
			return
		}
		var done bool
		state, _ := c.Value("done", &done)
		fmt.Printf("change %d: exists=%v cause=%v done=%v (%v)\n", c.Seq, c.Exists, c.Cause, done, state)
		if last = c.Seq; c.Seq == 3 {
			break // caught up; a real consumer keeps watching
		}
	}

	// Four more changes with room for three: resuming after 3 finds a gap.
	for i := 2; i <= 5; i++ {
		_, _ = n.Upsert(ctx, "app", "todo", map[string]any{"id": i}, map[string]any{"title": "more"})
	}
	for _, err := range n.Watch(ctx, "app", "todo", last) {
		var lag *runtime.WatchLagError
		if errors.As(err, &lag) {
			fmt.Printf("lagged: oldest retained %d; re-read the table, then watch after %d\n", lag.Oldest, lag.Resume)
		}
		break
	}
	// Output:
	// change 1: exists=true cause=event done=false (written)
	// change 2: exists=true cause=event done=true (written)
	// change 3: exists=false cause=event done=false (cleared)
	// lagged: oldest retained 5; re-read the table, then watch after 7
}
