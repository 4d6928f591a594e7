package runtime_test

import (
	"context"
	"fmt"
	"log"

	"github.com/syncmesh/syncmesh/runtime"
)

// ExampleNode_Rehydrate: b evicted below a horizon, so when a's later
// write resurrects a deleted row, b's rebuild is partial (the email a
// wrote between the delete and b's horizon comes back null). Rehydrate
// takes the history below the horizon back from a, and the row is whole.
func ExampleNode_Rehydrate() {
	ctx := context.Background()
	net := runtime.NewNetwork(1)
	open := func(name string) *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh"), Name: name,
			SyncInterval: -1, ReconcileInterval: -1})
		if err != nil {
			log.Fatal(err)
		}
		if err := n.DefineTable(ctx, users); err != nil {
			log.Fatal(err)
		}
		net.Register(name, n)
		return n
	}
	a, b := open("a"), open("b")
	defer a.Close()
	defer b.Close()
	for _, pair := range [][2]*runtime.Node{{a, b}, {b, a}} {
		id := pair[1].Identity()
		if err := pair[0].Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
			log.Fatal(err)
		}
		if err := pair[0].AddPeer(pair[1].Name(), net.Transport(pair[0].Name()), ""); err != nil {
			log.Fatal(err)
		}
	}
	row := map[string]any{"id": 1}
	must := func(_ any, err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	must(a.Upsert(ctx, "app", "users", row, map[string]any{"name": "ada"}))
	must(a.Delete(ctx, "app", "users", row))
	must(a.SyncNow(ctx, "b", ""))
	must(a.Upsert(ctx, "app", "users", row, map[string]any{"email": "ada@example.org"}))
	// b evicts everything up to a's clock before that write reaches it.
	must(b.SetHorizon(ctx, "app", "users", a.Clock()+1))
	must(a.Upsert(ctx, "app", "users", row, map[string]any{"age": 36}))
	must(a.SyncNow(ctx, "b", ""))
	email := func() string {
		r, _, err := b.Get(ctx, "app", "users", row)
		if err != nil {
			log.Fatal(err)
		}
		var s *string
		st, err := r.Value("email", &s)
		if err != nil {
			log.Fatal(err)
		}
		if s == nil {
			return fmt.Sprint(st, " null")
		}
		return fmt.Sprint(st, " ", *s)
	}
	fmt.Println("before:", email())
	rep, err := b.Rehydrate(ctx, "app", "users", "a")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fetched:", rep.Fetched, "completed rows:", len(rep.Completed))
	fmt.Println("after:", email())
	// Output:
	// before: cleared null
	// fetched: 3 completed rows: 1
	// after: written ada@example.org
}
