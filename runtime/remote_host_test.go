package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

// Several nodes on one actor system share its one remote: pushes are
// routed by the name they are addressed to, envelopes by device address
// (multi-tenant hosting over the remote transport). One remote in the
// process, so this runs under -race in the test binary itself.
func TestRemoteHostsSeveralNodesOnOneSystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys := actortest.System(t)
	rem, err := StartRemote(sys, RemoteConfig{Plaintext: true, RequestTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rem.Close()
	open := func(name string) *Node {
		addr := DeviceAddress{User: name, Device: 1}
		n, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: name, System: sys, SyncInterval: -1,
			Device: &DeviceConfig{Address: addr, Transport: rem.DeviceTransport(addr), Buffer: 4}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		if err := n.DefineTable(ctx, defT); err != nil {
			t.Fatal(err)
		}
		rem.Host(n)
		rem.AddPeer(name, rem.Address())
		return n
	}
	a, b, c := open("a"), open("b"), open("c")
	addDevicePeers(t, rem, a, b, c)
	for _, n := range []*Node{a, b} {
		trustNode(t, n, c)
		if err := c.AddPeer(n.Name(), rem, "remote"); err != nil {
			t.Fatal(err)
		}
		if err := n.AcceptPeer(c.Name()); err != nil {
			t.Fatal(err)
		}
	}
	upsertN(t, c, 0, 4, "a")
	for _, to := range []string{"a", "b"} {
		rep, err := c.SyncNow(ctx, to, "remote")
		if err != nil || rep.Err != nil || rep.Offered != 4 || rep.Result.Applied != 4 {
			t.Fatalf("push to %s: %+v %v", to, rep, err)
		}
	}
	if state(t, a) != state(t, c) || state(t, b) != state(t, c) {
		t.Fatal("hosted nodes did not each get the push addressed to them")
	}
	// The delivery plane between two hosted devices over the same remote.
	if _, err := a.Send(ctx, b.DeviceAddress(), []byte("hi b")); err != nil {
		t.Fatal(err)
	}
	var m ReceivedMessage
	select {
	case m = <-b.Messages():
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	if _, err := b.CommitMessage(ctx, m); err != nil {
		t.Fatal(err)
	}
	for {
		p, err := a.PendingSentMessages(ctx, 0, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Messages) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the ACK never reached a")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
