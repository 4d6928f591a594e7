package runtime

import (
	"context"
	"testing"
	"time"
)

// TestOnMessageCarriesTheNodeAndTheDeliveryCount: the OnMessage handler
// gets the node (it commits through Delivered.Commit, which ACKs the
// sender) and how the message was delivered: first time, or pending from
// before a restart (Redelivered), with a hand-off count persisted on bbolt
// across restarts (1, then 2 and 3 after two restarts without a commit).
// Messages is never nil.
func TestOnMessageCarriesTheNodeAndTheDeliveryCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	alice := openTestNode(t, Config{Name: "alice", SyncInterval: -1, ReconcileInterval: -1,
		Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	net.RegisterDevice("alice", alice.Node)
	w := newWall()
	dir := t.TempDir()
	got := make(chan Delivered, 4)
	commit := make(chan bool, 4)
	// The handler's commit result: the test waits for it before its
	// cleanup closes bob (the ACK can clear alice's entry before the
	// commit call has returned to the handler).
	committed := make(chan error, 1)
	openBob := func() *testNode {
		bob := openTestNode(t, Config{Name: "bob", Dir: dir, NoSync: true, Wall: w.Now, SyncInterval: -1, ReconcileInterval: -1,
			Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr),
				OnMessage: func(ctx context.Context, d Delivered) {
					got <- d
					if <-commit {
						_, err := d.Commit(ctx)
						committed <- err
					}
				}}})
		net.RegisterDevice("bob", bob.Node)
		return bob
	}
	bob := openBob()
	for range bob.Messages() {
		t.Fatal("a message on the channel of a node with a handler")
	}
	commit <- false // the first hand-off returns without committing
	sent, err := alice.Send(ctx, bAddr, []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	var d Delivered
	select {
	case d = <-got:
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	if d.Node != bob.Node || d.ID != sent.ID || d.Deliveries != 1 || d.Redelivered {
		t.Fatalf("first delivery: node %p (bob %p), id %v, deliveries %d, redelivered %v", d.Node, bob.Node, d.ID, d.Deliveries, d.Redelivered)
	}
	// Closed and reopened without a commit, twice: the persisted count
	// goes on from where the last process left it (2, then 3).
	for i, want := range []int{2, 3} {
		if err := bob.Close(); err != nil {
			t.Fatal(err)
		}
		net.UnregisterDevice(bAddr)
		w.Advance(time.Second)
		commit <- i == 1
		bob = openBob()
		select {
		case d = <-got:
		case <-ctx.Done():
			t.Fatalf("no redelivery after restart %d", i+1)
		}
		if d.Node != bob.Node || d.ID != sent.ID || d.Deliveries != want || !d.Redelivered {
			t.Fatalf("redelivery after restart %d: id %v, deliveries %d (want %d), redelivered %v", i+1, d.ID, d.Deliveries, want, d.Redelivered)
		}
	}
	for {
		p, err := alice.PendingSentMessages(ctx, 0, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Messages) == 0 {
			break
		}
		if err := net.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the commit through Delivered never ACKed alice")
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case err := <-committed:
		if err != nil {
			t.Fatalf("commit: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the handler's commit never returned")
	}
	if c, err := bob.PendingReceivedMessageCount(ctx, nil); err != nil || c != 0 {
		t.Fatalf("bob pending %d, %v", c, err)
	}
}
