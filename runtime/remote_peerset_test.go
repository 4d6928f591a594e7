package runtime

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// A remote serving several nodes (Remote.Host) answers each node's
// peers only: a peer configured for one node is not a peer of another
// node on the same remote.

const peerSetChildEnv = "SYNCMESH_PEERSET_CHILD"

// TestRemotePeerSetChild is not a test: it is the body of a child process
// hosting two nodes, x (the remote's own) and y (Host), on one remote,
// run only when the parent sets SYNCMESH_PEERSET_CHILD. Commands whose Op
// starts with "y:" run on y.
func TestRemotePeerSetChild(t *testing.T) {
	runAsChild(t, peerSetChildEnv, "helper process for the remote peer-set tests", runPeerSetChild)
}

func runPeerSetChild(rawSpec string, in io.Reader, out io.Writer) error {
	var spec reconChildSpec
	if err := json.Unmarshal([]byte(rawSpec), &spec); err != nil {
		return err
	}
	server, client, err := loadRemoteTLS(spec.CertDir, "")
	if err != nil {
		return err
	}
	ctx := context.Background()
	x, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: spec.Name, SyncInterval: -1, ReconcileInterval: -1,
		Remote: &RemoteConfig{TLS: server, ClientTLS: client, RequestTimeout: 20 * time.Second}})
	if err != nil {
		return err
	}
	defer x.Close()
	y, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "y", SyncInterval: -1, ReconcileInterval: -1, System: x.System()})
	if err != nil {
		return err
	}
	defer y.Close()
	x.Remote().Host(y)
	for _, n := range []*Node{x, y} {
		if err := n.DefineTable(ctx, defT); err != nil {
			return err
		}
	}
	var mu sync.Mutex
	emit := func(r reconReply) {
		b, _ := json.Marshal(r)
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "REPLY %s\n", b)
	}
	xi, yi := x.Identity(), y.Identity()
	yKey, _ := json.Marshal(PeerKey{Kid: yi.Kid, Site: yi.Site, PublicKey: yi.PublicKey})
	// Identity is x's; State carries y's (JSON).
	emit(reconReply{OK: true, Addr: x.Remote().Address(), Identity: PeerKey{Kid: xi.Kid, Site: xi.Site, PublicKey: xi.PublicKey}, State: string(yKey)})
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c reconCmd
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return err
		}
		n := x
		if op, ok := strings.CutPrefix(c.Op, "y:"); ok {
			n, c.Op = y, op
		}
		emit(reconChildCommand(ctx, n, c))
	}
	return sc.Err()
}

// TestAttackRemoteReconcileWithAnotherNodeOfTheRemote: p is a configured
// peer of node x (mutual TLS, its own certificate). The remote also
// serves node y, which never added p: p's reconciliation round and
// fetches against y are refused (typed) and p gets none of y's rows,
// while p's reconciliation with x goes on.
func TestAttackRemoteReconcileWithAnotherNodeOfTheRemote(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	spec := reconChildSpec{Name: "x", CertDir: ca.issue(t, dir, "x"), ReconcileInterval: -1}
	m := &reconChild{replies: make(chan reconReply, 1)}
	m.childProcess = startChildProcess(t, "x+y", "TestRemotePeerSetChild", peerSetChildEnv, spec, func(kind, body string) {
		if kind == "REPLY" {
			var r reconReply
			_ = json.Unmarshal([]byte(body), &r)
			m.replies <- r
		}
	})
	first := m.wait("start")
	if !first.OK {
		t.Fatalf("child x+y: %s", first.Err)
	}
	m.addr, m.name, m.key = first.Addr, "x", first.Identity
	var yKey PeerKey
	if err := json.Unmarshal([]byte(first.State), &yKey); err != nil {
		t.Fatal(err)
	}
	p := startReconChild(t, reconChildSpec{Name: "p", CertDir: ca.issue(t, dir, "p"), ReconcileInterval: -1})
	linkChildren(p, m) // p ↔ x
	p.must(reconCmd{Op: "addpeer", Name: "y", Addr: m.addr})
	m.must(reconCmd{Op: "y:write", N: 5})
	m.must(reconCmd{Op: "write", N: 3})
	p.must(reconCmd{Op: "trust", Key: yKey})
	p.must(reconCmd{Op: "trust", Key: m.key})

	r := p.call(reconCmd{Op: "reconcile", Name: "y"})
	if r.OK || !r.Refused || r.Report.Fetched != 0 {
		t.Fatalf("p reconciling with y (not its peer): %+v", r)
	}
	valid := []byte{0xa1, 0x01, 0x80} // any body: the peer check comes first
	for _, kind := range []byte{reconcileKindRange, reconcileKindFetch} {
		if r := p.call(reconCmd{Op: "raw", Name: "y", From: "p", Kind: kind, Body: valid}); r.OK || !r.Refused || !strings.Contains(r.Err, "not a peer") {
			t.Fatalf("p's raw request of kind %d to y: %+v", kind, r)
		}
	}
	if rows := p.must(reconCmd{Op: "rows"}); rows.Rows != 0 {
		t.Fatalf("p holds %d rows after reconciling with y", rows.Rows)
	}
	if rep := p.must(reconCmd{Op: "reconcile", Name: "x"}).Report; rep.Fetched != 3 {
		t.Fatalf("p's reconciliation with x, its peer: %+v", rep)
	}
}
