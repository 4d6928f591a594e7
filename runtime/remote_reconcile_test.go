package runtime

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// Reconciliation over the remote with mutual TLS: every node is a real
// Node in a child process re-executed from this test binary (one
// protoactor remote per process; see remote_child_test.go for why).

const reconChildEnv = "SYNCMESH_RECON_CHILD"

type reconChildSpec struct {
	Name              string
	CertDir           string
	ReconcileInterval time.Duration
}

type reconCmd struct {
	Op   string // addpeer, accept, write, sync, trust, rows, reconcile, raw, stats
	Name string
	Addr string
	N    int
	Key  PeerKey
	From string // raw: the name claimed
	Kind byte   // raw
	Body []byte // raw
}

type reconReply struct {
	OK        bool
	Err       string
	Busy      bool
	Refused   bool
	PeerErr   bool
	Offered   int
	Applied   uint64
	Rows      int
	State     string
	Report    ReconcileReport
	Stats     RemoteStats
	Recon     map[string]float64 // reconciliation metric sums by name
	Addr      string
	Identity  PeerKey
	Responded int
}

// TestRemoteReconcileChild is not a test: it is the body of a child node
// process, run only when the parent sets SYNCMESH_RECON_CHILD.
func TestRemoteReconcileChild(t *testing.T) {
	runAsChild(t, reconChildEnv, "helper process for the remote reconciliation tests", runReconChild)
}

func runReconChild(rawSpec string, in io.Reader, out io.Writer) error {
	var spec reconChildSpec
	if err := json.Unmarshal([]byte(rawSpec), &spec); err != nil {
		return err
	}
	server, client, err := loadRemoteTLS(spec.CertDir, "")
	if err != nil {
		return err
	}
	ctx := context.Background()
	n, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: spec.Name, SyncInterval: -1, ReconcileInterval: spec.ReconcileInterval,
		Remote: &RemoteConfig{TLS: server, ClientTLS: client, RequestTimeout: 20 * time.Second}})
	if err != nil {
		return err
	}
	defer n.Close()
	if err := n.DefineTable(ctx, defT); err != nil {
		return err
	}
	var mu sync.Mutex
	emit := func(r reconReply) {
		b, _ := json.Marshal(r)
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "REPLY %s\n", b)
	}
	id := n.Identity()
	emit(reconReply{OK: true, Addr: n.Remote().Address(), Identity: PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}})
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c reconCmd
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return err
		}
		emit(reconChildCommand(ctx, n, c))
	}
	return sc.Err()
}

func reconChildCommand(ctx context.Context, n *Node, c reconCmd) reconReply {
	fail := func(err error) reconReply {
		return reconReply{Err: err.Error(), Busy: errors.Is(err, ErrReconcileBusy), Refused: errors.Is(err, ErrReconcileRefused), PeerErr: errors.Is(err, ErrReconcilePeer)}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	switch c.Op {
	case "addpeer":
		if err := n.Remote().AddPeer(c.Name, c.Addr); err != nil {
			return fail(err)
		}
		if err := n.AddPeer(c.Name, n.Remote(), "remote"); err != nil {
			return fail(err)
		}
	case "accept": // a one-way link: bind the peer's certificate, accept its pushes
		if err := n.Remote().AddPeer(c.Name, c.Addr); err != nil {
			return fail(err)
		}
		if err := n.AcceptPeer(c.Name); err != nil {
			return fail(err)
		}
	case "write":
		for i := 0; i < c.N; i++ {
			if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
				return fail(err)
			}
		}
	case "sync":
		rep, err := n.SyncNow(ctx, c.Name, "remote")
		if err == nil {
			err = rep.Err
		}
		if err != nil {
			return fail(err)
		}
		r := reconReply{OK: true, Offered: rep.Offered}
		if rep.Result != nil {
			r.Applied = rep.Result.Applied
		}
		return r
	case "trust":
		if err := n.Trust(ctx, c.Key); err != nil {
			return fail(err)
		}
	case "rows":
		st, rows, err := childState(ctx, n)
		if err != nil {
			return fail(err)
		}
		return reconReply{OK: true, Rows: rows, State: st}
	case "reconcile":
		rep, err := n.Reconcile(ctx, c.Name)
		if err != nil {
			r := fail(err)
			r.Report = rep
			return r
		}
		return reconReply{OK: true, Report: rep}
	case "raw":
		if _, err := n.Remote().reconcileCall(ctx, c.From, c.Name, c.Kind, c.Body); err != nil {
			return fail(err)
		}
	case "stats":
		r := reconReply{OK: true, Stats: n.Remote().Stats(), Recon: map[string]float64{}}
		mfs, err := n.Gatherer().Gather()
		if err != nil {
			return fail(err)
		}
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "syncmesh_reconcile") {
				for _, m := range mf.GetMetric() {
					r.Recon[mf.GetName()] += m.GetCounter().GetValue()
				}
			}
		}
		return r
	default:
		return fail(fmt.Errorf("unknown op %q", c.Op))
	}
	return reconReply{OK: true}
}

