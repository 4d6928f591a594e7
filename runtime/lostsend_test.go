package runtime

import (
	"context"
	"path/filepath"
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

// TestRestoreReportsTheSendsItLost: alice's node.db is restored from a
// copy taken before she sent three more messages (all delivered and
// committed by bob, two of them acknowledged at alice; the third left
// pending). The restored store holds none of them: the Open reports the
// three sends it lost (RestoreStatus.DeliveryLostSends,
// syncmesh_delivery_lost_sends_total), once, and the next send gets a
// sequence above every one the lost copy assigned.
func TestRestoreReportsTheSendsItLost(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	openAlice := func() *testNode {
		a := openTestNode(t, Config{Name: "alice", Dir: dir, NoSync: true, SyncInterval: -1,
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
		net.Register(a.Name(), a.Node)
		net.RegisterDevice(a.Name(), a.Node)
		return a
	}
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr,
		Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	net.Register(bob.Name(), bob.Node)
	net.RegisterDevice(bob.Name(), bob.Node)
	alice := openAlice()
	send := func(body string) SentMessage {
		t.Helper()
		sm, err := alice.Send(ctx, bAddr, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		receiveCommit(t, bob, body)
		if err := net.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		return sm
	}
	send("before the copy")
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "node.db")
	copyFile(t, filepath.Join(dir, "node.db"), backup)
	alice = openAlice()
	if st := alice.RestoreStatus(); st.DeliveryLostSends != 0 {
		t.Fatalf("a plain restart reports lost sends: %+v", st)
	}
	send("after the copy 1")
	send("after the copy 2")
	last := send("after the copy 3")
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	copyFile(t, backup, filepath.Join(dir, "node.db"))
	alice = openAlice()
	if st := alice.RestoreStatus(); st.DeliveryLostSends != 3 {
		t.Fatalf("RestoreStatus after the restore: %+v, want DeliveryLostSends 3", st)
	}
	if v := counterValue(t, alice, "syncmesh_delivery_lost_sends_total"); v != 3 {
		t.Fatalf("syncmesh_delivery_lost_sends_total = %v, want 3", v)
	}
	next := send("after the restore")
	if next.Sequence <= last.Sequence {
		t.Fatalf("the send after the restore got sequence %d, the lost copy had assigned up to %d", next.Sequence, last.Sequence)
	}
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	alice = openAlice()
	if st := alice.RestoreStatus(); st.DeliveryLostSends != 0 {
		t.Fatalf("the lost sends are reported again on the next Open: %+v", st)
	}
}
