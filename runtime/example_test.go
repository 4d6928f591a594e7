package runtime_test

import (
	"context"
	"fmt"
	"log"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

var users = runtime.TableDef{Schema: "app", Table: "users", KeyColumns: []string{"id"}, Columns: []string{"name", "email", "age"}}

// openNode opens an in-memory node of the example mesh with the users
// table defined.
func openNode(ctx context.Context) *runtime.Node {
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh")})
	if err != nil {
		log.Fatal(err)
	}
	if err := n.DefineTable(ctx, users); err != nil {
		log.Fatal(err)
	}
	return n
}

// printRow prints each value column of users row id with its state. An
// unmaterialized column has no value at all, which is not a null.
func printRow(ctx context.Context, n *runtime.Node, id int) {
	row, ok, err := n.Get(ctx, "app", "users", map[string]any{"id": id})
	if err != nil {
		log.Fatal(err)
	}
	if !ok {
		fmt.Printf("row %d: not found\n", id)
		return
	}
	for _, col := range users.Columns {
		var v any
		state, err := row.Value(col, &v)
		if err != nil {
			log.Fatal(err)
		}
		if state == runtime.Unmaterialized {
			fmt.Printf("%s: %s\n", col, state)
			continue
		}
		fmt.Printf("%s: %s %v\n", col, state, v)
	}
}

func ExampleOpen() {
	ctx := context.Background()
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh")})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	if err := n.DefineTable(ctx, users); err != nil {
		log.Fatal(err)
	}
	// name gets a value, email an explicit null; age is never written.
	o, err := n.Upsert(ctx, "app", "users", map[string]any{"id": 1}, map[string]any{"name": "Ada", "email": nil})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("upsert:", o)
	printRow(ctx, n, 1)

	// A delete tombstones the row and clears its written columns.
	if _, err := n.Delete(ctx, "app", "users", map[string]any{"id": 1}); err != nil {
		log.Fatal(err)
	}
	printRow(ctx, n, 1)
	// Output:
	// upsert: applied
	// name: written Ada
	// email: written <nil>
	// age: unmaterialized
	// row 1: not found
}

func ExampleNode_ApplySigned() {
	ctx := context.Background()
	a, b := openNode(ctx), openNode(ctx)
	defer a.Close()
	defer b.Close()

	// B trusts A's signing key.
	id := a.Identity()
	if err := b.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		log.Fatal(err)
	}
	// A signs an event (HLC 0: A's clock assigns one); B applies the bytes.
	raw, err := a.Sign(&messages.Event{
		Schema:  "app",
		Table:   "users",
		Key:     messages.Columns{"id": messages.MustValue(7)},
		Payload: messages.Columns{"name": messages.MustValue("Grace"), "age": messages.MustValue(85)},
	})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 { // delivery is at least once: the second copy is a duplicate
		o, err := b.ApplySigned(ctx, raw)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("from A:", o, "advances watermark:", o.AdvancesWatermark())
	}
	printRow(ctx, b, 7)

	// C is in the same mesh, but B does not trust it: dropped, never held,
	// and a sender's watermark moves past it (SSP/1 §12, §13.6).
	c := openNode(ctx)
	defer c.Close()
	forged, err := c.Sign(&messages.Event{
		Schema:  "app",
		Table:   "users",
		Key:     messages.Columns{"id": messages.MustValue(7)},
		Payload: messages.Columns{"name": messages.MustValue("Mallory")},
	})
	if err != nil {
		log.Fatal(err)
	}
	o, err := b.ApplySigned(ctx, forged)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("from C:", o, "advances watermark:", o.AdvancesWatermark())
	printRow(ctx, b, 7)
	// Output:
	// from A: applied advances watermark: true
	// from A: duplicate advances watermark: true
	// name: written Grace
	// email: unmaterialized
	// age: written 85
	// from C: dropped (signature) advances watermark: true
	// name: written Grace
	// email: unmaterialized
	// age: written 85
}