// childState is state() without a testing.T, plus the live row count.
func childState(ctx context.Context, n *Node) (string, int, error) {
	var b strings.Builder
	rows := 0
	err := n.Scan(ctx, "app", "t", ScanOptions{IncludeDeleted: true}, func(r Row) bool {
		if r.Exists {
			rows++
		}
		fmt.Fprintf(&b, "row %x %v %v\n", r.Key.Encode(), r.Exists, r.Existence)
		for _, c := range []string{"a", "b", "c"} {
			if cell, ok := r.Cells[c]; ok {
				fmt.Fprintf(&b, " %s %v %x %v\n", c, cell.State, cell.Value, cell.Clock)
			}
		}
		return true
	})
	return b.String(), rows, err
}

// reconChild is the parent's handle on a child node.
type reconChild struct {
	*childProcess
	replies chan reconReply
	addr    string
	key     PeerKey
}

func startReconChild(t testing.TB, spec reconChildSpec) *reconChild {
	t.Helper()
	c := &reconChild{replies: make(chan reconReply, 1)}
	c.childProcess = startChildProcess(t, spec.Name, "TestRemoteReconcileChild", reconChildEnv, spec, func(kind, body string) {
		if kind == "REPLY" {
			var r reconReply
			_ = json.Unmarshal([]byte(body), &r)
			c.replies <- r
		}
	})
	first := c.wait("start")
	if !first.OK {
		t.Fatalf("child %s: %s", spec.Name, first.Err)
	}
	c.addr, c.key = first.Addr, first.Identity
	return c
}

func (c *reconChild) wait(what string) reconReply {
	c.t.Helper()
	return awaitChild(c.childProcess, c.replies, what)
}

func (c *reconChild) call(cmd reconCmd) reconReply {
	c.t.Helper()
	c.send(cmd)
	return c.wait(cmd.Op)
}

func (c *reconChild) must(cmd reconCmd) reconReply {
	c.t.Helper()
	r := c.call(cmd)
	if !r.OK {
		c.t.Fatalf("%s %s: %s", c.name, cmd.Op, r.Err)
	}
	return r
}

// link makes x and y peers of each other over their remotes.
func linkChildren(x, y *reconChild) {
	x.must(reconCmd{Op: "addpeer", Name: y.name, Addr: y.addr})
	y.must(reconCmd{Op: "addpeer", Name: x.name, Addr: x.addr})
}

