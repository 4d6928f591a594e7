package runtime

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

// nextOneTime issues a bundle of n locally and returns its one-time
// prekey id: issued in allocation order, so the id after a previous one
// means no one-time prekey was handed out in between.
func nextOneTime(t *testing.T, ctx context.Context, n *Node) uint32 {
	t.Helper()
	b, err := n.Bundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.OneTimePrekey == nil {
		t.Fatalf("%s has no one-time prekey to hand out", n.Name())
	}
	return b.OneTimePrekey.ID
}

// TestAttackRemoteBundleOfANodeThatDidNotAddTheRequester: one remote
// (mutual TLS) hosts alice and bob. A third process m hosts mallory.1,
// which alice added as a device peer (AddDevice for alice) and bob did
// not. m asks for bob's prekey bundle: it is refused at the stream guard
// with ErrUnknownSender — each served node answers bundle requests only
// from requesters it trusts (SSP/1 §14), as it does for envelopes — and
// bob hands out no one-time prekey. m's request for alice's bundle is
// served.
func TestAttackRemoteBundleOfANodeThatDidNotAddTheRequester(t *testing.T) {
	runIsolated(t, attackRemoteBundleOfANodeThatDidNotAddTheRequester)
}

func attackRemoteBundleOfANodeThatDidNotAddTheRequester(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	rem, alice, bob := remoteDevicePair(t, ca, dir, &capturingTransport{}, nil, nil)
	certDir := ca.issue(t, dir, "m")
	m := startRemoteChild(t, "m", remoteChildSpec{CertDir: certDir, RequestTimeout: 10 * time.Second})
	stopChildFirst(t, m, rem, "m")
	if err := rem.AddPeer("m", m.addr); err != nil {
		t.Fatal(err)
	}
	mallory := DeviceAddress{User: "mallory", Device: 1}
	if err := rem.AddDevice(alice, mallory, m.addr); err != nil {
		t.Fatal(err)
	}

	bobBefore := nextOneTime(t, ctx, bob)
	aliceBefore := nextOneTime(t, ctx, alice)
	rep := m.call(remoteCmd{Op: "bundles", Peer: rem.Address(), NoAddPeer: true, Device: bob.DeviceAddress(), N: 1})
	if !rep.OK || rep.Bundles != 0 || rep.Refusals != 1 {
		t.Fatalf("m, trusted by alice only, asked for bob's bundle: %d served, %d refused (%s), want 0 and 1", rep.Bundles, rep.Refusals, rep.Err)
	}
	if n := rem.RefusedBundleRequests(); n != 1 {
		t.Fatalf("the guard refused %d bundle requests, want m's one for bob", n)
	}
	if got := nextOneTime(t, ctx, bob); got != bobBefore+1 {
		t.Fatalf("bob handed out one-time prekeys for m: next id %d after %d", got, bobBefore)
	}
	rep = m.call(remoteCmd{Op: "bundles", Peer: rem.Address(), NoAddPeer: true, Device: alice.DeviceAddress(), N: 1})
	if !rep.OK || rep.Bundles != 1 {
		t.Fatalf("m, trusted by alice, asked for alice's bundle: %d served, %d refused (%s), want 1", rep.Bundles, rep.Refusals, rep.Err)
	}
	if got := nextOneTime(t, ctx, alice); got != aliceBefore+2 {
		t.Fatalf("alice's next one-time prekey %d after %d: want the one after m's", got, aliceBefore)
	}

	// The decision itself, with m's certificate.
	kp, err := tls.LoadX509KeyPair(filepath.Join(certDir, "node.pem"), filepath.Join(certDir, "node-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := rem.authorizeBundle(bob.DeviceAddress(), cert, m.addr); !errors.Is(err, ErrUnknownSender) {
		t.Fatalf("m asks for bob's bundle: %v, want ErrUnknownSender", err)
	}
	if err := rem.authorizeBundle(alice.DeviceAddress(), cert, m.addr); err != nil {
		t.Fatalf("m asks for alice's bundle: %v", err)
	}
	if err := rem.authorizeBundle(alice.DeviceAddress(), nil, m.addr); !errors.Is(err, ErrUnknownSender) {
		t.Fatalf("no certificate asks for alice's bundle: %v, want ErrUnknownSender", err)
	}
}

// TestRemoteBundleRequesterTrustedPerNode: the decision of the stream
// guard for bundle requests on a remote serving two nodes, without TLS
// (the requester is its reply address): a requester at the address of a
// device peer of the addressed node, or configured as a peer of that
// node (AcceptPeer), is answered; one trusted by the other node only is
// refused with ErrUnknownSender; a device not served here is left to
// answerBundle.
func TestRemoteBundleRequesterTrustedPerNode(t *testing.T) {
	ctx := context.Background()
	sys := actortest.System(t)
	rem, err := StartRemote(sys, RemoteConfig{Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rem.Close()
	open := func(name string) *Node {
		addr := DeviceAddress{User: name, Device: 1}
		n, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: name, System: sys, SyncInterval: -1, ReconcileInterval: -1,
			Device: &DeviceConfig{Address: addr, Transport: rem.DeviceTransport(addr)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		rem.Host(n)
		return n
	}
	x, y := open("x"), open("y")
	const mAddr, pAddr = "127.0.0.1:7001", "127.0.0.1:7002"
	if err := rem.AddPeer("m", mAddr); err != nil {
		t.Fatal(err)
	}
	if err := rem.AddPeer("p", pAddr); err != nil {
		t.Fatal(err)
	}
	if err := rem.AddDevice(x, DeviceAddress{User: "mallory", Device: 1}, mAddr); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		to    *Node
		reply string
		want  error
	}{
		{x, mAddr, nil},
		{y, mAddr, ErrUnknownSender},
		{x, pAddr, ErrUnknownSender},
		{y, pAddr, ErrUnknownSender},
		{y, "127.0.0.1:7003", ErrUnknownSender},
	} {
		if err := rem.authorizeBundle(c.to.DeviceAddress(), nil, c.reply); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Fatalf("bundle of %s for %s: %v, want %v", c.to.Name(), c.reply, err, c.want)
		}
	}
	// p becomes a peer of y's node (sync plane): y answers it, x still not.
	if err := y.AcceptPeer("p"); err != nil {
		t.Fatal(err)
	}
	if err := rem.authorizeBundle(y.DeviceAddress(), nil, pAddr); err != nil {
		t.Fatalf("bundle of y for its peer p: %v", err)
	}
	if err := rem.authorizeBundle(x.DeviceAddress(), nil, pAddr); !errors.Is(err, ErrUnknownSender) {
		t.Fatalf("bundle of x for p, a peer of y only: %v, want ErrUnknownSender", err)
	}
	if err := rem.authorizeBundle(DeviceAddress{User: "nobody", Device: 1}, nil, mAddr); err != nil {
		t.Fatalf("bundle of a device not served here: %v, want it left to answerBundle", err)
	}
}
