package replication

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestCheckTermRefusesAfterAnotherTerm is the window of a paused leader:
// it is cut off, a successor leads and commits, it comes back and even
// wins the lead again; VerifyLeader then passes (a quorum follows it
// now), but CheckTerm with the term its request began in refuses: it
// did not lead throughout.
func TestCheckTermRefusesAfterAnotherTerm(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	const unit = "tenants/77"
	p := c.engines["a"].PartitionOf(unit)
	old := c.leader(p)
	t0, leading := c.engines[old].Term(p)
	if !leading || t0 == 0 {
		t.Fatalf("the leader's term: %d, leading %v", t0, leading)
	}
	if err := c.engines[old].CheckTerm(ctx, p, t0); err != nil {
		t.Fatalf("CheckTerm in the leader's own term: %v", err)
	}

	c.engines[old].mux.setCut(true)
	var rest []string
	for n := range c.engines {
		if n != old {
			rest = append(rest, n)
		}
	}
	succ := c.leader(p, rest...)
	if err := c.engines[succ].Reserve(ctx, unit, "by-successor", 5); err != nil {
		t.Fatal(err)
	}
	c.engines[old].mux.setCut(false)
	eventually(t, old+" in a later term", func() bool {
		term, _ := c.engines[old].Term(p)
		return term > t0
	})
	if err := c.engines[old].CheckTerm(ctx, p, t0); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("CheckTerm on the deposed leader: %v, want ErrNotLeader", err)
	}

	// The lead goes back to the old leader (if its return did not win
	// it already): a later term.
	if l := c.leader(p); l != old {
		c.caughtUp(p, l, old)
		pt, err := c.engines[l].part(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := pt.raft.LeadershipTransferToServer(raft.ServerID(old), raft.ServerAddress(c.addrs[old])).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if l := c.leader(p); l != old {
		t.Fatalf("leader after the transfer: %s, want %s", l, old)
	}
	if err := c.engines[old].VerifyLeader(ctx, p); err != nil {
		t.Fatalf("VerifyLeader on the re-elected leader: %v", err)
	}
	err := c.engines[old].CheckTerm(ctx, p, t0)
	if !errors.Is(err, ErrTermChanged) || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("CheckTerm with the term before the successor's: %v, want ErrTermChanged", err)
	}
	t1, _ := c.engines[old].Term(p)
	if err := c.engines[old].CheckTerm(ctx, p, t1); err != nil {
		t.Fatalf("CheckTerm in the new term %d: %v", t1, err)
	}
}
