package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// addDevicePeers makes the devices of nodes, all hosted on rem, device
// peers of each other (AddDevice for every ordered pair).
func addDevicePeers(t *testing.T, rem *Remote, nodes ...*Node) {
	t.Helper()
	for _, n := range nodes {
		for _, p := range nodes {
			if p == n {
				continue
			}
			if err := rem.AddDevice(n, p.DeviceAddress(), rem.Address()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestAddDeviceNeedsADevice(t *testing.T) {
	sys := actortest.System(t)
	rem, err := StartRemote(sys, RemoteConfig{Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rem.Close()
	n, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, Name: "nodev", System: sys, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := rem.AddDevice(n, DeviceAddress{User: "p", Device: 1}, rem.Address()); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("AddDevice for a node without a device: %v, want ErrNoDevice", err)
	}
	if err := rem.AddDevice(nil, DeviceAddress{User: "p", Device: 1}, rem.Address()); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("AddDevice for no node: %v, want ErrNoDevice", err)
	}
}

// TestAttackRemoteDevicePeerOfOneHostedNodeOnly: one remote (mutual TLS)
// hosts alice and bob. A third process m hosts mallory.1, which alice
// added as a device peer (AddDevice for alice) and bob did not. m sends
// bob a genuine first envelope from mallory.1: it is refused at the
// stream guard with ErrUnknownSender — device trust is per served node,
// as the sync plane's peer set is — and nothing changes on bob (no
// message, no pending, no session); the same kind of envelope to alice
// is delivered.
func TestAttackRemoteDevicePeerOfOneHostedNodeOnly(t *testing.T) {
	runIsolated(t, attackRemoteDevicePeerOfOneHostedNodeOnly)
}

func attackRemoteDevicePeerOfOneHostedNodeOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	rem, alice, bob := remoteDevicePair(t, ca, dir, &capturingTransport{}, nil, nil)
	m := startRemoteChild(t, "m", remoteChildSpec{CertDir: ca.issue(t, dir, "m"), RequestTimeout: 10 * time.Second})
	stopChildFirst(t, m, rem, "m")
	if err := rem.AddPeer("m", m.addr); err != nil {
		t.Fatal(err)
	}
	mallory := DeviceAddress{User: "mallory", Device: 1}
	if err := rem.AddDevice(alice, mallory, m.addr); err != nil {
		t.Fatal(err)
	}
	if err := rem.authorizeDevice(mallory, bob.DeviceAddress(), nil); !errors.Is(err, ErrUnknownSender) {
		t.Fatalf("mallory.1 → bob: %v, want ErrUnknownSender", err)
	}
	if err := rem.authorizeDevice(mallory, alice.DeviceAddress(), nil); !errors.Is(err, ErrSenderMismatch) {
		t.Fatalf("mallory.1 → alice without m's certificate: %v, want ErrSenderMismatch", err)
	}
	// mallory.1's genuine envelopes, taken off its transport: m sends
	// them as the member hosting mallory.1.
	tap := &capturingTransport{hold: 2, DeviceTransport: rem.DeviceTransport(mallory)}
	mn, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "mallory", System: rem.sys, SyncInterval: -1, ReconcileInterval: -1,
		// No retry: a resend would reach bob over the local path, not m.
		Device: &DeviceConfig{Address: mallory, Transport: tap, Retry: RetryPolicy{Interval: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mn.Close() })
	send := func(to *Node, body string) {
		t.Helper()
		if err := rem.AddDevice(mn, to.DeviceAddress(), rem.Address()); err != nil {
			t.Fatal(err)
		}
		if _, err := mn.Send(ctx, to.DeviceAddress(), []byte(body)); err != nil {
			t.Fatal(err)
		}
		got := tap.captured()
		f, err := wire.EnvelopeOf(&wire.DeviceEnvelope{From: mallory, To: to.DeviceAddress(), Envelope: got[len(got)-1]})
		if err != nil {
			t.Fatal(err)
		}
		if rep := m.call(remoteCmd{Op: "rawsend", Peer: rem.Address(), NoAddPeer: true, Type: f.Type, CBOR: f.Cbor}); !rep.OK {
			t.Fatal(rep.Err)
		}
	}
	send(bob, "to bob, who never added mallory.1")
	send(alice, "to alice, who added mallory.1")
	// alice's delivery: the envelope to bob went through the guard before
	// it on m's one stream.
	select {
	case got := <-alice.Messages():
		if got.Sender != mallory {
			t.Fatalf("alice got a message from %s", got.Sender)
		}
	case <-ctx.Done():
		t.Fatal("mallory.1's envelope to alice, who added it, never arrived")
	}
	if n := rem.RefusedEnvelopes(); n != 1 {
		t.Fatalf("the guard refused %d envelopes, want the one from mallory.1 to bob", n)
	}
	// A barrier on m's stream (alice's bundle: bob answers no request of
	// m's), then nothing of mallory.1 on bob.
	if rep := m.call(remoteCmd{Op: "bundles", Peer: rem.Address(), NoAddPeer: true, Device: alice.DeviceAddress(), N: 1}); !rep.OK || rep.Bundles != 1 {
		t.Fatalf("m's bundle request for alice: %d served (%s), want 1", rep.Bundles, rep.Err)
	}
	select {
	case got := <-bob.Messages():
		t.Fatalf("bob took an envelope from mallory.1, a device peer of alice only: %q", got.Plaintext)
	default:
	}
	if n, err := bob.PendingReceivedMessageCount(ctx, nil); err != nil || n != 0 {
		t.Fatalf("bob holds %d pending (%v), want none", n, err)
	}
	if n, err := alice.PendingReceivedMessageCount(ctx, &mallory); err != nil || n != 1 {
		t.Fatalf("alice holds %d pending from mallory.1 (%v), want 1", n, err)
	}
}
