package hosting

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

var errFakeNotLeader = errors.New("fake engine: not the leader")

// fakeReplicas is a replicaSet with one partition per unit path's first
// byte parity, whose leadership the test sets; files are written
// locally (one replica), and writes through openStore are not
// intercepted: it checks hosting's side of the contract, not the engine.
type fakeReplicas struct {
	root string
	mu   sync.Mutex
	lead map[int]string
	self string
	// verifyErr, when set, fails the read fence.
	verifyErr error
	writes    []string // unitPath/name of every replicated file write
	removed   []string
	attached  map[string]bool
	changes   chan leaderChange
	// terms is each partition's term (0: 1).
	terms map[int]uint64
}

func newFakeReplicas(root, self string) *fakeReplicas {
	return &fakeReplicas{root: root, self: self, lead: map[int]string{}, attached: map[string]bool{}, changes: make(chan leaderChange, 16)}
}

func (f *fakeReplicas) addr() string                                         { return "127.0.0.1:9" }
func (f *fakeReplicas) partitionOf(path string) int                          { return int(path[len(path)-1]) % 2 }
func (f *fakeReplicas) leaderChanges() <-chan leaderChange                   { return f.changes }
func (f *fakeReplicas) setMembers(context.Context, []replicaPeer, int) error { return nil }
func (f *fakeReplicas) barrier(context.Context, int) error                   { return nil }
func (f *fakeReplicas) close() error                                         { return nil }
func (f *fakeReplicas) deposed(err error) bool                               { return errors.Is(err, errFakeNotLeader) }
func (f *fakeReplicas) leader(p int) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.lead[p]
	return l, ok
}
func (f *fakeReplicas) isLeader(p int) bool { l, _ := f.leader(p); return l == f.self }
func (f *fakeReplicas) setLeader(p int, m string) {
	f.mu.Lock()
	f.lead[p] = m
	f.mu.Unlock()
}
func (f *fakeReplicas) openStore(path, file string, opts bolt.Options) (*bolt.DB, func(), error) {
	db, err := bolt.Open(file, opts)
	if err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	f.attached[path] = true
	f.mu.Unlock()
	return db, func() { f.mu.Lock(); delete(f.attached, path); f.mu.Unlock() }, nil
}
func (f *fakeReplicas) writeFile(_ context.Context, path, name string, data []byte) error {
	if !f.isLeader(f.partitionOf(path)) {
		return errFakeNotLeader
	}
	f.mu.Lock()
	f.writes = append(f.writes, path+"/"+name)
	f.mu.Unlock()
	return writeFileAtomic(filepath.Join(f.root, filepath.FromSlash(path)), name, data, false)
}
func (f *fakeReplicas) removeUnit(_ context.Context, path string) error {
	if !f.isLeader(f.partitionOf(path)) {
		return errFakeNotLeader
	}
	f.mu.Lock()
	f.removed = append(f.removed, path)
	f.mu.Unlock()
	return os.RemoveAll(filepath.Join(f.root, filepath.FromSlash(path)))
}
func (f *fakeReplicas) term(p int) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(f.terms[p], 1), f.lead[p] == f.self
}
func (f *fakeReplicas) setTerm(p int, t uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.terms == nil {
		f.terms = map[int]uint64{}
	}
	f.terms[p] = t
}
func (f *fakeReplicas) checkTerm(ctx context.Context, p int, term uint64) error {
	if err := f.verifyLeader(ctx, p); err != nil {
		return err
	}
	if now, _ := f.term(p); now != term {
		return fmt.Errorf("%w: term %d, began in %d", errFakeNotLeader, now, term)
	}
	return nil
}

