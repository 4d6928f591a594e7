package replication

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// Tests run three or four engines in one process over loopback mutual
// TLS, with raft timers scaled down (still loose enough for a loaded
// machine under -race). Waits poll for a state with a deadline; no sleep
// is an assertion.

const testWait = 30 * time.Second

var (
	caOnce sync.Once
	testCA *meshtls.CA
)

func ca(t testing.TB) *meshtls.CA {
	caOnce.Do(func() {
		var err error
		if testCA, err = meshtls.NewCA("replication-test", time.Hour); err != nil {
			panic(err)
		}
	})
	return testCA
}

func memberTLS(t testing.TB, name string) (server, client *tls.Config) {
	t.Helper()
	nc, err := ca(t).Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return meshtls.ServerConfig(nc.TLSCertificate(), ca(t).Pool()), meshtls.ClientConfig(nc.TLSCertificate(), ca(t).Pool())
}

type cluster struct {
	t        *testing.T
	root     string
	engines  map[string]*Engine
	addrs    map[string]string
	members  []string
	replicas int
	tweak    func(*Config)
}

func testConfig(t testing.TB, root, name, listen string) Config {
	srv, cli := memberTLS(t, name)
	return Config{
		Member: name, Dir: filepath.Join(root, name, "raft"), UnitsDir: filepath.Join(root, name, "units"),
		Partitions: 2, Listen: listen, TLS: srv, ClientTLS: cli, NoSync: true,
		HeartbeatTimeout: 800 * time.Millisecond, ElectionTimeout: 800 * time.Millisecond, LeaderLeaseTimeout: 400 * time.Millisecond,
		BootstrapWait: 1200 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(newTlogWriter(t, name), &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// tlogWriter sends an engine's log to the test log (shown on failure).
// Raft's goroutines may still log after Close returned (a closed
// connection's read error); once the test's cleanup ran, those lines are
// dropped: t.Log after the test completed panics.
type tlogWriter struct {
	t    testing.TB
	name string
	mu   *sync.Mutex
	done *bool
}

func newTlogWriter(t testing.TB, name string) tlogWriter {
	w := tlogWriter{t: t, name: name, mu: new(sync.Mutex), done: new(bool)}
	t.Cleanup(func() {
		w.mu.Lock()
		*w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w tlogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !*w.done {
		w.t.Log(w.name + ": " + strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func newCluster(t *testing.T, tweak func(*Config), names ...string) *cluster {
	c := &cluster{t: t, root: t.TempDir(), engines: map[string]*Engine{}, addrs: map[string]string{}, replicas: 3, tweak: tweak}
	for _, n := range names {
		c.start(n, "127.0.0.1:0")
	}
	c.members = names
	c.setMembers()
	t.Cleanup(func() {
		for _, e := range c.engines {
			_ = e.Close()
		}
	})
	return c
}

func (c *cluster) start(name, listen string) *Engine {
	c.t.Helper()
	cfg := testConfig(c.t, c.root, name, listen)
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	e, err := Open(context.Background(), cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.engines[name] = e
	c.addrs[name] = e.Addr()
	return e
}

func (c *cluster) setMembers() {
	c.t.Helper()
	var peers []Peer
	for _, m := range c.members {
		peers = append(peers, Peer{Member: m, Addr: c.addrs[m]})
	}
	for _, e := range c.engines {
		if err := e.SetMembers(context.Background(), peers, c.replicas); err != nil {
			c.t.Fatal(err)
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leader waits for a leader of p among the running engines that all of
// them agree on, and returns its name.
func (c *cluster) leader(p int, among ...string) string {
	c.t.Helper()
	if len(among) == 0 {
		for n := range c.engines {
			among = append(among, n)
		}
	}
	var l string
	eventually(c.t, fmt.Sprintf("a leader of partition %d among %v", p, among), func() bool {
		l = ""
		for _, n := range among {
			if c.engines[n].IsLeader(p) {
				l = n
			}
		}
		if l == "" {
			return false
		}
		for _, n := range among {
			if got, ok := c.engines[n].Leader(p); !ok || got != l {
				return false
			}
		}
		return true
	})
	return l
}

// caughtUp waits until every named engine applied what the leader of p
// applied.
func (c *cluster) caughtUp(p int, leader string, names ...string) {
	c.t.Helper()
	lp, err := c.engines[leader].part(p)
	if err != nil {
		c.t.Fatal(err)
	}
	want := lp.raft.AppliedIndex()
	for _, n := range names {
		eventually(c.t, n+" catching up", func() bool {
			pt, err := c.engines[n].part(p)
			return err == nil && pt.raft.AppliedIndex() >= want
		})
	}
}

// dumpUnit lists a replica's node.db content (every bucket, key and
// value) and its small files.
func dumpUnit(t testing.TB, e *Engine, unit string) []string {
	t.Helper()
	s := e.stores[e.PartitionOf(unit)]
	s.mu.Lock()
	_, ok := s.units[unit]
	var d *bolt.DB
	var err error
	if ok {
		d, err = s.db(unit)
	}
	var copyPath string
	if err == nil && d != nil {
		copyPath = filepath.Join(t.TempDir(), "copy.db")
		var f *os.File
		if f, err = os.Create(copyPath); err == nil {
			_, err = d.WriteBackup(context.Background(), func(int64) (io.Writer, error) { return f, nil })
			_ = f.Close()
		}
	}
	s.mu.Unlock()
	if err != nil {
		t.Fatalf("%s: %v", unit, err)
	}
	if !ok {
		return nil
	}
	var out []string
	ents, _ := os.ReadDir(e.unitDir(unit))
	for _, de := range ents {
		if de.Name() != dbName && !strings.HasPrefix(de.Name(), ".") {
			b, _ := os.ReadFile(filepath.Join(e.unitDir(unit), de.Name()))
			out = append(out, "file "+de.Name()+"="+string(b))
		}
	}
	bdb, err := bbolt.Open(copyPath, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	var walk func(prefix string, b *bbolt.Bucket) error
	walk = func(prefix string, b *bbolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+"/"+string(k), b.Bucket(k))
			}
			out = append(out, fmt.Sprintf("%s/%x=%x", prefix, k, v))
			return nil
		})
	}
	_ = bdb.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error { return walk(string(name), b) })
	})
	sort.Strings(out)
	return out
}

func putMeta(ctx context.Context, db *bolt.DB, k, v string) error {
	return db.Sync().Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta(k, []byte(v)) })
}

func metaOf(t testing.TB, e *Engine, unit, key string) (string, bool) {
	t.Helper()
	want := fmt.Sprintf("%x=", key)
	for _, l := range dumpUnit(t, e, unit) {
		if i := strings.Index(l, "sync.meta/"+want); i >= 0 {
			var v []byte
			_, _ = fmt.Sscanf(l[i+len("sync.meta/"+want):], "%x", &v)
			return string(v), true
		}
	}
	return "", false
}

// sameContent waits until the replicas of unit on es hold the same
// content (followers apply what raft committed asynchronously).
func sameContent(t testing.TB, unit string, es ...*Engine) {
	t.Helper()
	var msg string
	deadline := time.Now().Add(testWait)
	for !func() bool {
		want := dumpUnit(t, es[0], unit)
		if len(want) == 0 {
			msg = "no content on " + es[0].cfg.Member
			return false
		}
		for _, e := range es[1:] {
			got := dumpUnit(t, e, unit)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				msg = fmt.Sprintf("%s on %s differs from %s: %d vs %d entries", unit, e.cfg.Member, es[0].cfg.Member, len(got), len(want))
				return false
			}
		}
		return true
	}() {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hasMeta waits until e's replica of unit holds key.
func hasMeta(t testing.TB, e *Engine, unit, key string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s holding %s", e.cfg.Member, key), func() bool {
		_, ok := metaOf(t, e, unit, key)
		return ok
	})
}

// unitWriter writes a unit through whichever member leads its partition:
// on a loaded machine leadership may move even without faults, so a
// write refused with ErrNotLeader (or of unknown outcome) is retried on
// the current leader after its Barrier. Writes are idempotent puts.
type unitWriter struct {
	c      *cluster
	unit   string
	p      int
	mu     sync.Mutex
	leader string
	db     *bolt.DB
	detach func()
}

func (c *cluster) writer(unit string) *unitWriter {
	w := &unitWriter{c: c, unit: unit, p: c.engines[c.members[0]].PartitionOf(unit)}
	c.t.Cleanup(w.close)
	return w
}

// current returns the open DB on the leader, opening it if needed.
func (w *unitWriter) current() (*bolt.DB, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.db != nil {
		return w.db, nil
	}
	l := w.c.leader(w.p)
	e := w.c.engines[l]
	if err := e.Barrier(context.Background(), w.p); err != nil {
		return nil, err
	}
	db, detach, err := e.OpenUnit(w.unit, bolt.Options{NoSync: true})
	if err != nil {
		return nil, err
	}
	w.leader, w.db, w.detach = l, db, detach
	return db, nil
}

func (w *unitWriter) drop(db *bolt.DB) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.db == db && db != nil {
		w.detach()
		_ = db.Close()
		w.db = nil
	}
}

func (w *unitWriter) close() { w.drop(w.db) }

func (w *unitWriter) put(k, v string) {
	w.c.t.Helper()
	deadline := time.Now().Add(testWait)
	for {
		db, err := w.current()
		if err == nil {
			if err = putMeta(context.Background(), db, k, v); err == nil {
				return
			}
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, persistence.ErrClosed) {
			w.c.t.Fatalf("put %s: %v", k, err)
		}
		if time.Now().After(deadline) {
			w.c.t.Fatalf("put %s: no stable leader: %v", k, err)
		}
		w.drop(db)
	}
}

// engine returns the engine the writer last wrote through.
func (w *unitWriter) engine() *Engine {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c.engines[w.leader]
}

const unitA = "tenant/dev-a"

func TestReplicatesWriteSetsToThreeReplicas(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	ctx := context.Background()
	w := c.writer(unitA)
	p := w.p
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.put(fmt.Sprint("k", i), fmt.Sprint("v", i))
		}()
	}
	wg.Wait()
	retry := func(what string, fn func(e *Engine) error) {
		eventually(t, what, func() bool {
			err := fn(c.engines[c.leader(p)])
			if err != nil && !errors.Is(err, ErrNotLeader) {
				t.Fatalf("%s: %v", what, err)
			}
			return err == nil
		})
	}
	retry("the storage key written", func(e *Engine) error { return e.WriteFile(ctx, unitA, "storage.key", []byte("secret-1")) })
	// Committed means applied on the leader that acknowledged.
	if v, ok := metaOf(t, w.engine(), unitA, "k39"); !ok || v != "v39" {
		t.Fatalf("leader's copy: k39=%q %v", v, ok)
	}
	l := c.leader(p)
	c.caughtUp(p, l, "a", "b", "c")
	sameContent(t, unitA, c.engines["a"], c.engines["b"], c.engines["c"])
	// A second unit in the same partition; then its removal.
	other := ""
	for i := 0; other == ""; i++ {
		if u := fmt.Sprint("tenant/dev-", i); c.engines[l].PartitionOf(u) == p && u != unitA {
			other = u
		}
	}
	retry("the other unit's file", func(e *Engine) error { return e.WriteFile(ctx, other, "epoch", []byte("1")) })
	retry("the other unit removed", func(e *Engine) error { return e.RemoveUnit(ctx, other) })
	l = c.leader(p)
	c.caughtUp(p, l, "a", "b", "c")
	for n, e := range c.engines {
		eventually(t, n+" removing "+other, func() bool {
			_, err := os.Stat(e.unitDir(other))
			return errors.Is(err, os.ErrNotExist)
		})
	}
}

