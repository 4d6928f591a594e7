package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// twoDevices opens alice and bob with both planes on one Network.
func twoDevices(t *testing.T, net *Network, bobCfg func(*DeviceConfig)) (alice, bob *testNode) {
	t.Helper()
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	alice = openTestNode(t, Config{Name: "alice", SyncInterval: -1, Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	bc := &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}
	if bobCfg != nil {
		bobCfg(bc)
	}
	bob = openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: bc})
	for _, n := range []*testNode{alice, bob} {
		net.Register(n.Name(), n.Node)
		net.RegisterDevice(n.Name(), n.Node)
	}
	return alice, bob
}

func TestNodeCarriesBothPlanes(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	alice, bob := twoDevices(t, net, nil)
	// Sync plane.
	for _, n := range []*testNode{alice, bob} {
		n.define(defT)
	}
	trustNode(t, bob.Node, alice.Node)
	if err := alice.AddPeer("bob", net.Transport("alice"), ""); err != nil {
		t.Fatal(err)
	}
	if err := bob.AcceptPeer("alice"); err != nil {
		t.Fatal(err)
	}
	upsertN(t, alice.Node, 0, 3, "a")
	if rep, err := alice.SyncNow(ctx, "bob", ""); err != nil || !rep.Done() {
		t.Fatal(err, rep)
	}
	if state(t, alice.Node) != state(t, bob.Node) {
		t.Fatal("tables differ")
	}
	// Delivery plane.
	sent, err := alice.Send(ctx, bob.DeviceAddress(), []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	var m ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	if string(m.Plaintext) != "hello" || m.ID != sent.ID || m.Sender != alice.DeviceAddress() {
		t.Fatalf("delivered %+v", m)
	}
	if n, _ := alice.PendingSentMessages(ctx, 0, 10, nil); len(n.Messages) != 1 {
		t.Fatalf("before the commit alice has %d pending sent", len(n.Messages))
	}
	res, err := bob.CommitMessage(ctx, m)
	if err != nil || res.Status != Committed || !res.AckSent {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := alice.PendingSentMessages(ctx, 0, 10, nil); len(p.Messages) != 0 {
		t.Fatalf("after the ACK alice still has %d pending sent", len(p.Messages))
	}
	if c, _ := bob.PendingReceivedMessageCount(ctx, nil); c != 0 {
		t.Fatalf("bob has %d pending after commit", c)
	}
}

func TestNodeWithoutDeviceRefusesDeliveryCalls(t *testing.T) {
	n := openTestNode(t, Config{})
	if _, err := n.Send(context.Background(), DeviceAddress{User: "x", Device: 1}, nil); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Send without a device: %v", err)
	}
	if n.Sessions() != nil {
		t.Fatal("device accessors on a node without a device")
	}
	// Messages is never nil: a range over it ends.
	for range n.Messages() {
		t.Fatal("a message on a node without a device")
	}
}

func TestDeviceConfigIsValidated(t *testing.T) {
	_, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, Device: &DeviceConfig{Address: DeviceAddress{User: "a", Device: 1}}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Device.Transport" {
		t.Fatalf("missing transport: %v", err)
	}
}
