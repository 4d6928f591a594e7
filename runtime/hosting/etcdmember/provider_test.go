package etcdmember_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/runtime/hosting/etcdmember"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdtest"
)

func TestConfigIsValidated(t *testing.T) {
	for name, cfg := range map[string]etcdmember.Config{
		"no endpoints":      {},
		"TTL below minimum": {Endpoints: []string{"http://127.0.0.1:1"}, TTL: time.Second},
		"fractional TTL":    {Endpoints: []string{"http://127.0.0.1:1"}, TTL: 2500 * time.Millisecond},
		"margin ≥ TTL":      {Endpoints: []string{"http://127.0.0.1:1"}, TTL: 2 * time.Second, Margin: 2 * time.Second},
		"negative margin":   {Endpoints: []string{"http://127.0.0.1:1"}, Margin: -time.Second},
	} {
		if _, err := etcdmember.New(cfg); !errors.Is(err, etcdmember.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// view records the topologies the cluster publishes (protoactor's
// MemberList is read without its lock, so the test watches the events).
type view struct {
	mu  sync.Mutex
	ids []string
}

func (v *view) has(id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Contains(v.ids, id)
}

func eventually(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}

// TestRegistrationViewAndLoss runs the provider against a real etcd
// (started here) under one protoactor cluster member: the member's key is
// named after its actor system id and held by a lease; the view follows
// other members' keys; the registration is lost (Lost closed, ValidUntil
// zero, GetHealthStatus ErrLeaseLost) when the member's own key is
// deleted and when its lease is revoked; and a re-registration under the
// SAME id is ignored by the member list that saw it leave (protoactor
// block-lists a member that left) — why a fenced member must rejoin under
// a new id (hosting.Cluster does, on a new actor system).
//
// It starts one protoactor remote in this process: run it once per
// process (-count=1, as make test does). A second run's remote.Start
// replaces gRPC's global logger while gRPC goroutines of the first run's
// clients are still winding down, which -race reports inside protoactor
// and gRPC (DESIGN: several remotes in one process).
func TestRegistrationViewAndLoss(t *testing.T) {
	endpoint := etcdtest.Start(t)
	ttl := 2 * time.Second
	prov, err := etcdmember.New(etcdmember.Config{Endpoints: []string{endpoint}, TTL: ttl, Prefix: "/t"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	sys := actortest.QuietSystem()
	c := cluster.New(sys, cluster.Configure("c", prov, disthash.New(), remote.Configure("127.0.0.1", 0)))
	v := &view{}
	sys.EventStream.Subscribe(func(ev any) {
		if tp, ok := ev.(*cluster.ClusterTopology); ok {
			ids := make([]string, 0, len(tp.Members))
			for _, m := range tp.Members {
				ids = append(ids, m.Id)
			}
			v.mu.Lock()
			v.ids = ids
			v.mu.Unlock()
		}
	})
	before := time.Now()
	c.StartMember()
	t.Cleanup(func() { c.Shutdown(false) })
	// A client of our own, made after remote.Start (which replaces gRPC's
	// global logger: a gRPC client running meanwhile races with it).
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	self := sys.ID
	if prov.MemberID() != self {
		t.Fatalf("member id %q, want the actor system id %q", prov.MemberID(), self)
	}
	key := "/t/c/" + self
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("own key %s: %+v %v", key, resp, err)
	}
	if !v.has(self) {
		t.Fatalf("own view %v lacks %s", v.ids, self)
	}
	if vu := prov.ValidUntil(); !vu.After(time.Now()) || vu.After(before.Add(ttl+time.Second)) {
		t.Fatalf("ValidUntil %v (started %v, TTL %v)", vu, before, ttl)
	}
	// Renewals keep it valid past one TTL.
	time.Sleep(ttl + 500*time.Millisecond)
	select {
	case <-prov.Lost():
		t.Fatalf("lost while renewing: %v", prov.GetHealthStatus())
	default:
	}

	// Another member's key appears and disappears in the view.
	if _, err := raw.Put(ctx, "/t/c/other", `{"id":"other","host":"127.0.0.1","port":1,"kinds":["k"]}`); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other member in the view", 5*time.Second, func() bool { return v.has("other") })
	if _, err := raw.Delete(ctx, "/t/c/other"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "other member gone from the view", 5*time.Second, func() bool { return !v.has("other") })

	// Own key deleted: lost at once.
	lost := prov.Lost()
	if _, err := raw.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(2 * time.Second):
		t.Fatal("own key deleted, registration not lost")
	}
	if !prov.ValidUntil().IsZero() || !errors.Is(prov.GetHealthStatus(), etcdmember.ErrLeaseLost) {
		t.Fatalf("after loss: ValidUntil %v, health %v", prov.ValidUntil(), prov.GetHealthStatus())
	}
	eventually(t, "self gone from its view", 5*time.Second, func() bool { return !v.has(self) })

	// Re-registering under the same id: etcd has the key again, but the
	// member list that saw the id leave ignores it.
	if err := prov.StartMember(c); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.Get(ctx, key); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("re-registered key: %+v %v", resp, err)
	}
	time.Sleep(500 * time.Millisecond)
	if v.has(self) {
		t.Fatalf("a re-registration under the same id %s was let back into the view", self)
	}

	// Lease revoked: lost within the renewal interval.
	resp, err = raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key: %+v %v", resp, err)
	}
	lost = prov.Lost()
	if _, err := raw.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(ttl):
		t.Fatal("lease revoked, registration not lost")
	}

	// A graceful shutdown deletes the key at once.
	if err := prov.StartMember(c); err != nil {
		t.Fatal(err)
	}
	if err := prov.Shutdown(true); err != nil {
		t.Fatal(err)
	}
	if resp, err := raw.Get(ctx, key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("after a graceful shutdown: %+v %v", resp, err)
	}
}
