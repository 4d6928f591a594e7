package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syncmesh/syncmesh/messages"
)

// TestReceiverSurfacesReusedMessageID: a message that reuses a committed
// message's logical id with another body is refused at the receiver, as
// before, and now also surfaced there: a LogicalMessageConflict notice
// naming sender and id, the counter
// syncmesh_delivery_message_conflicts_total, and a WARN log line. On the
// base commit the receiver recorded nothing of it (no notice arrived).
func TestReceiverSurfacesReusedMessageID(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	alice, bob := twoDevices(t, net, nil)
	ns := bob.collect()
	sent, err := alice.Send(ctx, bob.DeviceAddress(), []byte("first body"))
	if err != nil {
		t.Fatal(err)
	}
	var m ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	if res, err := bob.CommitMessage(ctx, m); err != nil || res.Status != Committed {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The ACK cleared alice's copy and retired the id: she refuses it
	// for another body until her prune forgets it. Past that (or from a
	// sender that does not keep to the rule) the id comes again, with
	// another body.
	if _, err := alice.SendWithID(ctx, bob.DeviceAddress(), sent.ID, []byte("another body")); !errors.Is(err, ErrLogicalIDReused) {
		t.Fatalf("SendWithID of an acknowledged id with another body: %v, want ErrLogicalIDReused", err)
	}
	alice.wall.Advance(time.Second)
	if _, err := alice.PruneProcessedMessages(ctx, MaxAgeRetention(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.SendWithID(ctx, bob.DeviceAddress(), sent.ID, []byte("another body")); err != nil {
		t.Fatal(err)
	}
	got := ns.waitFor(t, "conflict notice", func(x messages.Notice) bool {
		_, ok := x.(messages.LogicalMessageConflict)
		return ok
	}).(messages.LogicalMessageConflict)
	if got.From != alice.DeviceAddress() || got.ID != sent.ID || !got.Finalized {
		t.Fatalf("notice %+v: want from %s, id %s, stored copy finalized", got, alice.DeviceAddress(), sent.ID)
	}
	if c := testutil.ToFloat64(bob.conflicts); c < 1 {
		t.Fatalf("conflict counter %v", c)
	}
}
