package runtime_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// Two nodes sync a table over the in-process network: each pushes its log
// past its durable cursor for the other, and both end with the same rows
// and each other's watermarks.
func ExampleNode_AddPeer() {
	ctx := context.Background()
	net := runtime.NewNetwork(1)
	open := func(name string) *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh"), Name: name, SyncInterval: -1})
		if err != nil {
			log.Fatal(err)
		}
		if err := n.DefineTable(ctx, users); err != nil {
			log.Fatal(err)
		}
		net.Register(name, n)
		return n
	}
	alice, bob := open("alice"), open("bob")
	defer alice.Close()
	defer bob.Close()
	for _, pair := range [][2]*runtime.Node{{alice, bob}, {bob, alice}} {
		id := pair[1].Identity()
		if err := pair[0].Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
			log.Fatal(err)
		}
		if err := pair[0].AddPeer(pair[1].Name(), net.Transport(pair[0].Name()), ""); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := alice.Upsert(ctx, "app", "users", map[string]any{"id": 1}, map[string]any{"name": "Ada"}); err != nil {
		log.Fatal(err)
	}
	// SyncInterval -1: cycles run when asked (a timer runs them otherwise).
	rep, err := alice.SyncNow(ctx, "bob", "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("alice → bob: %d offered, %d applied, everything offered: %v\n", rep.Offered, rep.Result.Applied, rep.Done())
	printRow(ctx, bob, 1)
	peers, _ := alice.Peers(ctx)
	fmt.Printf("bob's cursor at alice: %d of %d\n", peers[0].Cursor, peers[0].Tail)
	// Output:
	// alice → bob: 1 offered, 1 applied, everything offered: true
	// name: written Ada
	// email: unmaterialized
	// age: unmaterialized
	// bob's cursor at alice: 1 of 1
}

// A message between two devices: pending at the receiver until its
// application commits it; the ACK that follows clears it at the sender.
func ExampleNode_Send() {
	ctx := context.Background()
	net := runtime.NewNetwork(1)
	open := func(name string) *runtime.Node {
		addr := runtime.DeviceAddress{User: name, Device: 1}
		n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example-mesh"), Name: name,
			Device: &runtime.DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Buffer: 8}})
		if err != nil {
			log.Fatal(err)
		}
		net.RegisterDevice(name, n)
		return n
	}
	alice, bob := open("alice"), open("bob")
	defer alice.Close()
	defer bob.Close()

	if _, err := alice.Send(ctx, bob.DeviceAddress(), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	var m runtime.ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(10 * time.Second):
		log.Fatal("nothing received")
	}
	pending, _ := bob.PendingReceivedMessageCount(ctx, nil)
	fmt.Printf("bob got %q from %s; pending: %d\n", m.Plaintext, m.Sender, pending)

	res, err := bob.CommitMessage(ctx, m) // after the application applied it
	if err != nil {
		log.Fatal(err)
	}
	if err := net.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	waiting, _ := alice.PendingSentMessages(ctx, 0, 10, nil)
	fmt.Printf("bob: %s, ACK sent: %v; alice still waiting for %d ACKs\n", res.Status, res.AckSent, len(waiting.Messages))
	// Output:
	// bob got "hello" from alice.1; pending: 1
	// bob: COMMITTED, ACK sent: true; alice still waiting for 0 ACKs
}