func TestFollowerRefusesWithErrNotLeader(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	p := c.engines["a"].PartitionOf(unitA)
	l := c.leader(p)
	for n, e := range c.engines {
		if n == l {
			continue
		}
		err := e.Committer(unitA).Commit(context.Background(), []byte("x"))
		if !errors.Is(err, ErrNotLeader) {
			t.Fatalf("follower %s Commit: %v, want ErrNotLeader", n, err)
		}
		if err := e.WriteFile(context.Background(), unitA, "f", nil); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("follower %s WriteFile: %v, want ErrNotLeader", n, err)
		}
		if err := e.VerifyLeader(context.Background(), p); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("follower %s VerifyLeader: %v, want ErrNotLeader", n, err)
		}
	}
	if err := c.engines[l].WriteFile(context.Background(), unitA, "../x", nil); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("bad name: %v", err)
	}
}

// TestLeaderChangesReportLeadership: the leader's channel reports it
// leads, a follower's who does.
func TestLeaderChangesReportLeadership(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	p := c.engines["a"].PartitionOf(unitA)
	l := c.leader(p)
	for n, e := range c.engines {
		eventually(t, n+" reporting "+l+" as leader", func() bool {
			for {
				select {
				case lc := <-e.LeaderChanges():
					if lc.Partition == p && lc.Leader == l && lc.Self == (n == l) && lc.Term > 0 {
						return true
					}
				default:
					return false
				}
			}
		})
	}
}

