package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWipedVoterDoesNotElectAStaleCandidate: k1 is committed on the
// leader and one follower while the third voter is cut off. The leader
// stops and the follower loses its disk and restarts empty; the stale
// voter comes back. If the empty member voted, the stale voter would win
// with its vote and its log (without k1) would overwrite the leader's
// when it returns: an acknowledged write lost. Until the empty member
// has caught up from a leader holding k1, no leader may be elected.
func TestWipedVoterDoesNotElectAStaleCandidate(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	w := c.writer(unitA)
	p := w.p
	w.put("k0", "v0")
	l := w.engine().cfg.Member
	var followers []string
	for _, m := range c.members {
		if m != l {
			followers = append(followers, m)
		}
	}
	stale, wiped := followers[0], followers[1]
	c.engines[stale].mux.setCut(true)
	w.put("k1", "v1") // committed on the leader and wiped
	w.close()
	leaderAddr := c.addrs[l]
	if err := c.engines[l].Close(); err != nil {
		t.Fatal(err)
	}
	delete(c.engines, l)
	addr := c.loseDisk(t, wiped)
	c.start(wiped, addr)
	c.setMembers()
	c.engines[stale].mux.setCut(false)

	// Several election timeouts: the stale voter campaigns throughout.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range []string{stale, wiped} {
			if c.engines[n].IsLeader(p) {
				t.Fatalf("%s was elected leader of partition %d with the vote of %s, which lost its disk (the stale log lacks the acknowledged k1)", n, p, wiped)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(c.root, wiped, "raft", fmt.Sprintf("p%d", p), catchupMarker)); err != nil {
		t.Fatalf("the empty member's catch-up marker: %v", err)
	}
	if st := c.engines[wiped].Stats(); st.CatchingUp == 0 {
		t.Fatalf("the empty member reports no partition catching up: %+v", st)
	}
	// The leader returns with its files: it is elected, and k1 stays.
	c.start(l, leaderAddr)
	c.setMembers()
	nl := c.leader(p)
	c.caughtUp(p, nl, c.members...)
	for _, n := range c.members {
		if v, ok := metaOf(t, c.engines[n], unitA, "k1"); !ok || v != "v1" {
			t.Fatalf("acknowledged k1 on %s after the leader returned: %q %v", n, v, ok)
		}
	}
	eventually(t, "the caught-up member's marker removed", func() bool {
		pt, err := c.engines[wiped].part(p)
		return err == nil && pt.guard.mayVote()
	})
	if _, err := os.Stat(filepath.Join(c.root, wiped, "raft", fmt.Sprintf("p%d", p), catchupMarker)); !os.IsNotExist(err) {
		t.Fatalf("the caught-up member's marker is still there: %v", err)
	}
	eventually(t, "every partition of the rebuilt member caught up", func() bool { return c.engines[wiped].Stats().CatchingUp == 0 })
	if n := testutil.ToFloat64(newCollectorMetric(c.engines[wiped], "catching_up")); n != 0 {
		t.Fatalf("syncmesh_replication_partitions_catching_up %v", n)
	}
}

