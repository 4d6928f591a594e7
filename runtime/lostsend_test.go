package runtime

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// TestAckOfLostSendIsReportedToTheApplication: a receive result that
// acknowledges a message the store does not know it sent (the device
// layer's UnknownAck, actors/device.TestAckOfMessageLostByRollbackIsReported)
// reaches the application as a SentMessageLost notice naming the peer and
// the id, and counts in syncmesh_delivery_lost_sends_acknowledged_total;
// an ordinary ACK does neither.
func TestAckOfLostSendIsReportedToTheApplication(t *testing.T) {
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	net := NewNetwork(1)
	alice := openTestNode(t, Config{Name: "alice", SyncInterval: -1, Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	got := make(chan messages.SentMessageLost, 4)
	defer alice.Subscribe(func(x messages.Notice) {
		if v, ok := x.(messages.SentMessageLost); ok {
			got <- v
		}
	})()
	id := MessageID{7}
	if err := alice.noteReceived(ReceiveResult{Kind: Acknowledgement, Sender: bAddr, ID: MessageID{8}, Cleared: true}, nil); err != nil {
		t.Fatal(err)
	}
	if err := alice.noteReceived(ReceiveResult{Kind: Acknowledgement, Sender: bAddr, ID: id, UnknownAck: true}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v.Peer != bAddr || v.ID != id {
			t.Fatalf("SentMessageLost = %+v, want peer %s id %s", v, bAddr, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no SentMessageLost notice for an ACK of a lost send")
	}
	select {
	case v := <-got:
		t.Fatalf("second notice %+v (an ordinary ACK is not a lost send)", v)
	case <-time.After(50 * time.Millisecond):
	}
	if v := counterValue(t, alice, "syncmesh_delivery_lost_sends_acknowledged_total"); v != 1 {
		t.Fatalf("syncmesh_delivery_lost_sends_acknowledged_total = %v, want 1", v)
	}
}
