package runtime

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
)

// TestRemoteFirstFailureNamesTheCause: over the real remote with mutual
// TLS, a node whose CA is not the peer's pushes to it. The first cycle
// fails at once (well inside the request timeout) with an error naming
// the TLS cause, and PeerStatus.LastErr holds it after that one cycle; a
// refused connection is named the same way; a bad address is refused by
// Remote().AddPeer. The peer runs in a child
// process: one protoactor remote per process (remote_child_test.go).
func TestRemoteFirstFailureNamesTheCause(t *testing.T) {
	dir := t.TempDir()
	mesh := newRemoteCA(t, "mesh-ca")
	b := startRemoteChild(t, "b", remoteChildSpec{CertDir: mesh.issue(t, dir, "b"), RequestTimeout: 3 * time.Second})
	other := newRemoteCA(t, "other-ca")
	srv, cli, err := loadRemoteTLS(other.issue(t, dir, "a"), "")
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 30 * time.Second // the bound a dead-letter or timeout path would wait out
	a := openTestNode(t, Config{SyncInterval: -1, ReconcileInterval: -1, Name: "a",
		Remote: &RemoteConfig{TLS: srv, ClientTLS: cli, RequestTimeout: timeout}})
	a.define(defT)
	if _, err := a.Upsert(a.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": "x"}); err != nil {
		t.Fatal(err)
	}
	// A bad address is refused by AddPeer itself and changes nothing.
	for _, bad := range []string{"not an address", ":7400", "127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:x"} {
		if err := a.Remote().AddPeer("x", bad); !errors.Is(err, ErrInvalidPeerAddress) {
			t.Fatalf("AddPeer(%q) = %v, want ErrInvalidPeerAddress", bad, err)
		}
	}
	if _, err := a.Remote().Push(a.ctx, "x", testPush("a", 1, 1)); err == nil || !strings.Contains(err.Error(), "unknown peer") {
		t.Fatalf("a refused address was kept: push to x: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		peer, addr, cause string
	}{
		{"b", b.addr, "x509: certificate signed by unknown authority"},
		{"gone", closed, "connection refused"},
	} {
		if err := a.Remote().AddPeer(tc.peer, tc.addr); err != nil {
			t.Fatal(err)
		}
		if err := a.AddPeer(tc.peer, a.Remote(), ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		rep, err := a.SyncNow(ctx, tc.peer, "")
		cancel()
		if err != nil {
			t.Fatalf("%s: SyncNow: %v", tc.peer, err)
		}
		if rep.Err == nil || !errors.Is(rep.Err, replicate.ErrUnreachable) || !strings.Contains(rep.Err.Error(), tc.cause) {
			t.Fatalf("%s: first cycle's error %v; want ErrUnreachable naming %q", tc.peer, rep.Err, tc.cause)
		}
		if el := time.Since(start); el >= timeout {
			t.Fatalf("%s: the first failure took %v, the whole request timeout", tc.peer, el)
		}
		peers, err := a.Peers(a.ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range peers {
			if p.Peer == tc.peer {
				found = true
				if p.LastErr == nil || !strings.Contains(p.LastErr.Error(), tc.cause) {
					t.Fatalf("%s: LastErr after the first cycle = %v; want %q", tc.peer, p.LastErr, tc.cause)
				}
			}
		}
		if !found {
			t.Fatalf("no PeerStatus for %s: %+v", tc.peer, peers)
		}
	}
}