// TestNewEmptyVotersDoNotBootstrapAnExistingPartition: two new empty
// members are chosen as voters of a partition that exists on three
// others which do not know them yet. The lowest-named of the two must
// not bootstrap the partition (with the other's vote it would lead a
// second group); it waits until the existing group adds it.
func TestNewEmptyVotersDoNotBootstrapAnExistingPartition(t *testing.T) {
	const parts = 16
	all := map[string]string{"m1": "x", "m2": "x", "m3": "x", "m4": "x", "m5": "x"}
	p := -1
	for q := range parts {
		v := votersOf(q, all, 3)
		if v[0] == "m1" && slices.Contains(v, "m2") {
			p = q
			break
		}
	}
	if p < 0 {
		t.Fatal("no partition has m1 and m2 among its voters")
	}
	c := newCluster(t, func(cfg *Config) { cfg.Partitions = parts }, "m3", "m4", "m5")
	unit := ""
	for i := 0; unit == ""; i++ {
		if u := fmt.Sprintf("tenant/u%d", i); partitionOf(u, parts) == p {
			unit = u
		}
	}
	w := c.writer(unit)
	w.put("k1", "v1")
	w.close()
	for _, n := range []string{"m1", "m2"} {
		c.start(n, "127.0.0.1:0")
	}
	var peers []Peer
	for _, n := range []string{"m1", "m2", "m3", "m4", "m5"} {
		peers = append(peers, Peer{Member: n, Addr: c.addrs[n]})
	}
	for _, n := range []string{"m1", "m2"} { // only the new members know all five
		if err := c.engines[n].SetMembers(context.Background(), peers, 3); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(c.engines["m1"].cfg.BootstrapWait + 4*time.Second)
	for time.Now().Before(deadline) {
		for _, n := range []string{"m1", "m2"} {
			if c.engines[n].IsLeader(p) {
				t.Fatalf("%s leads partition %d, which exists on m3, m4 and m5: a second group", n, p)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.members = []string{"m1", "m2", "m3", "m4", "m5"}
	c.setMembers()
	hasMeta(t, c.engines["m1"], unit, "k1")
	hasMeta(t, c.engines["m2"], unit, "k1")
}

// TestBootstrapDecision: a candidate is bootstrapped only if every other
// member answered, with the same view, and none holds it.
func TestBootstrapDecision(t *testing.T) {
	view := viewDigest(map[string]string{"a": "1", "b": "2"})
	other := viewDigest(map[string]string{"a": "1", "b": "3"})
	held := func(ps ...int) []byte {
		b := make([]byte, 2)
		for _, p := range ps {
			b[p/8] |= 1 << (p % 8)
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		answers []probeAnswer
		want    []int
	}{
		{"alone", nil, []int{0, 3, 9}},
		{"nobody holds any", []probeAnswer{{view: view, state: held()}, {view: view, state: held()}}, []int{0, 3, 9}},
		{"one holds 3", []probeAnswer{{view: view, state: held()}, {view: view, state: held(3)}}, []int{0, 9}},
		{"held 9 in the second byte", []probeAnswer{{view: view, state: held(9, 1)}}, []int{0, 3}},
		{"a member unreachable", []probeAnswer{{view: view, state: held()}, {err: os.ErrDeadlineExceeded}}, nil},
		{"another view", []probeAnswer{{view: other, state: held()}}, nil},
		{"short bitmap reads as not held", []probeAnswer{{view: view, state: nil}}, []int{0, 3, 9}},
	} {
		if got := bootstrapDecision([]int{0, 3, 9}, view, tc.answers); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if viewDigest(map[string]string{"ab": "c"}) == viewDigest(map[string]string{"a": "bc"}) {
		t.Error("views differing in where a name ends have one digest")
	}
}

// TestCatchupMarkerSurvivesRestart: a partition started empty may not
// vote, also after a restart half-way through catching up, until it is
// confirmed; then a restart finds it eligible.
func TestCatchupMarkerSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	fail := func(err error) { t.Error(err) }
	g, err := newVoteGuard(dir, true, "a", "x", fail)
	if err != nil {
		t.Fatal(err)
	}
	if g.mayVote() {
		t.Fatal("a fresh partition may vote")
	}
	g.observe(&raft.AppendEntriesRequest{LeaderCommitIndex: 0})
	g.observe(&raft.AppendEntriesRequest{LeaderCommitIndex: 7})
	g.observe(&raft.AppendEntriesRequest{LeaderCommitIndex: 9})
	if g.target.Load() != 7 {
		t.Fatalf("target %d, want the first non-zero commit index 7", g.target.Load())
	}
	// Restarted with some state (not fresh) but not caught up.
	g, err = newVoteGuard(dir, false, "a", "x", fail)
	if err != nil {
		t.Fatal(err)
	}
	if g.mayVote() {
		t.Fatal("a partition restarted half-way through catching up may vote")
	}
	g.confirm()
	if !g.mayVote() {
		t.Fatal("confirmed, and may not vote")
	}
	g, err = newVoteGuard(dir, false, "a", "x", fail)
	if err != nil {
		t.Fatal(err)
	}
	if !g.mayVote() {
		t.Fatal("restarted after catching up, and may not vote")
	}
}

// TestProbeAnswerRoundTrip: what serveProbe writes, readProbeAnswer
// reads; a wrong size is refused.
func TestProbeAnswerRoundTrip(t *testing.T) {
	state := []byte{0b101, 0b1}
	var view [32]byte
	view[0], view[31] = 1, 2
	b := append(append(binary.AppendUvarint(nil, 2), state...), view[:]...)
	gs, gv, err := readProbeAnswer(bufioReader(b), 9)
	if err != nil || !bytes.Equal(gs, state) || gv != view {
		t.Fatalf("%v %v %v", gs, gv, err)
	}
	if _, _, err := readProbeAnswer(bufioReader(b), 17); err == nil {
		t.Fatal("an answer for 9 partitions read as one for 17")
	}
	if _, _, err := readProbeAnswer(bufioReader(b[:len(b)-1]), 9); err == nil {
		t.Fatal("a truncated answer read")
	}
}

func FuzzReadProbeAnswer(f *testing.F) {
	f.Add([]byte{2, 5, 1}, 16)
	f.Add(append([]byte{1, 1}, make([]byte, 32)...), 8)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 1<<16)
	f.Fuzz(func(t *testing.T, b []byte, partitions int) {
		if partitions < 1 || partitions > 1<<16 {
			return
		}
		state, _, err := readProbeAnswer(bufioReader(b), partitions)
		if err == nil && len(state) != (partitions+7)/8 {
			t.Fatalf("bitmap of %d bytes for %d partitions", len(state), partitions)
		}
	})
}

// TestLoneLeaderRefusesWritesWhileVotersAreWanted: a bootstrap starts as
// a configuration of one member; until the leader has added the other
// wanted voters, a write would be on one disk only and is refused
// (retryable, ErrNotLeader). With one voter wanted, it is accepted.
func TestLoneLeaderRefusesWritesWhileVotersAreWanted(t *testing.T) {
	c := newCluster(t, nil, "a")
	c.replicas = 1
	c.setMembers()
	p := c.engines["a"].PartitionOf(unitA)
	c.leader(p)
	e := c.engines["a"]
	pt, err := e.part(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.checkAlone(pt); err != nil {
		t.Fatalf("one voter wanted: %v", err)
	}
	e.mu.Lock()
	e.peers = map[string]string{"a": c.addrs["a"], "b": "127.0.0.1:1"}
	e.replicas = 3
	e.mu.Unlock()
	if err := e.checkAlone(pt); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("alone while 2 voters are wanted: %v, want ErrNotLeader", err)
	}
}
