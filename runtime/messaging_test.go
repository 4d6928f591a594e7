package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
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
	if n.LiveSessions() != 0 {
		t.Fatal("device accessors on a node without a device")
	}
	peer := DeviceAddress{User: "x", Device: 1}
	if err := n.ResetSession(context.Background(), peer); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("ResetSession without a device: %v", err)
	}
	if err := n.AcceptIdentity(context.Background(), peer, ratchet.IdentityPublic{}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("AcceptIdentity without a device: %v", err)
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

// TestDeliveryWithWallClockBehindTheMark: alice reopens with her wall
// clock set back 10 minutes below her clock mark (past the skew bound:
// her local writes are refused). Her delivery plane does not use that
// clock: a message to bob is delivered, committed, and its ACK clears it
// at alice.
func TestDeliveryWithWallClockBehindTheMark(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	w := newWall()
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	openAlice := func() *testNode {
		return openTestNode(t, Config{Name: "alice", Dir: dir, NoSync: true, Wall: w.Now, SyncInterval: -1,
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	}
	alice := openAlice()
	alice.define(defT)
	alice.write(1)
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	w.Advance(-10 * time.Minute)
	alice = openAlice()
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	for _, n := range []*testNode{alice, bob} {
		net.Register(n.Name(), n.Node)
		net.RegisterDevice(n.Name(), n.Node)
	}
	if err := alice.clockHealth(); !errors.Is(err, ErrClockBehind) {
		t.Fatalf("setup: alice's clock is not behind its mark: %v", err)
	}
	if _, err := alice.Upsert(ctx, "app", "t", map[string]any{"id": 2}, map[string]any{"a": 2}); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("setup: write with the clock behind: %v", err)
	}
	sent, err := alice.Send(ctx, bob.DeviceAddress(), []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	var m ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery with alice's clock behind her mark")
	}
	if string(m.Plaintext) != "hello" || m.ID != sent.ID {
		t.Fatalf("delivered %+v", m)
	}
	if res, err := bob.CommitMessage(ctx, m); err != nil || res.Status != Committed {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := alice.PendingSentMessages(ctx, 0, 10, nil); len(p.Messages) != 0 {
		t.Fatalf("after the ACK alice still has %d pending sent", len(p.Messages))
	}
}

// CheckPending hands back the runtime's StalePending, each field carried
// over from the device layer: a received message left uncommitted past
// StaleAfter is reported once, with its sender, id and reason.
func TestCheckPendingReportsStaleReceived(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	alice, bob := twoDevices(t, net, func(c *DeviceConfig) {
		c.StaleAfter = 100 * time.Millisecond
		c.StaleCheckInterval = -1 // only CheckPending looks
	})
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
	if stale, err := bob.CheckPending(ctx); err != nil || len(stale) != 0 {
		t.Fatalf("CheckPending before StaleAfter = %+v, %v: want nothing", stale, err)
	}
	bob.wall.Advance(time.Second) // the node's wall clock, past StaleAfter
	stale, err := bob.CheckPending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 {
		t.Fatalf("CheckPending = %+v, want the one uncommitted message", stale)
	}
	st := stale[0]
	if st.Sent || st.Peer != alice.DeviceAddress() || st.ID != sent.ID || st.Reason != "uncommitted" ||
		st.Reinitiated || st.Since.IsZero() || !st.Since.Equal(m.ReceivedAt) {
		t.Fatalf("CheckPending = %+v, want received from %v id %x uncommitted since %v", st, alice.DeviceAddress(), sent.ID[:], m.ReceivedAt)
	}
	if again, err := bob.CheckPending(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second CheckPending = %+v, %v: want nothing new", again, err)
	}
}
