package hosting

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

// quotaMembers is three members' hosts on real replication engines
// (loopback, plaintext), each with a root of its own.
type quotaMembers struct {
	t     *testing.T
	dir   string
	hosts map[string]*host
	addrs map[string]string
}

func (q *quotaMembers) start(name, listen string) {
	q.t.Helper()
	root := filepath.Join(q.dir, name)
	cc := &ClusterConfig{Config: Config{Root: root, MeshID: fenceMesh, NoSync: true, TenantQuota: 1}, Plaintext: true,
		Replication: ReplicationConfig{Listen: listen, Partitions: 2, ElectionTimeout: 400 * time.Millisecond}}
	rs, err := openReplicaSet(context.Background(), cc, name)
	if err != nil {
		q.t.Fatal(err)
	}
	h := newHost(cc.Config, name, actortest.System(q.t), nil)
	h.repl = rs
	q.hosts[name], q.addrs[name] = h, rs.addr()
}

func (q *quotaMembers) stop(name string) {
	h := q.hosts[name]
	_ = h.close()
	_ = h.repl.close()
	delete(q.hosts, name)
}

func (q *quotaMembers) setMembers() {
	q.t.Helper()
	var peers []replicaPeer
	for _, n := range []string{"a", "b", "c"} {
		peers = append(peers, replicaPeer{n, q.addrs[n]})
	}
	for _, h := range q.hosts {
		if err := h.repl.setMembers(context.Background(), peers, 3); err != nil {
			q.t.Fatal(err)
		}
	}
}

// onLeader runs op on the host leading the unit's partition, again while
// the lead moves (ErrNotOwner), and returns the leader and op's result.
func (q *quotaMembers) onLeader(kind, identity string, op func(h *host) error) (string, error) {
	q.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var leader string
		var err error = ErrNotOwner
		for n, h := range q.hosts {
			if h.repl.isLeader(h.repl.partitionOf(unitPath(kind, identity))) {
				leader = n
				err = op(h)
				break
			}
		}
		if !errors.Is(err, ErrNotOwner) || time.Now().After(deadline) {
			return leader, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplicatedTenantQuotaHoldsAcrossMembers: a tenant's quota is
// counted in a replicated record, not in the creating member's root: a
// member rebuilt after losing its disk, or another member leading the
// next unit's partition, refuses a unit past the quota; a deletion
// through whichever member leads frees the slot.
func TestReplicatedTenantQuotaHoldsAcrossMembers(t *testing.T) {
	q := &quotaMembers{t: t, dir: t.TempDir(), hosts: map[string]*host{}, addrs: map[string]string{}}
	for _, n := range []string{"a", "b", "c"} {
		q.start(n, "127.0.0.1:0")
	}
	t.Cleanup(func() {
		for n := range q.hosts {
			q.stop(n)
		}
	})
	q.setMembers()
	create := func(g string) func(h *host) error {
		return func(h *host) error {
			return h.admit(KindGroup, g, &Request{Op: OpCreate, Principal: &Principal{Tenant: "t1"}})
		}
	}

	l1, err := q.onLeader(KindGroup, "g1", create("g1"))
	if err != nil {
		t.Fatalf("create g1 on %s: %v", l1, err)
	}
	// g1's leader loses its disk and rejoins empty at its address.
	addr := q.addrs[l1]
	q.stop(l1)
	if err := os.RemoveAll(filepath.Join(q.dir, l1)); err != nil {
		t.Fatal(err)
	}
	q.start(l1, addr)
	q.setMembers()

	l2, err := q.onLeader(KindGroup, "g2", create("g2"))
	if !errors.Is(err, ErrQuota) {
		t.Fatalf("create g2 on %s, tenant at its quota of 1 (g1 created on %s, which then lost its disk): %v, want ErrQuota", l2, l1, err)
	}
	if _, err := ownerOf(q.hosts[l2].cfg.Root, KindGroup, "g2"); !errors.Is(err, ErrNotProvisioned) {
		t.Fatalf("the refused creation left g2: %v", err)
	}
	if ld, err := q.onLeader(KindGroup, "g1", func(h *host) error { _, err := h.remove(KindGroup, "g1"); return err }); err != nil {
		t.Fatalf("delete g1 on %s: %v", ld, err)
	}
	if ld, err := q.onLeader(KindGroup, "g2", create("g2")); err != nil {
		t.Fatalf("create g2 on %s after g1's deletion: %v", ld, err)
	}
}