// TestStaleWriteSetRefusedEverywhere: a write set computed before the
// unit's previous entry was applied is refused on every replica
// (bolt.ErrStaleWriteSet back to the proposer), and the replicas stay
// equal.
func TestStaleWriteSetRefusedEverywhere(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	w := c.writer(unitA)
	w.put("k0", "v")
	// Capture two write sets on a scratch copy without committing either:
	// both read the same state.
	var sets [][]byte
	hold := holdCommitter(func(ws []byte) { sets = append(sets, ws) })
	scratch, err := bolt.Open(filepath.Join(t.TempDir(), "scratch.db"), bolt.Options{NoSync: true, Committer: hold})
	if err != nil {
		t.Fatal(err)
	}
	defer scratch.Close()
	for _, k := range []string{"x", "y"} {
		_ = putMeta(context.Background(), scratch, k, "1")
	}
	db, err := w.current()
	if err != nil {
		t.Fatal(err)
	}
	applied, err := db.AppliedIndex()
	if err != nil || applied == 0 {
		t.Fatalf("applied index %d %v", applied, err)
	}
	// Those sets read index 0; the unit is past it: stale.
	err = w.engine().Committer(unitA).Commit(context.Background(), sets[0])
	if !errors.Is(err, bolt.ErrStaleWriteSet) {
		t.Fatalf("stale set: %v, want bolt.ErrStaleWriteSet", err)
	}
	w.put("k1", "v")
	l := c.leader(w.p)
	c.caughtUp(w.p, l, "a", "b", "c")
	sameContent(t, unitA, c.engines["a"], c.engines["b"], c.engines["c"])
	for _, e := range c.engines {
		if n := e.Stats().ApplyErrors; n != 0 {
			t.Fatalf("%s counts %d apply errors for a refused stale set", e.cfg.Member, n)
		}
	}
}