func ExampleNode_Subscribe() {
	ctx := context.Background()
	n := openNode(ctx)
	defer n.Close()

	resurrected := make(chan messages.Resurrection, 1)
	cancel := n.Subscribe(func(x messages.Notice) {
		if r, ok := x.(messages.Resurrection); ok {
			resurrected <- r
		}
	})
	defer cancel()

	key := map[string]any{"id": 3}
	if _, err := n.Upsert(ctx, "app", "users", key, map[string]any{"name": "Lin"}); err != nil {
		log.Fatal(err)
	}
	if _, err := n.Delete(ctx, "app", "users", key); err != nil {
		log.Fatal(err)
	}
	// A later upsert brings the tombstoned row back: surfaced (SSP/1 §13.2).
	if _, err := n.Upsert(ctx, "app", "users", key, map[string]any{"age": 40}); err != nil {
		log.Fatal(err)
	}
	r := <-resurrected
	var id int
	if err := r.Key["id"].Decode(&id); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("resurrected %s.%s id=%d, upsert beats tombstone: %v\n", r.Schema, r.Table, id, r.By.Beats(r.Tomb))
	// The delete cleared every column its tombstone clock beats, the
	// never-written email included (SSP/1 §13.3); the resurrecting upsert
	// wrote age only, and no retained upsert above the tombstone carries
	// name or email, so the rebuild leaves them cleared (§13.4).
	printRow(ctx, n, 3)
	// Output:
	// resurrected app.users id=3, upsert beats tombstone: true
	// name: cleared <nil>
	// email: cleared <nil>
	// age: written 40
}

func ExampleNode_AddColumn() {
	ctx := context.Background()
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh")})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	// An older schema: no email column yet.
	if err := n.DefineTable(ctx, runtime.TableDef{Schema: "app", Table: "users", KeyColumns: []string{"id"}, Columns: []string{"name"}}); err != nil {
		log.Fatal(err)
	}
	ignored := make(chan messages.ColumnsIgnored, 1)
	cancel := n.Subscribe(func(x messages.Notice) {
		if c, ok := x.(messages.ColumnsIgnored); ok {
			ignored <- c
		}
	})
	defer cancel()

	// An event from a peer on a newer schema (signed here by the node
	// itself, which trusts its own key) carries email too.
	raw, err := n.Sign(&messages.Event{
		Schema:  "app",
		Table:   "users",
		Key:     messages.Columns{"id": messages.MustValue(1)},
		Payload: messages.Columns{"name": messages.MustValue("Ada"), "email": messages.MustValue("ada@example.org")},
	})
	if err != nil {
		log.Fatal(err)
	}
	o, err := n.ApplySigned(ctx, raw)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("apply:", o)
	fmt.Println("ignored:", (<-ignored).Columns)

	show := func() {
		row, _, err := n.Get(ctx, "app", "users", map[string]any{"id": 1})
		if err != nil {
			log.Fatal(err)
		}
		var email string
		state, err := row.Value("email", &email)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("email: %s %q\n", state, email)
	}
	show()
	// The migration adds the column; it is rebuilt from the retained log.
	if err := n.AddColumn(ctx, "app", "users", "email"); err != nil {
		log.Fatal(err)
	}
	show()
	// Output:
	// apply: applied
	// ignored: [email]
	// email: unmaterialized ""
	// email: written "ada@example.org"
}

func ExampleNode_SetHorizon() {
	ctx := context.Background()
	n := openNode(ctx)
	defer n.Close()

	// signAt signs an upsert of row id at a fixed HLC.
	signAt := func(id int, ms uint64) []byte {
		h, err := messages.NewHLC(ms, 0)
		if err != nil {
			log.Fatal(err)
		}
		raw, err := n.Sign(&messages.Event{
			HLC:     h,
			Schema:  "app",
			Table:   "users",
			Key:     messages.Columns{"id": messages.MustValue(id)},
			Payload: messages.Columns{"name": messages.MustValue(fmt.Sprint("user ", id))},
		})
		if err != nil {
			log.Fatal(err)
		}
		return raw
	}
	apply := func(raw []byte) {
		o, err := n.ApplySigned(ctx, raw)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("apply:", o)
	}

	apply(signAt(1, 1_000))
	horizon, err := messages.NewHLC(2_000, 0)
	if err != nil {
		log.Fatal(err)
	}
	// The retained log below the horizon is reclaimed; the row stays.
	reclaimed, err := n.SetHorizon(ctx, "app", "users", horizon)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reclaimed log entries:", reclaimed)
	printRow(ctx, n, 1)

	// An event below the horizon counts as applied and writes nothing
	// (SSP/1 §13.5).
	apply(signAt(2, 1_500))
	printRow(ctx, n, 2)
	// Output:
	// apply: applied
	// reclaimed log entries: 1
	// name: written user 1
	// email: unmaterialized
	// age: unmaterialized
	// apply: applied (below horizon)
	// row 2: not found
}