// reserve and release keep the fake's one copy of a record's slots.
func (f *fakeReplicas) reserve(_ context.Context, path, name string, limit int) error {
	dir := filepath.Join(f.root, filepath.FromSlash(path))
	if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
		return nil
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) >= limit {
		return fmt.Errorf("%w: fake record %s full", ErrQuota, path)
	}
	return writeFileAtomic(dir, name, nil, false)
}
func (f *fakeReplicas) release(_ context.Context, path, name string) error {
	err := os.Remove(filepath.Join(f.root, filepath.FromSlash(path), name))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
func (f *fakeReplicas) verifyLeader(_ context.Context, p int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.verifyErr != nil {
		return f.verifyErr
	}
	if f.lead[p] != f.self {
		return errFakeNotLeader
	}
	return nil
}

// TestLeadershipDecision drives decideLead: a member serves a partition
// only after the barrier of the term it leads in; a change of term or
// leader closes what it had open; a late barrier of an older term and a
// stale change are ignored.
func TestLeadershipDecision(t *testing.T) {
	var s leadState
	var eff leadEffect
	step := func(in leadInput) { t.Helper(); s, eff = decideLead(s, in) }
	ch := func(term uint64, self bool) leadInput {
		return leadInput{change: &leaderChange{term: term, self: self}}
	}

	step(ch(1, false))
	if eff.release || eff.barrier != 0 || s.ready {
		t.Fatalf("another member leads: %+v %+v", s, eff)
	}
	step(ch(2, true))
	if eff.barrier != 2 || eff.release || s.ready {
		t.Fatalf("won term 2: %+v %+v, want a barrier and not serving", s, eff)
	}
	step(leadInput{barrier: 1})
	if s.ready {
		t.Fatalf("an older term's barrier made it serve: %+v", s)
	}
	step(leadInput{barrier: 2})
	if !s.ready {
		t.Fatalf("barrier of term 2 done, not serving: %+v", s)
	}
	step(ch(2, true))
	if eff != (leadEffect{}) || !s.ready {
		t.Fatalf("repeated change: %+v %+v", s, eff)
	}
	step(ch(1, false))
	if eff != (leadEffect{}) || !s.ready {
		t.Fatalf("stale change: %+v %+v", s, eff)
	}
	step(ch(4, true)) // lost and won again in between: state of term 2 is not served in term 4
	if !eff.release || eff.barrier != 4 || s.ready {
		t.Fatalf("new term: %+v %+v, want release and a barrier", s, eff)
	}
	step(leadInput{barrier: 4})
	step(ch(5, false))
	if !eff.release || s.ready || s.self {
		t.Fatalf("deposed: %+v %+v, want release and not serving", s, eff)
	}
}

// TestReplicaAddressInMemberID: a replicated member's id carries its
// name and replication address; the membership handed to the engine is
// one address per name, the same from any order of the view.
func TestReplicaAddressInMemberID(t *testing.T) {
	ids := []string{"b@sys2@10.0.0.2:7000", "a@sys1@10.0.0.1:7000", "router@sys3", "a@sys0@10.0.0.9:7000", "plain"}
	if got := replicaAddrOf(ids[0]); got != "10.0.0.2:7000" || memberIDOf(ids[0]) != "b" {
		t.Fatalf("id %q: name %q addr %q", ids[0], memberIDOf(ids[0]), got)
	}
	want := []replicaPeer{{"a", "10.0.0.1:7000"}, {"b", "10.0.0.2:7000"}}
	if got := peersOf(ids); !slices.Equal(got, want) {
		t.Fatalf("peers %v, want %v", got, want)
	}
	slices.Reverse(ids)
	if got := peersOf(ids); !slices.Equal(got, want) {
		t.Fatalf("peers (reversed view) %v, want %v", got, want)
	}
}

// replicatedView is a replicated incarnation of member "a" (address
// 127.0.0.1:7001) beside "b" (7002), on a fake engine.
func replicatedView(t *testing.T) (*incarnation, *fakeReplicas, string) {
	t.Helper()
	root := t.TempDir()
	f := newFakeReplicas(root, "a")
	c := &Cluster{timeout: time.Second, done: make(chan struct{})}
	c.h = newHost(Config{Root: root, MeshID: fenceMesh, NoSync: true}, "127.0.0.1:7001", actortest.System(t), nil)
	c.h.repl = f
	t.Cleanup(func() { _ = c.h.close() })
	inc := &incarnation{c: c, self: "127.0.0.1:7001", changed: make(chan struct{})}
	inc.started.Store(true)
	inc.onTopology([]*cluster.Member{
		{Id: "a@s1@127.0.0.1:9001", Host: "127.0.0.1", Port: 7001, Kinds: []string{KindGroup}},
		{Id: "b@s2@127.0.0.1:9002", Host: "127.0.0.1", Port: 7002, Kinds: []string{KindGroup}},
	})
	return inc, f, root
}

// TestReplicatedUnitServedByItsPartitionLeaderOnly: routing and serving
// follow the partition's leader, not the view's hash: the owner is the
// leader's address; a member that leads serves only after its barrier;
// losing the lead closes the partition's units at once; a write set the
// engine refuses (deposed) and a failed read fence both answer
// ErrNotOwner (the caller retries on the leader) and close the unit;
// nothing is answered as current by a member whose lead is not
// confirmed. The unit's storage key, owner and epochs are replicated
// files, node.db has no mark files beside it.
func TestReplicatedUnitServedByItsPartitionLeaderOnly(t *testing.T) {
	inc, f, root := replicatedView(t)
	c := inc.c
	h := c.h
	ctx := context.Background()
	g := "g1"
	p := f.partitionOf(unitPath(KindGroup, g))

	if o := inc.owner(KindGroup, g); o != "" {
		t.Fatalf("owner with no leader known: %q", o)
	}
	f.setLeader(p, "b")
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7002" {
		t.Fatalf("owner with b leading: %q", o)
	}
	if err := inc.check(KindGroup, g); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("check while b leads: %v", err)
	}
	f.setLeader(p, "a")
	c.lead.step(p, leadInput{change: &leaderChange{partition: p, leader: "a", term: 3, self: true}})
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7001" {
		t.Fatalf("owner with a leading: %q", o)
	}
	if err := inc.check(KindGroup, g); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("check before the barrier: %v", err)
	}
	c.lead.step(p, leadInput{barrier: 3})
	gate := func() error { return inc.check(KindGroup, g) }
	if err := gate(); err != nil {
		t.Fatalf("check after the barrier: %v", err)
	}

	if err := h.admit(KindGroup, g, &Request{Op: OpCreate, Principal: &Principal{Tenant: "test"}}); err != nil {
		t.Fatal(err)
	}
	u, err := h.acquire(ctx, KindGroup, g, gate)
	if err != nil {
		t.Fatal(err)
	}
	path := unitPath(KindGroup, g)
	for _, w := range []string{path + "/" + ownerFile, path + "/" + storageKeyFile, path + "/" + epochFile} {
		if !slices.Contains(f.writes, w) {
			t.Errorf("%s not written through the engine (writes %v)", w, f.writes)
		}
	}
	if !f.attached[path] {
		t.Fatal("node.db not opened through the engine")
	}
	if rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate); rep.Code != CodeOK || rep.Epoch != 1 {
		t.Fatalf("leader's read: %+v", rep)
	}
	ents, _ := os.ReadDir(unitDir(root, KindGroup, g))
	for _, e := range ents {
		switch e.Name() {
		case "node.db", ownerFile, storageKeyFile, epochFile:
		default:
			t.Errorf("%s beside a replicated unit", e.Name())
		}
	}

	// A read whose fence fails (a partition cut this member off; its
	// term is not confirmed) answers nothing as current.
	f.mu.Lock()
	f.verifyErr = fmt.Errorf("%w: lease lost", errFakeNotLeader)
	f.mu.Unlock()
	rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate)
	if rep.Code != CodeUnavailable || !errors.Is(rep.Err(), ErrUnavailable) {
		t.Fatalf("read without a confirmed lead: %+v", rep)
	}
	if !u.closed.Load() || len(h.hosted()) != 0 {
		t.Fatal("the unit stayed open after its read fence failed")
	}
	f.mu.Lock()
	f.verifyErr = nil
	f.mu.Unlock()

	// Served again (a new activation: the next epoch), then deposed:
	// b leads term 4. The unit closes at once and the member refuses.
	u, err = h.acquire(ctx, KindGroup, g, gate)
	if err != nil || u.epoch != 2 {
		t.Fatalf("reactivation: %v, epoch %v", err, u)
	}
	f.setLeader(p, "b")
	go c.watchLeaders(c.done)
	f.changes <- leaderChange{partition: p, leader: "b", term: 4}
	deadline := time.Now().Add(10 * time.Second)
	for !u.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the unit stayed open after its partition's lead was lost")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for {
		f.mu.Lock()
		attached := f.attached[path]
		f.mu.Unlock()
		if !attached {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the closed unit's store is still attached to the engine")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(c.done)
	if err := gate(); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("check after losing the lead: %v", err)
	}
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7002" {
		t.Fatalf("owner after b won: %q", o)
	}
	// A request that reached the old grain is refused with ErrNotOwner.
	if rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate); rep.Code != CodeUnavailable {
		t.Fatalf("deposed member answered: %+v", rep)
	}
	// Deleting needs the lead too: the engine refuses, nothing changes.
	if _, err := h.remove(KindGroup, g); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("remove on a deposed member: %v", err)
	}
	if _, err := ownerOf(root, KindGroup, g); err != nil {
		t.Fatalf("refused delete changed the unit: %v", err)
	}
}

