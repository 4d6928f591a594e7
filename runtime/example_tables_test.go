package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/syncmesh/syncmesh/runtime"
)

// todos declares its column types: local writes are checked against them.
var todos = runtime.TableDef{Schema: "app", Table: "todos", KeyColumns: []string{"id"}, Columns: []string{"title", "done"},
	Types: map[string]runtime.ColumnType{"id": runtime.TypeInteger, "title": runtime.TypeText, "done": runtime.TypeBool}}

func openTodos(ctx context.Context) *runtime.Node {
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh")})
	if err != nil {
		log.Fatal(err)
	}
	if err := n.EnsureTable(ctx, todos); err != nil {
		log.Fatal(err)
	}
	return n
}

// Many rows in one call: each row its own signed event, all durable in one
// transaction, visible all at once. One bad row refuses the whole batch.
func ExampleNode_Write() {
	ctx := context.Background()
	n := openTodos(ctx)
	defer n.Close()

	var b runtime.Batch
	for i := 1; i <= 3; i++ {
		b.Upsert("app", "todos", map[string]any{"id": i}, map[string]any{"title": fmt.Sprintf("task %d", i), "done": false})
	}
	outs, err := n.Write(ctx, &b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("written:", len(outs), "events, all", outs[0].Kind)

	b.Reset()
	b.Upsert("app", "todos", map[string]any{"id": 4}, map[string]any{"title": "ok"})
	b.Upsert("app", "todos", map[string]any{"id": 5}, map[string]any{"done": "yes"}) // not a bool
	_, err = n.Write(ctx, &b)
	var be *runtime.BatchError
	if errors.As(err, &be) && errors.Is(err, runtime.ErrTypeMismatch) {
		fmt.Println("refused at write", be.Index)
	}
	_, found, _ := n.Get(ctx, "app", "todos", map[string]any{"id": 4})
	fmt.Println("row 4 written:", found)
	// Output:
	// written: 3 events, all applied
	// refused at write 1
	// row 4 written: false
}

// EnsureTable is the start-up call: idempotent, it adds the columns a
// build declares and the store lacks, and accepts a store that is ahead.
func ExampleNode_EnsureTable() {
	ctx := context.Background()
	n := openTodos(ctx)
	defer n.Close()

	// A newer release adds a column...
	v2 := todos
	v2.Columns = append([]string{}, "title", "done", "due")
	if err := n.EnsureTable(ctx, v2); err != nil {
		log.Fatal(err)
	}
	// ...and a rollback starts with the older definition: no error.
	if err := n.EnsureTable(ctx, todos); err != nil {
		log.Fatal(err)
	}
	defs, _ := n.Tables(ctx)
	fmt.Println(defs[0].Columns)
	// Output: [title done due]
}

// A row read and written as a Go struct. Field keeps the cell's state: a
// column never written is Unmaterialized, which is neither a zero nor a
// null.
func ExampleRow_Decode() {
	ctx := context.Background()
	n := openTodos(ctx)
	defer n.Close()

	type Todo struct {
		ID    int                 `syncmesh:"id,key"`
		Title string              `syncmesh:"title"`
		Done  runtime.Field[bool] `syncmesh:"done"`
	}
	// Done left Unmaterialized: the column is not written.
	if _, err := n.UpsertStruct(ctx, "app", "todos", Todo{ID: 1, Title: "milk"}); err != nil {
		log.Fatal(err)
	}
	row, _, err := n.Get(ctx, "app", "todos", map[string]any{"id": 1})
	if err != nil {
		log.Fatal(err)
	}
	var t Todo
	if err := row.Decode(&t); err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.ID, t.Title, t.Done.State)

	t.Done = runtime.FieldOf(true)
	if _, err := n.UpsertStruct(ctx, "app", "todos", t); err != nil {
		log.Fatal(err)
	}
	row, _, _ = n.Get(ctx, "app", "todos", map[string]any{"id": 1})
	if err := row.Decode(&t); err != nil {
		log.Fatal(err)
	}
	fmt.Println(t.ID, t.Title, t.Done.State, t.Done.Value)
	// Output:
	// 1 milk unmaterialized
	// 1 milk written true
}
