package replication

import (
	"testing"
	"time"
)

// takeoverBudget is the part of the 5 s take-over target the raft timers
// may use: the rest goes to the new leader's barrier, its units'
// activation and the callers' retries (about 1.5 s measured by the
// replicated fault harness on a loaded 2-core machine).
const takeoverBudget = 3500 * time.Millisecond

// TestDefaultTimersFitTakeoverBudget: with the default timers, the worst
// election after a leader's loss (a follower notices after up to two
// heartbeat timeouts; one split vote costs up to two election timeouts
// more) fits the take-over budget, and the lease is within the
// heartbeat timeout (raft's own rule).
func TestDefaultTimersFitTakeoverBudget(t *testing.T) {
	c := Config{Member: "a", Dir: t.TempDir(), UnitsDir: t.TempDir(), Plaintext: true}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	if worst := 2*c.HeartbeatTimeout + 2*c.ElectionTimeout; worst > takeoverBudget {
		t.Fatalf("default timers (heartbeat %v, election %v): a take-over may spend %v electing, past the %v budget of the 5 s target",
			c.HeartbeatTimeout, c.ElectionTimeout, worst, takeoverBudget)
	}
	if c.LeaderLeaseTimeout <= 0 || c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		t.Fatalf("lease %v with heartbeat %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
}
