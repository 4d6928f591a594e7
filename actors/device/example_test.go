package device_test

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// openExampleDevice opens a device on an in-memory store, reachable on net.
func openExampleDevice(sys *actor.ActorSystem, net *session.InProcess, addr messages.DeviceAddress) *device.Device {
	d, err := device.Open(context.Background(), sys, device.Config{
		Store:     memory.NewDelivery(),
		Transport: net.Endpoint(addr),
		Session:   func(c *session.Config) { c.RefreshInterval = -1 },
	})
	if err != nil {
		panic(err)
	}
	net.Register(addr, d.Sessions())
	return d
}

// The commit boundary end to end: a received message stays pending until
// the application commits it, and only the commit sends the ACK that
// clears the sender's pending message.
func Example() {
	ctx := context.Background()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	net := session.NewInProcess()
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	bob := messages.DeviceAddress{User: "bob", Device: 1}
	a := openExampleDevice(sys, net, alice)
	defer a.Close()
	b := openExampleDevice(sys, net, bob)
	defer b.Close()

	if _, err := a.Send(ctx, bob, []byte("hello bob")); err != nil {
		panic(err)
	}
	for _, e := range net.Take(bob) { // the transport delivers the envelope
		r, err := b.Receive(ctx, e.From, e.Envelope)
		if err != nil {
			panic(err)
		}
		fmt.Println(r.Kind, string(r.Message.Plaintext))
	}
	n, _ := b.PendingReceivedMessageCount(ctx, nil)
	fmt.Println("pending at bob:", n)

	// The application applies the message in its own transaction, keyed
	// by (sender, id), then commits it.
	page, _ := b.PendingReceivedMessages(ctx, 0, device.MaxPageSize, nil)
	for _, m := range page.Messages {
		c, err := b.CommitMessage(ctx, m)
		if err != nil {
			panic(err)
		}
		fmt.Println(c.Status, "ackSent:", c.AckSent)
	}
	for _, e := range net.Take(alice) {
		r, _ := a.Receive(ctx, e.From, e.Envelope)
		fmt.Println(r.Kind, "cleared:", r.Cleared)
	}
	sent, _ := a.PendingSentMessages(ctx, 0, device.MaxPageSize, nil)
	fmt.Println("pending at alice:", len(sent.Messages))
	// Output:
	// DELIVERY hello bob
	// pending at bob: 1
	// COMMITTED ackSent: true
	// ACKNOWLEDGEMENT cleared: true
	// pending at alice: 0
}

// Discarding a message the application can never apply: the reason stays
// local, the sender gets the same ACK as for a commit.
func ExampleDevice_DiscardReceivedMessage() {
	ctx := context.Background()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	net := session.NewInProcess()
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	bob := messages.DeviceAddress{User: "bob", Device: 1}
	a := openExampleDevice(sys, net, alice)
	defer a.Close()
	b := openExampleDevice(sys, net, bob)
	defer b.Close()

	sm, _ := a.Send(ctx, bob, []byte{0xff})
	for _, e := range net.Take(bob) {
		_, _ = b.Receive(ctx, e.From, e.Envelope)
	}
	c, _ := b.DiscardReceivedMessage(ctx, alice, sm.ID, persistence.DiscardMalformed)
	p, _, _ := b.ProcessedMessage(ctx, alice, sm.ID)
	fmt.Println(c.Status, p.Finalization, p.Reason)
	// Output:
	// DISCARDED discarded malformed
}

// Processed ids are kept for duplicate suppression until the application
// prunes them with an explicit retention policy.
func ExampleDevice_PruneProcessedMessages() {
	ctx := context.Background()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	net := session.NewInProcess()
	bob := messages.DeviceAddress{User: "bob", Device: 1}
	b := openExampleDevice(sys, net, bob)
	defer b.Close()

	n, err := b.PruneProcessedMessages(ctx, device.RetentionPolicy{MaxAge: 30 * 24 * time.Hour})
	fmt.Println(n, err)
	_, err = b.PruneProcessedMessages(ctx, device.RetentionPolicy{MaxAge: 0})
	fmt.Println(err)
	// Output:
	// 0 <nil>
	// inbound: retention maxAge must be positive: 0s
}