type holdCommitter func([]byte)

func (h holdCommitter) Commit(_ context.Context, ws []byte) error {
	h(ws)
	return errors.New("held")
}

// TestDeposedLeaderCannotCommit cuts the leader off: the others elect a
// successor; the old leader's writes and read fence fail by term, and
// after healing its copy holds only what the successor committed.
func TestDeposedLeaderCannotCommit(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	ctx := context.Background()
	w := c.writer(unitA)
	p := w.p
	w.put("before", "1")
	w.mu.Lock()
	old, db, detach := w.leader, w.db, w.detach
	w.db = nil // this test closes it
	w.mu.Unlock()
	c.engines[old].mux.setCut(true)
	var rest []string
	for n := range c.engines {
		if n != old {
			rest = append(rest, n)
		}
	}
	succ := c.leader(p, rest...)
	cctx, cancel := context.WithTimeout(ctx, testWait)
	defer cancel()
	err := putMeta(cctx, db, "deposed", "1")
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed leader's write: %v, want ErrNotLeader", err)
	}
	if err := c.engines[old].VerifyLeader(cctx, p); err == nil {
		t.Fatal("VerifyLeader succeeded on the deposed leader")
	}
	detach()
	_ = db.Close()
	sdb, sdetach, err := c.engines[succ].OpenUnit(unitA, bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	defer sdetach()
	if err := c.engines[succ].Barrier(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := putMeta(ctx, sdb, "after", "1"); err != nil {
		t.Fatal(err)
	}
	c.engines[old].mux.setCut(false)
	c.caughtUp(p, succ, "a", "b", "c")
	for n, e := range c.engines {
		hasMeta(t, e, unitA, "after")
		if _, ok := metaOf(t, e, unitA, "deposed"); ok {
			t.Fatalf("%s holds the deposed leader's write", n)
		}
	}
}

// lostAcks cuts the leader off, writes through it, kills it, and counts
// the writes it acknowledged that the successor does not have.
func lostAcks(t *testing.T, plant bool) int {
	c := newCluster(t, func(cfg *Config) { cfg.ackBeforeCommit = plant }, "a", "b", "c")
	ctx := context.Background()
	w := c.writer(unitA)
	p := w.p
	w.put("base", "1")
	w.mu.Lock()
	old, db, detach := w.leader, w.db, w.detach
	w.db = nil // this test closes it
	w.mu.Unlock()
	c.engines[old].mux.setCut(true)
	var acked []string
	for i := range 3 {
		k := fmt.Sprint("w", i)
		cctx, cancel := context.WithTimeout(ctx, testWait)
		if putMeta(cctx, db, k, "1") == nil {
			acked = append(acked, k)
		}
		cancel()
	}
	detach()
	_ = db.Close()
	_ = c.engines[old].Close()
	delete(c.engines, old)
	succ := c.leader(p)
	if err := c.engines[succ].Barrier(ctx, p); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, k := range append([]string{"base"}, acked...) {
		if _, ok := metaOf(t, c.engines[succ], unitA, k); !ok {
			lost++
		}
	}
	return lost
}

func TestAcknowledgedWritesSurviveLeaderLoss(t *testing.T) {
	if n := lostAcks(t, false); n != 0 {
		t.Fatalf("%d acknowledged writes lost", n)
	}
}

// TestCheckerCatchesAckBeforeCommit plants the bug the check above
// exists for: acknowledging before the quorum commit loses writes.
func TestCheckerCatchesAckBeforeCommit(t *testing.T) {
	if n := lostAcks(t, true); n == 0 {
		t.Fatal("the planted ack-before-commit bug lost nothing: the check cannot see it")
	}
}

// TestRebuildAfterDiskLoss: a member that lost its disk rejoins empty at
// its address and is rebuilt from a snapshot (its log was compacted
// away on the leader).
func TestRebuildAfterDiskLoss(t *testing.T) {
	c := newCluster(t, func(cfg *Config) { cfg.TrailingLogs = 2; cfg.SnapshotThreshold = 4 }, "a", "b", "c")
	w := c.writer(unitA)
	p := w.p
	for i := range 20 {
		w.put(fmt.Sprint("k", i), "v")
	}
	victim := "a"
	if victim == w.engine().cfg.Member {
		victim = "b"
	}
	w.close() // the writer's member may lose the lead; reopen on demand
	addr := c.loseDisk(t, victim)
	for i := 20; i < 30; i++ {
		w.put(fmt.Sprint("k", i), "v")
	}
	l := c.leader(p)
	pt, _ := c.engines[l].part(p)
	if err := pt.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	c.start(victim, addr)
	c.setMembers()
	l = c.leader(p)
	c.caughtUp(p, l, victim)
	sameContent(t, unitA, c.engines[l], c.engines[victim])
	if st := c.engines[victim].Stats(); st.Restores == 0 {
		t.Fatalf("the rebuilt member installed no snapshot: %+v", st)
	}
	if v, ok := metaOf(t, c.engines[victim], unitA, "k29"); !ok || v != "v" {
		t.Fatalf("rebuilt replica: k29=%q %v", v, ok)
	}
}

// TestSetMembersReplace replaces member c by d: every partition's voters
// become {a, b, d} through the leaders' configuration changes, and d
// receives the units.
func TestSetMembersReplace(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	w := c.writer(unitA)
	p := w.p
	w.put("k", "v")
	w.close()
	c.start("d", "127.0.0.1:0")
	c.members = []string{"a", "b", "c", "d"}
	c.setMembers() // R=3 of 4: rendezvous picks 3 per partition
	c.members = []string{"a", "b", "d"}
	c.setMembers()
	for q := range 2 {
		eventually(t, fmt.Sprintf("partition %d voters {a b d}", q), func() bool {
			for _, n := range []string{"a", "b", "d"} {
				if ids, ok := voterIDs(c.engines[n], q); !ok || ids != "a b d" {
					return false
				}
			}
			return true
		})
	}
	nl := c.leader(p, "a", "b", "d")
	c.caughtUp(p, nl, "d")
	hasMeta(t, c.engines["d"], unitA, "k")
	if v, ok := metaOf(t, c.engines["d"], unitA, "k"); !ok || v != "v" {
		t.Fatalf("new member d: k=%q %v", v, ok)
	}
	// Shrink to R=1 on the remaining members: two voters leave each group.
	c.replicas = 1
	c.setMembers()
	for q := range 2 {
		eventually(t, fmt.Sprintf("partition %d has one voter", q), func() bool {
			l, ok := "", false
			for _, n := range []string{"a", "b", "d"} {
				if c.engines[n].IsLeader(q) {
					l, ok = n, true
				}
			}
			if !ok {
				return false
			}
			pt, _ := c.engines[l].part(q)
			f := pt.raft.GetConfiguration()
			return f.Error() == nil && len(f.Configuration().Servers) == 1
		})
	}
}

// TestDepartedVoterRemovedFirst: voter c leaves the membership while
// its replacement d is named but cannot be reached yet (registered, its
// replication listener not up). The leaders remove c before adding d,
// so every partition keeps a live quorum ({a b}, then {a b d}, whose
// quorum of 2 needs no d) and its writes go on. Adding d first would
// make {a b c d} the configuration, whose quorum of 3 needs d.
func TestDepartedVoterRemovedFirst(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	w := c.writer(unitA)
	w.put("k1", "v1")
	w.close()
	if err := c.engines["c"].Close(); err != nil {
		t.Fatal(err)
	}
	delete(c.engines, "c")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addrs["d"] = l.Addr().String()
	_ = l.Close() // d refuses connections
	c.members = []string{"a", "b", "d"}
	c.setMembers()
	w = c.writer(unitA)
	w.put("k2", "v2")
	for q := range 2 {
		eventually(t, fmt.Sprintf("partition %d voters {a b d}", q), func() bool {
			l := ""
			for _, n := range []string{"a", "b"} {
				if c.engines[n].IsLeader(q) {
					l = n
				}
			}
			if l == "" {
				return false
			}
			ids, ok := voterIDs(c.engines[l], q)
			return ok && ids == "a b d"
		})
	}
	sameContent(t, unitA, c.engines["a"], c.engines["b"])
	if v, ok := metaOf(t, c.engines["b"], unitA, "k1"); !ok || v != "v1" {
		t.Fatalf("acknowledged k1 after c left: %q %v", v, ok)
	}
}

// TestRefusesNonMember: a certificate from the mesh CA that names no
// current member is refused at the handshake and counted.
func TestRefusesNonMember(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	_, cli := memberTLS(t, "mallory")
	cli.ServerName = "a"
	conn, err := tls.Dial("tcp", c.addrs["a"], cli)
	if err == nil {
		_, _ = conn.Write(append([]byte("SMR1"), 0, 0))
		_ = conn.SetReadDeadline(time.Now().Add(testWait))
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	if err == nil {
		t.Fatal("mallory's connection stayed open")
	}
	eventually(t, "the refusal counted", func() bool { return c.engines["a"].Stats().RefusedConnections > 0 })
	if n := testutil.ToFloat64(newCollectorMetric(c.engines["a"], "refused")); n < 1 {
		t.Fatalf("syncmesh_replication_refused_connections_total %v", n)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	for _, e := range []entry{
		{kind: kindWriteSet, unit: "t/u", payload: []byte("SMW1....")},
		{kind: kindFile, unit: "u", name: "storage.key", payload: []byte{1, 2}},
		{kind: kindRemove, unit: "a/b/c"},
		{kind: kindReserve, unit: "tenants/74", name: "group.ab", payload: []byte{0x80, 1}},
		{kind: kindRelease, unit: "tenants/74", name: "group.ab"},
	} {
		b, err := e.encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 2, 2, '.', '.', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			if !errors.Is(err, ErrBadEntry) {
				t.Fatalf("error %v is not ErrBadEntry", err)
			}
			return
		}
		again, err := e.encode()
		if err != nil || string(again) != string(b) {
			t.Fatalf("re-encoded %x (%v), decoded from %x", again, err, b)
		}
	})
}

func FuzzReadSnapshot(f *testing.F) {
	f.Add([]byte("E"))
	f.Add(append(append([]byte{'F', 1, 'u', 7}, "node.db"...), 0, 0, 0, 0, 0, 0, 0, 2, 'x', 'y', 'E'))
	f.Add([]byte{'F', 3, '.', '.', '/'})
	f.Fuzz(func(t *testing.T, b []byte) {
		files, err := readSnapshot(bufioReader(b), t.TempDir())
		if err != nil {
			if !errors.Is(err, ErrBadSnapshot) {
				t.Fatalf("error %v is not ErrBadSnapshot", err)
			}
			return
		}
		for _, sf := range files {
			if checkUnitPath(sf.unit) != nil {
				t.Fatalf("accepted unit path %q", sf.unit)
			}
		}
	})
}

// newCollectorMetric is a collector of e exporting one of its metrics.
func newCollectorMetric(e *Engine, which string) prometheus.Collector {
	c := newCollector(e)
	return onlyDesc{c, map[string]*prometheus.Desc{"refused": c.refused, "catching_up": c.catchingUp}[which]}
}

type onlyDesc struct {
	c *collector
	d *prometheus.Desc
}

func (o onlyDesc) Describe(ch chan<- *prometheus.Desc) { ch <- o.d }
func (o onlyDesc) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 16)
	o.c.Collect(all)
	close(all)
	for m := range all {
		if m.Desc() == o.d {
			ch <- m
		}
	}
}