// waitChildRows polls until c holds want rows (reconciliation runs in the
// background), failing after a generous deadline.
func waitChildRows(t *testing.T, c *reconChild, want int) reconReply {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := c.must(reconCmd{Op: "rows"})
		if r.Rows == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d rows, want %d", c.name, r.Rows, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRemoteLateTrustRepairedByTrustAlone (over the remote with
// mutual TLS): a pushes 20 events to b before b trusts a's key; b drops
// them (unknown kid) and a's cursor moves past them, so pushes alone never
// bring them back. Trust alone — the test never calls Reconcile —
// reconciles b with a over the remote and b converges to a.
func TestRemoteLateTrustRepairedByTrustAlone(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	a := startReconChild(t, reconChildSpec{Name: "a", CertDir: ca.issue(t, dir, "a")})
	b := startReconChild(t, reconChildSpec{Name: "b", CertDir: ca.issue(t, dir, "b")})
	linkChildren(a, b)
	a.must(reconCmd{Op: "write", N: 20})
	if r := a.must(reconCmd{Op: "sync", Name: "b"}); r.Offered != 20 || r.Applied != 20 {
		t.Fatalf("setup: first push offered %d, applied (or dropped) %d; want 20, 20", r.Offered, r.Applied)
	}
	if r := a.must(reconCmd{Op: "sync", Name: "b"}); r.Offered != 0 {
		t.Fatalf("setup: a's cursor did not move past the dropped events: offered %d", r.Offered)
	}
	if r := b.must(reconCmd{Op: "rows"}); r.Rows != 0 {
		t.Fatalf("setup: b holds %d rows before trusting a", r.Rows)
	}
	b.must(reconCmd{Op: "trust", Key: a.key})
	got := waitChildRows(t, b, 20)
	if want := a.must(reconCmd{Op: "rows"}).State; got.State != want {
		t.Fatalf("not converged:\n%s\n%s", got.State, want)
	}
	st := b.must(reconCmd{Op: "stats"})
	if st.Recon["syncmesh_reconcile_events_missing_total"] < 20 || st.Recon["syncmesh_reconcile_round_trips_total"] < 1 {
		t.Fatalf("b's reconciliation metrics: %v", st.Recon)
	}
}

// TestRemoteOneWayLateTrustRepairedByTrustAlone (regression, over the
// remote with mutual TLS): b pushes to a over a one-way link (b adds a; a
// only accepts b). a drops b's pushes while b's key is unknown and b's
// cursor moves past them. Trust alone at a — the test never calls
// Reconcile — makes a pull from b over its remote, and a converges to b.
func TestRemoteOneWayLateTrustRepairedByTrustAlone(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	a := startReconChild(t, reconChildSpec{Name: "a", CertDir: ca.issue(t, dir, "a")})
	b := startReconChild(t, reconChildSpec{Name: "b", CertDir: ca.issue(t, dir, "b")})
	a.must(reconCmd{Op: "accept", Name: "b", Addr: b.addr})
	b.must(reconCmd{Op: "addpeer", Name: "a", Addr: a.addr})
	b.must(reconCmd{Op: "write", N: 8})
	if r := b.must(reconCmd{Op: "sync", Name: "a"}); r.Offered != 8 || r.Applied != 8 {
		t.Fatalf("setup: first push offered %d, applied (or dropped) %d; want 8, 8", r.Offered, r.Applied)
	}
	if r := b.must(reconCmd{Op: "sync", Name: "a"}); r.Offered != 0 {
		t.Fatalf("setup: b's cursor did not move past the dropped events: offered %d", r.Offered)
	}
	if r := a.must(reconCmd{Op: "rows"}); r.Rows != 0 {
		t.Fatalf("setup: a holds %d rows before trusting b", r.Rows)
	}
	a.must(reconCmd{Op: "trust", Key: b.key})
	got := waitChildRows(t, a, 8)
	if want := b.must(reconCmd{Op: "rows"}).State; got.State != want {
		t.Fatalf("not converged:\n%s\n%s", got.State, want)
	}
	st := a.must(reconCmd{Op: "stats"})
	if st.Recon["syncmesh_reconcile_events_missing_total"] < 8 {
		t.Fatalf("a's reconciliation metrics: %v", st.Recon)
	}
}

// TestAttackRemoteReconcileAsAnotherPeer: m holds a valid mesh certificate
// (for m). A reconciliation request m sends under a's name is refused by
// b's stream guard (typed, counted) and never reaches b's node; a
// malformed request under m's own name is a typed refusal for m only; a's
// own reconciliation with b goes on.
func TestAttackRemoteReconcileAsAnotherPeer(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	a := startReconChild(t, reconChildSpec{Name: "a", CertDir: ca.issue(t, dir, "a"), ReconcileInterval: -1})
	b := startReconChild(t, reconChildSpec{Name: "b", CertDir: ca.issue(t, dir, "b"), ReconcileInterval: -1})
	m := startReconChild(t, reconChildSpec{Name: "m", CertDir: ca.issue(t, dir, "m"), ReconcileInterval: -1})
	linkChildren(a, b)
	linkChildren(m, b)
	b.must(reconCmd{Op: "write", N: 5})
	a.must(reconCmd{Op: "trust", Key: b.key})
	m.must(reconCmd{Op: "trust", Key: b.key})

	valid, err := messages.EncodeReconcile(&messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "app", Table: "t", Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}})
	if err != nil {
		t.Fatal(err)
	}
	r := m.call(reconCmd{Op: "raw", Name: "b", From: "a", Kind: reconcileKindRange, Body: valid})
	if r.OK || !r.Refused || !strings.Contains(r.Err, "authenticated peer") {
		t.Fatalf("m reconciling as a over m's certificate: %+v", r)
	}
	if st := b.must(reconCmd{Op: "stats"}); st.Stats.RefusedPushes != 1 {
		t.Fatalf("b counted %d refused requests, want 1", st.Stats.RefusedPushes)
	}
	r = m.call(reconCmd{Op: "raw", Name: "b", From: "m", Kind: reconcileKindRange, Body: []byte{0xff, 0x00}})
	if r.OK || !r.Refused || !strings.Contains(r.Err, "reconciliation protocol") {
		t.Fatalf("m's malformed request: %+v", r)
	}
	r = m.call(reconCmd{Op: "raw", Name: "b", From: "m", Kind: 9, Body: valid})
	if r.OK || !r.Refused {
		t.Fatalf("m's request of an unknown kind: %+v", r)
	}
	rep := a.must(reconCmd{Op: "reconcile", Name: "b"}).Report
	if rep.Fetched != 5 || rep.Outcomes[messages.Applied] != 5 {
		t.Fatalf("a's reconciliation with b after m's attempts: %+v", rep)
	}
	waitChildRows(t, a, 5)
	// m's honest reconciliation works too: the refusals were m's only.
	if rep := m.must(reconCmd{Op: "reconcile", Name: "b"}).Report; rep.Fetched != 5 {
		t.Fatalf("m's own reconciliation: %+v", rep)
	}
}
