package hosting_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

var testMesh = []byte("hosting-test-mesh")

// testTenant is the tenant the tests act for (testCtx carries it).
var testTenant = hosting.Principal{Tenant: "test-tenant"}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return hosting.WithPrincipal(ctx, testTenant)
}

// create provisions units for ctx's principal.
func create(t *testing.T, ctx context.Context, p hosting.Placement, kind string, identities ...string) {
	t.Helper()
	for _, id := range identities {
		if _, err := (hosting.Client{P: p}).Create(ctx, kind, id); err != nil {
			t.Fatalf("create %s %s: %v", kind, id, err)
		}
	}
}

func newLocal(t *testing.T, root string, opts ...hosting.LocalOption) *hosting.Local {
	t.Helper()
	opts = append([]hosting.LocalOption{hosting.WithWireRoundTrip()}, opts...)
	l, err := hosting.NewLocal(hosting.Config{Root: root, MeshID: testMesh, NoSync: true, LockTimeout: 200 * time.Millisecond}, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func writer(t *testing.T) *scenario.Writer {
	t.Helper()
	w, err := scenario.NewWriter(context.Background(), testMesh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func TestGroupApplyIsIdempotentAndReadable(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir())
	c := hosting.Client{P: l}
	w := writer(t)
	create(t, ctx, l, hosting.KindGroup, "acme", "other")
	if err := c.Trust(ctx, "acme", w.Key()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // DefineTable twice: a no-op the second time
		if err := c.DefineTable(ctx, "acme", scenario.Table); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := w.Events("acme", 5)
	if err != nil {
		t.Fatal(err)
	}
	outs, member, err := c.Apply(ctx, "acme", evs)
	if err != nil || member != "local" {
		t.Fatal(member, err)
	}
	for _, o := range outs {
		if o.Kind != messages.Applied {
			t.Fatalf("first apply: %v", o)
		}
	}
	outs, _, err = c.Apply(ctx, "acme", evs) // a retried request
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o.Kind != messages.Duplicate {
			t.Fatalf("second apply of event %d: %v", i, o)
		}
	}
	ids, err := c.EventIDs(ctx, "acme")
	if err != nil || len(ids) != 5 {
		t.Fatalf("event ids: %d %v", len(ids), err)
	}
	for i, id := range ids {
		if id != outs[i].ID {
			t.Fatalf("event %d: id %s, outcome id %s", i, id, outs[i].ID)
		}
	}
	n, h, _, err := c.Digest(ctx, "acme")
	if err != nil || n != 5 || len(h) != 32 {
		t.Fatalf("digest: %d %x %v", n, h, err)
	}
	row, found, err := c.Get(ctx, "acme", "app", "notes", map[string]any{"id": int64(3)})
	if err != nil || !found {
		t.Fatalf("get: %v %v", found, err)
	}
	var text string
	if err := row.Cells["text"].Decode(&text); err != nil || text != "acme note 3" {
		t.Fatalf("row 3: %q %v", text, err)
	}
	if _, found, err := c.Get(ctx, "acme", "app", "notes", map[string]any{"id": int64(99)}); err != nil || found {
		t.Fatalf("missing row: %v %v", found, err)
	}
	rows, more, err := c.Scan(ctx, "acme", "app", "notes", nil, 2)
	if err != nil || len(rows) != 2 || !more {
		t.Fatalf("scan page 1: %d %v %v", len(rows), more, err)
	}
	rest, more, err := c.Scan(ctx, "acme", "app", "notes", rows[1].Key.Encode(), 0)
	if err != nil || len(rest) != 3 || more {
		t.Fatalf("scan page 2: %d %v %v", len(rest), more, err)
	}
	var listed []hosting.Row
	for r, err := range c.Rows(ctx, "acme", "app", "notes", rows[0].Key.Encode()) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, r)
	}
	if len(listed) != 4 || !bytes.Equal(listed[0].Key.Encode(), rows[1].Key.Encode()) || !bytes.Equal(listed[3].Key.Encode(), rest[2].Key.Encode()) {
		t.Fatalf("rows after the first: %d, want the 4 the scans returned after it", len(listed))
	}
	for _, err := range c.Rows(ctx, "acme", "app", "missing", nil) {
		if !errors.Is(err, runtime.ErrUnknownTable) {
			t.Fatalf("rows of an unknown table: %v", err)
		}
	}
	if _, _, err := c.Get(ctx, "acme", "app", "missing", map[string]any{"id": 1}); !errors.Is(err, runtime.ErrUnknownTable) {
		t.Fatalf("unknown table: %v", err)
	}
	// A different group is a different node: nothing there.
	if n, _, _, err := c.Digest(ctx, "other"); err != nil || n != 0 {
		t.Fatalf("other group: %d %v", n, err)
	}
}

func TestDeviceSendCommitAreIdempotent(t *testing.T) {
	ctx := testCtx(t)
	root := t.TempDir()
	l := newLocal(t, root)
	c := hosting.Client{P: l}
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 2}
	id1, id2 := messages.LogicalMessageID{1}, messages.LogicalMessageID{2}
	create(t, ctx, l, hosting.KindDevice, "alice.1", "bob.2")
	if _, err := c.Send(ctx, alice, bob, id1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	m, err := c.Send(ctx, alice, bob, id1, []byte("one")) // a retried request
	if err != nil || !m.Duplicate {
		t.Fatalf("repeat send: %+v %v", m, err)
	}
	if _, err := c.Send(ctx, alice, bob, id2, []byte("two")); err != nil {
		t.Fatal(err)
	}
	pend, err := c.Pending(ctx, bob)
	if err != nil || len(pend) != 2 {
		t.Fatalf("bob pending: %+v %v", pend, err)
	}
	if pend[0].Peer != alice || !bytes.Equal(pend[0].ID, id1[:]) || string(pend[0].Body) != "one" {
		t.Fatalf("bob pending[0]: %+v", pend[0])
	}
	res, err := c.Commit(ctx, bob, alice, id1)
	if err != nil || res.Status != uint8(runtime.Committed) || !res.AckSent {
		t.Fatalf("commit: %+v %v", res, err)
	}
	res, err = c.Commit(ctx, bob, alice, id1)
	if err != nil || res.Status != uint8(runtime.AlreadyCommitted) {
		t.Fatalf("commit again: %+v %v", res, err)
	}
	sent, err := c.PendingSent(ctx, alice)
	if err != nil || len(sent) != 1 || !bytes.Equal(sent[0].ID, id2[:]) {
		t.Fatalf("alice pending sent: %+v %v", sent, err)
	}
	p, ok, err := c.Processed(ctx, bob, alice, id1)
	if err != nil || !ok || p.Status != uint8(persistence.FinalizationCommitted) {
		t.Fatalf("processed: %+v %v %v", p, ok, err)
	}
	if _, ok, err := c.Processed(ctx, bob, alice, id2); err != nil || ok {
		t.Fatalf("pending one processed: %v %v", ok, err)
	}
	// Sending a committed id again is a new message to the sender's
	// outbound store; the recipient recognizes the copy (no new pending).
	if _, err := c.Send(ctx, alice, bob, id1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if pend, err := c.Pending(ctx, bob); err != nil || len(pend) != 1 {
		t.Fatalf("bob pending after a copy of a committed message: %+v %v", pend, err)
	}

	// Everything is in the shared root: a new host (after this one
	// closed) reopens it.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Request(ctx, hosting.KindDevice, "bob.2", &hosting.Request{Op: hosting.OpInfo}); !errors.Is(err, hosting.ErrClosed) {
		t.Fatalf("request after close: %v", err)
	}
	c = hosting.Client{P: newLocal(t, root)}
	if pend, err := c.Pending(ctx, bob); err != nil || len(pend) != 1 || !bytes.Equal(pend[0].ID, id2[:]) {
		t.Fatalf("bob pending after reopen: %+v %v", pend, err)
	}
	if _, ok, err := c.Processed(ctx, bob, alice, id1); err != nil || !ok {
		t.Fatalf("processed after reopen: %v %v", ok, err)
	}
	if res, err := c.Commit(ctx, bob, alice, id2); err != nil || res.Status != uint8(runtime.Committed) {
		t.Fatalf("commit after reopen: %+v %v", res, err)
	}
	if sent, err := c.PendingSent(ctx, alice); err != nil || len(sent) != 0 {
		t.Fatalf("alice pending sent after the ACKs: %+v %v", sent, err)
	}
}

func TestBadRequestsAreRefused(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir())
	create(t, ctx, l, hosting.KindDevice, "a.1")
	create(t, ctx, l, hosting.KindGroup, "g")
	cases := []struct {
		name, kind, identity string
		req                  *hosting.Request
		want                 error
	}{
		{"group op on a device", hosting.KindDevice, "a.1", &hosting.Request{Op: hosting.OpApply, Events: [][]byte{{1}}}, hosting.ErrBadRequest},
		{"device op on a group", hosting.KindGroup, "g", &hosting.Request{Op: hosting.OpPending}, hosting.ErrBadRequest},
		{"unknown op", hosting.KindGroup, "g", &hosting.Request{Op: 200}, hosting.ErrBadRequest},
		{"unknown kind", "robot", "r", &hosting.Request{Op: hosting.OpInfo}, hosting.ErrBadRequest},
		{"device identity not an address", hosting.KindDevice, "alice", &hosting.Request{Op: hosting.OpInfo}, hosting.ErrInvalidIdentity},
		{"empty identity", hosting.KindGroup, "", &hosting.Request{Op: hosting.OpInfo}, hosting.ErrInvalidIdentity},
		{"send without id", hosting.KindDevice, "a.1", &hosting.Request{Op: hosting.OpSend, Peer: &messages.DeviceAddress{User: "b", Device: 1}}, hosting.ErrBadRequest},
		{"empty apply", hosting.KindGroup, "g", &hosting.Request{Op: hosting.OpApply}, hosting.ErrBadRequest},
		{"nil request", hosting.KindGroup, "g", nil, hosting.ErrBadRequest},
		{"resend of nothing", hosting.KindDevice, "a.1", &hosting.Request{Op: hosting.OpDeliver}, hosting.ErrBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.req != nil {
				tc.req.Principal = &testTenant
			}
			_, err := l.Request(ctx, tc.kind, tc.identity, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// A garbage apply is answered per event, not as a failure.
	rep, err := l.Request(ctx, hosting.KindGroup, "g", &hosting.Request{Op: hosting.OpApply, Events: [][]byte{{0xff}}, Principal: &testTenant})
	if err != nil || len(rep.Outcomes) != 1 || messages.OutcomeKind(rep.Outcomes[0].Kind) != messages.Dropped {
		t.Fatalf("garbage event: %+v %v", rep, err)
	}
}

func TestUnitLockedByAnotherHostIsUnavailableUntilReleased(t *testing.T) {
	root := t.TempDir()
	a := newLocal(t, root, hosting.WithMemberName("a"))
	b := newLocal(t, root, hosting.WithMemberName("b"))
	ctx := testCtx(t)
	create(t, ctx, a, hosting.KindGroup, "g")
	if m, err := (hosting.Client{P: a}).Info(ctx, hosting.KindGroup, "g"); err != nil || m != "a" {
		t.Fatal(m, err)
	}
	short, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
	defer cancel()
	if _, err := (hosting.Client{P: b}).Info(short, hosting.KindGroup, "g"); !errors.Is(err, hosting.ErrUnavailable) {
		t.Fatalf("while a holds g: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		m, err := (hosting.Client{P: b}).Info(ctx, hosting.KindGroup, "g")
		if err == nil && m != "b" {
			err = fmt.Errorf("served by %s", m)
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("b takes g over once a released it: %v", err)
	}
}

func TestConfigIsValidated(t *testing.T) {
	for _, cfg := range []hosting.Config{{MeshID: testMesh}, {Root: "x"}, {Root: "x", MeshID: testMesh, LockTimeout: -1}} {
		if _, err := hosting.NewLocal(cfg, nil); !errors.Is(err, hosting.ErrInvalidConfig) {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
	if _, err := hosting.NewCluster(hosting.ClusterConfig{Config: hosting.Config{Root: "x", MeshID: testMesh}}); !errors.Is(err, hosting.ErrInvalidConfig) {
		t.Fatalf("cluster without a provider: %v", err)
	}
}

func TestDeviceIdentityRoundTrip(t *testing.T) {
	for _, a := range []messages.DeviceAddress{{User: "alice", Device: 1}, {User: "a.b", Device: 0}, {User: "x y\"z", Device: 4294967295}, {User: "ünï", Device: 7}} {
		s := hosting.DeviceIdentity(a)
		got, err := hosting.ParseDeviceIdentity(s)
		if err != nil || got != a {
			t.Fatalf("%+v → %q → %+v %v", a, s, got, err)
		}
	}
	for _, s := range []string{"", "alice", ".1", "alice.", "alice.x", "alice.01", "alice.+1", "alice.4294967296", `"a.1`, `"a.b.1`, "a.b.1"} {
		if _, err := hosting.ParseDeviceIdentity(s); !errors.Is(err, hosting.ErrInvalidIdentity) {
			t.Fatalf("%q: %v", s, err)
		}
	}
}

// shards is a Placement of its own (rendezvous hashing over in-process
// Locals sharing one data root): the member-loss scenario runs on it
// under -race, and it shows the seam is swappable.
type shards struct {
	mu     sync.Mutex
	locals []*hosting.Local
	dead   []bool
}

type shardView struct {
	s *shards
	i int // -1: the router every shard's devices use
}

func (s *shards) route(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	best, bestH := -1, uint64(0)
	for i, l := range s.locals {
		if s.dead[i] {
			continue
		}
		sum := sha256.Sum256([]byte(l.Member() + "|" + key))
		if v := binary.BigEndian.Uint64(sum[:]); best < 0 || v > bestH {
			best, bestH = i, v
		}
	}
	return best
}

func (v shardView) Request(ctx context.Context, kind, identity string, req *hosting.Request) (*hosting.Reply, error) {
	for {
		i := v.s.route(kind + "/" + identity)
		if i < 0 {
			return nil, hosting.ErrClosed
		}
		rep, err := v.s.locals[i].Request(ctx, kind, identity, req)
		if errors.Is(err, hosting.ErrClosed) && ctx.Err() == nil {
			continue // the shard stopped between routing and the request
		}
		return rep, err
	}
}

func (v shardView) Member() string {
	if v.i < 0 {
		return "router"
	}
	return v.s.locals[v.i].Member()
}

func (v shardView) Hosted() []hosting.Unit {
	if v.i < 0 {
		return nil
	}
	return v.s.locals[v.i].Hosted()
}

func (v shardView) Close() error {
	v.s.mu.Lock()
	v.s.dead[v.i] = true
	v.s.mu.Unlock()
	return v.s.locals[v.i].Close()
}

// TestShardedMemberLoss runs the member-loss scenario (the one the cluster
// test runs) on three in-process shards, under -race.
func TestShardedMemberLoss(t *testing.T) {
	root := t.TempDir()
	s := &shards{}
	for i := 0; i < 3; i++ {
		s.locals = append(s.locals, newLocal(t, root, hosting.WithMemberName(fmt.Sprintf("shard%d", i)), hosting.WithRouter(shardView{s: s, i: -1})))
		s.dead = append(s.dead, false)
	}
	env := scenario.Env{MeshID: testMesh, Logf: t.Logf, Stop: func(i int) error { return shardView{s: s, i: i}.Close() }}
	for i := range s.locals {
		env.Members = append(env.Members, shardView{s: s, i: i})
	}
	rep, err := scenario.Run(testCtx(t), env)
	if err != nil {
		t.Fatalf("%v\nreport: %+v", err, rep)
	}
	if len(rep.MovedTo) == 0 || rep.EventsAcked == 0 || rep.Committed == 0 || rep.Pending == 0 {
		t.Fatalf("nothing exercised: %+v", rep)
	}
}

// MemberOf implements hosting.Locator: the shard a unit is routed to.
func (v shardView) MemberOf(kind, identity string) string {
	i := v.s.route(kind + "/" + identity)
	if i < 0 {
		return ""
	}
	return v.s.locals[i].Member()
}