// voterIDs returns the servers of partition q's configuration as e sees
// it, sorted and space-separated; ok is false while it cannot tell.
func voterIDs(e *Engine, q int) (ids string, ok bool) {
	pt, err := e.part(q)
	if err != nil {
		return "", false
	}
	f := pt.raft.GetConfiguration()
	if f.Error() != nil {
		return "", false
	}
	var l []string
	for _, s := range f.Configuration().Servers {
		l = append(l, string(s.ID))
	}
	sort.Strings(l)
	return strings.Join(l, " "), true
}

// loseDisk stops member n and deletes its data directory (a machine that
// lost its disk); it returns the address to start it again at.
func (c *cluster) loseDisk(t *testing.T, n string) string {
	t.Helper()
	addr := c.addrs[n]
	if err := c.engines[n].Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(c.root, n)); err != nil {
		t.Fatal(err)
	}
	delete(c.engines, n)
	return addr
}

// TestPartitionOfWithoutAnEngine: a member with no engine (a router)
// computes the same partition of a unit as the engines do, for the
// default and for a configured partition count.
func TestPartitionOfWithoutAnEngine(t *testing.T) {
	for _, n := range []int{0, 7, 64} {
		cfg := Config{Partitions: n}
		if n == 0 {
			cfg.Partitions = DefaultPartitions // what Open makes of 0
		}
		e := &Engine{cfg: cfg}
		seen := map[int]bool{}
		for i := range 200 {
			path := fmt.Sprintf("group/%x", i)
			p := PartitionOf(path, n)
			if p != e.PartitionOf(path) || p < 0 || p >= cfg.Partitions {
				t.Fatalf("%d partitions: %s is %d without an engine, %d with one", n, path, p, e.PartitionOf(path))
			}
			seen[p] = true
		}
		if len(seen) < cfg.Partitions/2 {
			t.Fatalf("%d partitions: 200 units hit only %d", cfg.Partitions, len(seen))
		}
	}
}