// TestReplicatedReplyFencedByTerm: a reply is current only if its member
// led the unit's partition in the same term from the activation's start
// to the reply. Here the member was deposed (a successor served in term
// 4) and won the lead back in term 5 before its leadership watch saw
// either change: a quorum follows it again, yet the activation's state
// dates from term 3, so the reply is refused and the unit closed.
func TestReplicatedReplyFencedByTerm(t *testing.T) {
	inc, f, _ := replicatedView(t)
	c := inc.c
	h := c.h
	ctx := context.Background()
	g := "g1"
	p := f.partitionOf(unitPath(KindGroup, g))
	f.setLeader(p, "a")
	f.setTerm(p, 3)
	c.lead.step(p, leadInput{change: &leaderChange{partition: p, leader: "a", term: 3, self: true}})
	c.lead.step(p, leadInput{barrier: 3})
	gate := func() error { return inc.check(KindGroup, g) }
	if err := h.admit(KindGroup, g, &Request{Op: OpCreate, Principal: &Principal{Tenant: "test"}}); err != nil {
		t.Fatal(err)
	}
	u, err := h.acquire(ctx, KindGroup, g, gate)
	if err != nil {
		t.Fatal(err)
	}
	if rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate); rep.Code != CodeOK || rep.Term != 3 {
		t.Fatalf("leader's read in term 3: %+v", rep)
	}
	f.setTerm(p, 5)
	rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate)
	if rep.Code == CodeOK {
		t.Fatalf("answered as current in term 5 by an activation of term 3: %+v", rep)
	}
	if !errors.Is(rep.Err(), ErrUnavailable) || !u.closed.Load() {
		t.Fatalf("refusal %+v (closed %v), want ErrUnavailable and the unit closed", rep, u.closed.Load())
	}
	// The next activation is of term 5 and serves.
	u, err = h.acquire(ctx, KindGroup, g, gate)
	if err != nil {
		t.Fatal(err)
	}
	if rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate); rep.Code != CodeOK || rep.Term != 5 {
		t.Fatalf("read of the term-5 activation: %+v", rep)
	}
}

