package replication

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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
	// No grace: the leader removes itself at once.
	c := newCluster(t, func(cfg *Config) { cfg.DepartedGrace = time.Nanosecond }, "a", "b", "c")
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

// TestDepartedVoterKeptWithinGrace: with as many members as replicas, a
// member that leaves the membership (paused or cut off past its lease)
// stays a voter for DepartedGrace: back within it, it votes at once with
// no configuration change, and a fault of another voter meanwhile does
// not leave the partition without a quorum. Past the grace it is
// removed.
func TestDepartedVoterKeptWithinGrace(t *testing.T) {
	for _, tc := range []struct {
		grace   time.Duration
		removed bool
	}{{time.Minute, false}, {time.Second, true}} {
		t.Run(tc.grace.String(), func(t *testing.T) {
			c := newCluster(t, func(cfg *Config) { cfg.DepartedGrace = tc.grace }, "a", "b", "c")
			p := c.engines["a"].PartitionOf(unitA)
			l := c.leader(p)
			gone := "c"
			if l == gone {
				gone = "b"
			}
			var peers []Peer
			for _, m := range c.members {
				if m != gone {
					peers = append(peers, Peer{Member: m, Addr: c.addrs[m]})
				}
			}
			for _, m := range c.members {
				if m != gone {
					if err := c.engines[m].SetMembers(context.Background(), peers, 3); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.removed {
				eventually(t, gone+" removed after its grace", func() bool {
					ids, ok := voterIDs(c.engines[c.leader(p)], p)
					return ok && !strings.Contains(ids, gone)
				})
				return
			}
			deadline := time.Now().Add(4 * c.engines[l].cfg.ElectionTimeout)
			for time.Now().Before(deadline) {
				if ids, ok := voterIDs(c.engines[l], p); ok && !strings.Contains(ids, gone) {
					t.Fatalf("%s removed within its grace of %v: voters %s", gone, tc.grace, ids)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
