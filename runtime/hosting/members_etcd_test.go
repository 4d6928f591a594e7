//go:build soak

package hosting_test

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime/hosting/internal/histcheck"
)

// TestClusterReplicatedMembersEtcd: five member processes with Replicas
// 3 over mutual TLS with etcd (the fault harness, without faults until
// the removals): each partition's voters are three of the five, so a
// request reaches members that are none of its partition's voters — the
// history client (a router-only member) hands it to whichever member its
// hash picks, and sends between devices are attributed by members that
// may run neither device's partition — and every unit must answer.
// Then two members are removed for good, one after the other (SIGKILL,
// data directory deleted, never restarted): after each removal the
// partitions' leaders move the removed member's voter seats to the
// members left. Had the first member's seats not moved, a partition
// that also had the second among its voters would be left with one
// voter of three and could answer nothing. The history must be clean:
// linearizable, no acknowledged operation lost, every final read
// answered.
func TestClusterReplicatedMembersEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 6 processes")
	}
	start := time.Now()
	fc := newFaultCluster(t, 5, 3)
	a := fc.startClient("a", 3, 6)
	t.Logf("5 members and the client ready after %v", time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	var removed []*faultNode
	// After the first removal: the lease expires, the members' views
	// drop the member, its partitions elect leaders among their two other
	// voters, which remove it and add a third (generous on a shared,
	// loaded machine: the second removal must not come before).
	for _, wait := range []time.Duration{2*etcdTTL + 8*time.Second, 2*etcdTTL + 3*time.Second} {
		victim, units := fc.busiest(a, removed...)
		fc.sigkill(victim)
		fc.deleteData(victim, units)
		removed = append(removed, victim)
		t.Logf("removed %s (SIGKILL, data deleted) serving %v", victim.name, units)
		time.Sleep(wait)
	}
	ops := fc.stop(a)
	res := histcheck.Check(ops, checkTimeout)
	t.Logf("%s; %d operations in %v", res, len(ops), time.Since(start).Round(time.Millisecond))
	if !res.Clean() || len(res.Missing) > 0 {
		t.Errorf("violations %v\nunknown (check timed out) %v\nlost %v\ntwice %v\ndeposed %v\nfinal reads failed %v",
			res.Explained, res.UnknownUnits, first(res.Lost), res.Twice, first(res.Deposed), res.Missing)
	}
	served := map[string]bool{}
	acked := 0
	for _, op := range ops {
		if op.OK {
			acked++
		}
		for _, r := range op.Replies {
			served[r.Member] = true
		}
	}
	if acked == 0 {
		t.Fatal("no operation acknowledged")
	}
	t.Logf("units answered from %d members", len(served))
}