// TestRequestFollowsLeaderChange: a request waiting on a replicated
// unit's old leader is abandoned once another member is known to lead
// (not waited out until its timeout or the old member's lease), and the
// wait before the next attempt ends at a leadership change.
func TestRequestFollowsLeaderChange(t *testing.T) {
	inc, f, _ := replicatedView(t)
	c := inc.c
	g := "g1"
	p := f.partitionOf(unitPath(KindGroup, g))
	f.setLeader(p, "b")
	if inc.leaderMoved(KindGroup, g, "127.0.0.1:7002") {
		t.Fatal("moved while its target still leads")
	}
	f.setLeader(p, "a")
	if !inc.leaderMoved(KindGroup, g, "127.0.0.1:7002") {
		t.Fatal("a request to the old leader b is not redirected to a")
	}
	if inc.leaderMoved(KindGroup, g, "") {
		t.Fatal("moved without a target")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		moved bool
		err   error
	}
	ch := make(chan res, 1)
	lead := c.lead.changes()
	start := time.Now()
	go func() {
		moved, err := retryWait(ctx, 20*time.Second, lead)
		ch <- res{moved, err}
	}()
	c.lead.step(p, leadInput{change: &leaderChange{partition: p, leader: "a", term: 7, self: true}})
	select {
	case r := <-ch:
		if !r.moved || r.err != nil {
			t.Fatalf("retry wait ended by a leader change: moved %v, %v", r.moved, r.err)
		}
	case <-ctx.Done():
		t.Fatalf("the retry wait did not end at the leader change (%v)", time.Since(start))
	}
	if moved, err := retryWait(ctx, time.Millisecond, nil); moved || err != nil {
		t.Fatalf("plain backoff: moved %v, %v", moved, err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := retryWait(cctx, time.Hour, c.lead.changes()); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context: %v", err)
	}
}
