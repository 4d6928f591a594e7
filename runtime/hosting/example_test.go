package hosting_test

import (
	"context"
	"fmt"
	"os"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
)

// Two hosted devices exchange a message through a Placement; the same
// code runs on a cluster member (hosting.NewCluster) instead of a Local.
func ExampleClient() {
	root, _ := os.MkdirTemp("", "hosting-example-")
	defer os.RemoveAll(root)
	p, err := hosting.NewLocal(hosting.Config{Root: root, MeshID: []byte("example-mesh")}, nil)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	// Every call acts for a principal; units exist once their tenant
	// created them.
	ctx := hosting.WithPrincipal(context.Background(), hosting.Principal{Tenant: "acme"})
	c := hosting.Client{P: p}
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 1}
	id := messages.LogicalMessageID{0x42}
	for _, d := range []messages.DeviceAddress{alice, bob} {
		if _, err := c.Create(ctx, hosting.KindDevice, hosting.DeviceIdentity(d)); err != nil {
			panic(err)
		}
	}
	if _, err := c.Send(ctx, alice, bob, id, []byte("hello")); err != nil {
		panic(err)
	}
	pending, _ := c.Pending(ctx, bob)
	fmt.Printf("bob has %d pending: %s\n", len(pending), pending[0].Body)
	res, _ := c.Commit(ctx, bob, alice, id)
	fmt.Println("committed:", res.Status == uint8(runtime.Committed), "ack sent:", res.AckSent)
	sent, _ := c.PendingSent(ctx, alice)
	fmt.Println("alice still waiting for", len(sent), "ACKs")
	// Output:
	// bob has 1 pending: hello
	// committed: true ack sent: true
	// alice still waiting for 0 ACKs
}
