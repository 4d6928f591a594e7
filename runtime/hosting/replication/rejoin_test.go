package replication

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLeaderThatRemovedItselfRejoins: a leader whose own view of the
// membership briefly lacks itself (its registration expired while it was
// paused or cut off) removes itself from the partitions it leads. Its
// raft group must stay a follower, not shut down: the other members add
// it back at once (their view never lost it), and a partition whose
// third voter is a dead group loses a quorum at the next fault.
func TestLeaderThatRemovedItselfRejoins(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	p := c.engines["a"].PartitionOf(unitA)
	l := c.leader(p)
	var others []string
	var peers []Peer
	for _, m := range c.members {
		if m != l {
			others = append(others, m)
			peers = append(peers, Peer{Member: m, Addr: c.addrs[m]})
		}
	}
	// Only the leader's view loses the leader.
	if err := c.engines[l].SetMembers(context.Background(), peers, 3); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the leader "+l+" leaving partition's lead", func() bool { return !c.engines[l].IsLeader(p) })
	// Its view is whole again, like every other member's.
	c.setMembers()
	nl := c.leader(p, others...)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := c.engines[nl].WriteFile(ctx, unitA, "after", []byte("x")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(c.root, l, "units", filepath.FromSlash(unitA), "after")
	deadline := time.Now().Add(testWait)
	for {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			pt, _ := c.engines[l].part(p)
			t.Fatalf("%s never applied a write of partition %d after it removed itself (its raft: %v)", l, p, pt.raft.State())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
