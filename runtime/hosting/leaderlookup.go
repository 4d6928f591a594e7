package hosting

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
)

// leaderLookup is the identity lookup of a replicated cluster: a unit is
// placed on the member leading its partition (incarnation.owner), whose
// activator spawns its grain. It follows leadership, not the view's
// hash: after a leader change the old grain refuses (ErrNotOwner), the
// caller drops it from its cache and the lookup resolves the new
// leader. Modeled on protoactor's disthash, which places by rendezvous
// hashing instead.
type leaderLookup struct {
	inc       *incarnation
	activator *actor.PID
}

// activatorName is the name of every member's activator actor: the
// name of disthash's, so a router-only member with the default lookup
// (NoUnits, Replicas 1) reaches it on the member its hash picks, which
// forwards the request to the partition's leader; a router-only member
// with Replicas ≥ 2 uses this lookup too, asking the member its
// published leads name (incarnation.owner).
const activatorName = disthash.PartitionActivatorActorName

// forwarded marks an activation request an activator passed on to the
// leader it knows: the next one spawns the grain whatever it knows (the
// grain refuses if it does not lead), so two members that disagree for
// a moment do not pass a request back and forth.
const forwarded = "forwarded"

var _ cluster.IdentityLookup = (*leaderLookup)(nil)

// Get implements cluster.IdentityLookup: the grain's PID on the
// partition's leader (nil while no leader is known; the request is
// retried).
func (l *leaderLookup) Get(ci *cluster.ClusterIdentity) *actor.PID {
	owner := l.inc.owner(ci.Kind, ci.Identity)
	if owner == "" {
		return nil
	}
	req := &cluster.ActivationRequest{ClusterIdentity: ci, RequestId: forwarded}
	if l.inc.c.replicas() == nil {
		// A router (no engine): the member it picked passes the request
		// on if its own engine knows better (the claim the router read
		// is stale, none was published yet, or the router counts
		// partitions differently), one hop at most.
		req.RequestId = ""
	}
	f := l.inc.sys.Root.RequestFuture(actor.NewPID(owner, activatorName), req, 5*time.Second)
	res, err := f.Result()
	if err != nil {
		return nil
	}
	r, ok := res.(*cluster.ActivationResponse)
	if !ok {
		return nil
	}
	return r.Pid
}

// RemovePid implements cluster.IdentityLookup.
func (l *leaderLookup) RemovePid(ci *cluster.ClusterIdentity, pid *actor.PID) {
	l.inc.cl.MemberList.BroadcastEvent(&cluster.ActivationTerminated{Pid: pid, ClusterIdentity: ci}, true)
}

// Setup implements cluster.IdentityLookup: it starts the activator.
func (l *leaderLookup) Setup(c *cluster.Cluster, _ []string, _ bool) {
	props := actor.PropsFromProducer(func() actor.Actor { return &activator{inc: l.inc, cl: c, grains: map[string]activation{}} })
	l.activator, _ = c.ActorSystem.Root.SpawnNamed(props, activatorName)
}

// Shutdown implements cluster.IdentityLookup.
func (l *leaderLookup) Shutdown() {
	if l.activator != nil {
		_ = l.inc.sys.Root.PoisonFuture(l.activator).Wait()
	}
}

type activation struct {
	id  *cluster.ClusterIdentity
	pid *actor.PID
}

// activator spawns the grains placed on this member (one per identity)
// and forgets them when they stop. A grain decides itself whether it may
// serve (incarnation.check): the activator does not.
type activator struct {
	inc    *incarnation
	cl     *cluster.Cluster
	grains map[string]activation
}

// Receive implements actor.Actor.
func (a *activator) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *cluster.ActivationRequest:
		if m.RequestId != forwarded {
			// From a router (or a member whose view lags): pass it on to
			// the leader this member knows; the leader answers the
			// sender.
			if o := a.inc.owner(m.ClusterIdentity.Kind, m.ClusterIdentity.Identity); o != "" && o != a.inc.self {
				ctx.RequestWithCustomSender(actor.NewPID(o, activatorName),
					&cluster.ActivationRequest{ClusterIdentity: m.ClusterIdentity, RequestId: forwarded}, ctx.Sender())
				return
			}
		}
		key := m.ClusterIdentity.AsKey()
		if g, ok := a.grains[key]; ok {
			ctx.Respond(&cluster.ActivationResponse{Pid: g.pid})
			return
		}
		kind := a.cl.GetClusterKind(m.ClusterIdentity.Kind)
		if kind == nil {
			ctx.Logger().Warn("hosting: activation of an unknown kind", slog.String("kind", m.ClusterIdentity.Kind))
			ctx.Respond(&cluster.ActivationResponse{Failed: true})
			return
		}
		pid := ctx.SpawnPrefix(cluster.WithClusterIdentity(kind.Props, m.ClusterIdentity), m.ClusterIdentity.Identity)
		kind.Inc()
		a.grains[key] = activation{id: m.ClusterIdentity, pid: pid}
		ctx.Respond(&cluster.ActivationResponse{Pid: pid})
	case *actor.Terminated:
		for k, g := range a.grains {
			if g.pid.Equal(m.Who) {
				delete(a.grains, k)
				if kind := a.cl.GetClusterKind(g.id.Kind); kind != nil {
					kind.Dec()
				}
				a.cl.MemberList.BroadcastEvent(&cluster.ActivationTerminated{Pid: m.Who, ClusterIdentity: g.id}, true)
				break
			}
		}
	case *actor.Stopping:
		for _, g := range a.grains {
			_ = ctx.PoisonFuture(g.pid).Wait()
		}
	}
}
