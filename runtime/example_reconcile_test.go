package runtime_test

import (
	"context"
	"fmt"
	"log"

	"github.com/syncmesh/syncmesh/runtime"
)

// ExampleNode_Reconcile: b trusts a too late, so a's push is dropped and
// a's cursor moves past it; reconciliation brings the row.
func ExampleNode_Reconcile() {
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
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		log.Fatal(err)
	}
	if err := b.AddPeer("a", net.Transport("b"), ""); err != nil {
		log.Fatal(err)
	}
	if _, err := a.Upsert(ctx, "app", "users", map[string]any{"id": 1}, map[string]any{"name": "ada"}); err != nil {
		log.Fatal(err)
	}
	if _, err := a.SyncNow(ctx, "b", ""); err != nil { // dropped at b: a's key is unknown there
		log.Fatal(err)
	}
	id := a.Identity()
	if err := b.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		log.Fatal(err)
	}
	rep, err := b.Reconcile(ctx, "a")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("missing:", rep.Missing, "fetched:", rep.Fetched)
	_, ok, err := b.Get(ctx, "app", "users", map[string]any{"id": 1})
	fmt.Println("b has the row:", ok, err)
	rep, _ = b.Reconcile(ctx, "a")
	fmt.Println("again:", rep.Missing, "missing in", rep.Rounds, "round trip")
	// Output:
	// missing: 1 fetched: 1
	// b has the row: true <nil>
	// again: 0 missing in 1 round trip
}
