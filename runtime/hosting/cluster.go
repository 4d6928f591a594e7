package hosting

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/internal/panics"
)

// ClusterConfig configures one member of a protoactor-go cluster hosting
// units as virtual actors (grains).
type ClusterConfig struct {
	Config
	// Name is the cluster's name (the same on every member). Required.
	Name string
	// Provider is the membership provider: etcdmember (etcd, with
	// self-fencing: see Fencing) in production; clusterproviders/test with
	// a shared InMemAgent in one process (tests: it never removes a member
	// that crashed). Required; one per member. A provider that implements
	// Fencing must accept StartMember again after a loss: the member
	// rejoins on a new actor system (a new member id).
	Provider cluster.ClusterProvider
	// Lookup places identities on members. Nil: disthash (rendezvous
	// hashing over the members, no storage).
	Lookup cluster.IdentityLookup
	// Host is the address the member's remote listens on. Empty: 127.0.0.1.
	Host string
	// Port is the member's remote port. 0: any free port.
	Port int
	// AdvertisedHost is the host:port other members dial, when it differs
	// from the listening address (NAT, containers).
	AdvertisedHost string
	// TLS is the server side of the members' mutual TLS: the member's
	// certificate (issued by the mesh CA: runtime/meshtls, `sspctl tls`;
	// its node name is the member's identity) and ClientCAs, with
	// ClientAuth tls.RequireAndVerifyClientCert. Required unless
	// Plaintext. MemberTLS loads it.
	TLS *tls.Config
	// ClientTLS is the dialing side: the same certificate as the client
	// certificate, and RootCAs. Required with TLS.
	ClientTLS *tls.Config
	// Plaintext runs the members' gRPC without TLS: requests (message
	// plaintext among them) cross the network readable and no member is
	// authenticated. It must be set explicitly, is an error together with
	// TLS, and is logged (a warning) at every start.
	Plaintext bool
	// MemberName is the member's identity with Plaintext (default
	// "member"); with TLS it is its certificate's name (and, when set,
	// must equal it).
	MemberName string
	// RemoteOptions are passed to protoactor's remote.Configure after the
	// transport security options.
	RemoteOptions []remote.ConfigOption
	// RequestTimeout bounds one attempt of a request (the caller's context
	// bounds all of them). Zero: 5 s.
	RequestTimeout time.Duration
	// IdleTimeout passivates a grain that received no request for this
	// long: its node is closed (its file released) and the next request
	// activates it again, possibly on another member. Zero: grains stay
	// active until their member leaves or a topology change moves them.
	IdleTimeout time.Duration
	// NoUnits makes the member a router only: it registers no kinds, so
	// no unit is ever placed on it, and it routes requests to the members
	// that host them (a front end).
	NoUnits bool
	// OnMembership, when set, is told when this member joins (at start
	// and after each rejoin) and when it fences itself. It must not block.
	OnMembership func(MembershipChange)
	// Replicas is how many members hold a copy of each unit's files.
	// 1: one, the member hosting it (Root must then be shared for
	// take-over; see the package documentation). 2 or more: every unit
	// belongs to a partition replicated by a consensus group (Raft) on
	// that many members; a unit is served only by its partition's
	// leader, and the identity lookup routes to it. Requires Lookup nil.
	// With more members than Replicas each partition's voters are
	// Replicas of them, chosen by rendezvous hashing of the partition
	// and the members' names, and moved by the groups' own
	// configuration changes when the membership changes; every member
	// routes a unit's requests to its partition's leader. A router-only
	// member (NoUnits) holds no replicas; with Replicas ≥ 2 (and the
	// same Replication.Partitions) it sends a unit's requests to its
	// partition's leader as the leaders publish it in the gossip, and
	// while it knows none to the member its hash picks, which passes
	// them on. 3 survives the loss of any one member and its disk.
	//
	// 0 is DefaultReplicas (3) when Replication.Listen is set, and 1
	// otherwise (a single member, or members sharing one volume, keep
	// one copy unless replication is configured).
	Replicas int
	// Replication configures the replication traffic (Replicas ≥ 2): it
	// uses the members' mutual TLS (TLS, ClientTLS) or, with Plaintext,
	// none.
	Replication ReplicationConfig
}

// DefaultReplicas is ClusterConfig.Replicas' value when it is 0 and
// ClusterConfig.Replication.Listen is set: a quorum of 2 that survives
// the loss of any one member and its disk.
const DefaultReplicas = 3

// replicasOrDefault resolves Replicas 0 (see ClusterConfig.Replicas).
func (c *ClusterConfig) replicasOrDefault() int {
	switch {
	case c.Replicas != 0:
		return c.Replicas
	case c.Replication.Listen != "":
		return DefaultReplicas
	}
	return 1
}

// replicated reports whether this member holds replicas (a router-only
// member holds none: it routes to the partitions' leaders by the leads
// they publish, leaderRouted).
func (c *ClusterConfig) replicated() bool { return c.Replicas >= 2 && !c.NoUnits }

// Fencing is what a membership provider offers for self-fencing
// (etcdmember.Provider implements it). A member serves nothing at or
// after ValidUntil: when that time passes it is suspended (closes its
// units, refuses them) and resumes if ValidUntil moves forward again; a
// member whose registration is lost, or that no longer sees itself in its
// view, closes its units, refuses activations and rejoins under a new
// member id: it never serves a unit after other members may have placed
// it elsewhere.
type Fencing interface {
	// Lost is closed when the current registration is lost.
	Lost() <-chan struct{}
	// ValidUntil is the time until which the current registration is
	// known to hold: no other member sees this one leave before it.
	ValidUntil() time.Time
}

// ReadyWaiter is optionally implemented by a Fencing provider
// (etcdmember.Provider does): Ready returns once the provider can
// register again. A fenced member waits for it before it starts its next
// incarnation, so it rejoins as soon as the membership store answers
// instead of on a retry schedule.
type ReadyWaiter interface {
	Ready(ctx context.Context) error
}

// MembershipChange reports a member joining, fencing itself, or
// suspending and resuming serving.
type MembershipChange struct {
	Joined bool   // true: joined (or rejoined, or resumed); false: fenced (or suspended)
	Member string // the member's address
	ID     string // the member id of the incarnation that joined or was fenced
	Reason error  // why it fenced itself or suspended
	// Suspended (Joined false): the registration's validity window passed
	// without a renewal (the membership store unreachable): the member
	// closed its units and serves none, but keeps its member id; it
	// resumes if a later renewal shows its registration held throughout,
	// and fences itself if it was lost.
	Suspended bool
	// Resumed (Joined true): serving again after a suspension, under the
	// same member id.
	Resumed bool
}

// Cluster is the protoactor-go cluster Placement: this process is one
// member of a cluster; units are grains of the kinds KindDevice and
// KindGroup, placed by the identity lookup; a grain opens its unit's node
// from the shared root when it is activated — only if this member's own
// view places the unit here — and closes it when it stops (passivation, a
// topology change moving it, a fence, or Close).
//
// With a Fencing provider the member is suspended (every unit closed at
// once, none served, the same member id kept) while its registration's
// validity has lapsed (etcd unreachable, a pause), resumes when it is
// renewed, and fences itself when its registration is lost or its view
// no longer holds it:
// every unit is closed at once (releasing its file), the protoactor
// member is shut down, and a new one (a new actor system: a new member
// id and address when Port is 0) joins in its place.
type Cluster struct {
	cfg     ClusterConfig
	h       *host
	ident   string // the member's identity: its certificate's name
	timeout time.Duration
	fencing Fencing // nil: the provider does not fence

	cur atomic.Pointer[incarnation]
	// lead is the leadership of the replicated partitions (Replicas ≥
	// 2) and msync hands the engine the membership.
	lead  leadership
	msync memberSync
	pubMu sync.Mutex // publishLeads
	// life serializes starting and stopping incarnations (rejoin, Close).
	life   sync.Mutex
	mu     sync.Mutex
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

var _ Placement = (*Cluster)(nil)

// incarnation is one protoactor cluster member of this Cluster: its
// actor system, its view of the topology and whether it is fenced.
type incarnation struct {
	c      *Cluster
	sys    *actor.ActorSystem
	cl     *cluster.Cluster
	self   string // address
	fenced atomic.Bool
	// started: the member is registered and its id is the one replies
	// carry (host.setMember); a replicated unit is not served before.
	started atomic.Bool
	down    sync.Once // the protoactor member is shut down once (a second Shutdown panics)

	mu      sync.Mutex
	rdv     *cluster.Rendezvous
	addrs   map[string]bool
	names   map[string]string // member address → identity (from its member id)
	addrOf  map[string]string // identity → member address (replicated: the leader's)
	seen    bool              // this member has been in its own view
	changed chan struct{}     // closed (and replaced) on every topology change or fence

	// ids are the member ids in the view; leads the partitions each
	// member (by member id) published that it leads, with their terms
	// (leadertable.go). Under mu.
	ids   map[string]bool
	leads map[string]map[int]uint64
}

// NewCluster starts a cluster member (protoactor's StartMember: about 1 s)
// and returns it once it has joined.
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Name == "" || cfg.Provider == nil {
		return nil, fmt.Errorf("%w: Name and Provider are required", ErrInvalidConfig)
	}
	if cfg.RequestTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("%w: RequestTimeout and IdleTimeout must not be negative", ErrInvalidConfig)
	}
	ident, err := cfg.memberIdentity()
	if err != nil {
		return nil, err
	}
	if cfg.Replicas < 0 || cfg.Replication.Partitions < 0 || cfg.Replication.ElectionTimeout < 0 {
		return nil, fmt.Errorf("%w: Replicas and Replication's Partitions and ElectionTimeout must not be negative", ErrInvalidConfig)
	}
	cfg.Replicas = cfg.replicasOrDefault()
	if cfg.Replicas >= 2 && cfg.Lookup != nil {
		return nil, fmt.Errorf("%w: Replicas ≥ 2 places units on their partition's leader: no Lookup", ErrInvalidConfig)
	}
	if cfg.replicated() && openReplicaSet == nil {
		return nil, fmt.Errorf("%w: replication is not available in this build", ErrInvalidConfig)
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	c := &Cluster{cfg: cfg, ident: ident, timeout: cfg.RequestTimeout, done: make(chan struct{})}
	if c.timeout == 0 {
		c.timeout = 5 * time.Second
	}
	c.fencing, _ = cfg.Provider.(Fencing)
	// The host exists before the member joins: other members may route
	// requests here as soon as it is registered. Until its address is
	// known it answers as "starting".
	c.h = newHost(cfg.Config, "starting", nil, func(self messages.DeviceAddress) runtime.DeviceTransport {
		return &placedTransport{p: c, self: self, ident: c.h.self, timeout: 30 * time.Second}
	})
	c.h.ident.Store(&ident)
	c.h.placedOn = c.MemberOf
	if cfg.replicated() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := openReplicaSet(ctx, &c.cfg, ident)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("hosting: open replication: %w", err)
		}
		c.h.repl = r
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.watchLeaders(c.done)
		}()
	}
	inc, err := c.start()
	if err != nil {
		close(c.done)
		if c.h.repl != nil {
			_ = c.h.repl.close()
		}
		c.wg.Wait()
		return nil, err
	}
	c.cur.Store(inc)
	c.joined(inc)
	return c, nil
}

// start starts one incarnation: a new actor system, remote and protoactor
// cluster member registered with the provider.
func (c *Cluster) start() (*incarnation, error) {
	cfg := c.cfg
	// protoactor's Start panics on a taken port: try it first.
	if cfg.Port != 0 {
		l, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("%w: listen: %w", ErrInvalidConfig, err)
		}
		_ = l.Close()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	inc := &incarnation{c: c, changed: make(chan struct{}), rdv: cluster.NewRendezvous(), addrs: map[string]bool{}}
	inc.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
	// The member id carries the member's identity, so every member can
	// tell from its view which identity a unit is placed on (Locator).
	inc.sys.ID = c.ident + "@" + inc.sys.ID
	if c.h.repl != nil {
		// ... and its replication address (replicaAddrOf).
		inc.sys.ID += "@" + c.h.repl.addr()
	}
	if cfg.Plaintext {
		log.Warn("hosting: member runs WITHOUT TLS (ClusterConfig.Plaintext): requests and message plaintext cross the network readable and members are not authenticated", "member", c.ident)
	}
	opts := append(cfg.remoteSecurity(), cfg.RemoteOptions...)
	if cfg.AdvertisedHost != "" {
		opts = append(opts, remote.WithAdvertisedHost(cfg.AdvertisedHost))
	}
	rc := remote.Configure(cfg.Host, cfg.Port, opts...)
	// One dial attempt per endpoint writer: with the default (5 attempts,
	// 2 s apart) every request to a lost member's cached PIDs stalls 10 s
	// before the cluster re-places it (runtime/remote.go does the same).
	rc.MaxRetryCount = 1
	lookup := cfg.Lookup
	switch {
	case c.leaderRouted():
		lookup = &leaderLookup{inc: inc}
	case lookup == nil || c.cur.Load() != nil:
		// A rejoin needs a fresh lookup: the old one belongs to the
		// previous actor system.
		lookup = disthash.New()
	}
	props := func(kind string) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return &grain{inc: inc, kind: kind} })
	}
	copts := []cluster.ConfigOption{cluster.WithRequestTimeout(c.timeout)}
	if !cfg.NoUnits {
		copts = append(copts, cluster.WithKinds(cluster.NewKind(KindDevice, props(KindDevice)), cluster.NewKind(KindGroup, props(KindGroup))))
	}
	ccfg := cluster.Configure(cfg.Name, cfg.Provider, lookup, rc, copts...)
	inc.cl = cluster.New(inc.sys, ccfg)
	// Our own view, from the same topology events as the identity lookup
	// (published after protoactor filtered its block list).
	inc.sys.EventStream.Subscribe(func(ev any) {
		switch t := ev.(type) {
		case *cluster.ClusterTopology:
			inc.onTopology(t.Members)
		case *cluster.GossipUpdate:
			inc.onGossip(t)
		}
	})
	c.h.system.Store(inc.sys)
	if err := panics.Call(inc.cl.StartMember); err != nil {
		inc.sys.Shutdown()
		return nil, fmt.Errorf("hosting: start cluster member: %w", err)
	}
	inc.self = inc.sys.Address()
	c.h.setMember(inc.self, inc.sys.ID)
	inc.started.Store(true)
	if c.fencing != nil {
		lost := c.fencing.Lost()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.watchValidity(inc, lost)
		}()
	}
	return inc, nil
}

func (c *Cluster) joined(inc *incarnation) {
	c.h.log.Info("hosting: member joined", "member", inc.self, "id", inc.sys.ID)
	if c.h.repl != nil {
		c.publishLeads(inc)
	}
	if c.cfg.OnMembership != nil {
		c.cfg.OnMembership(MembershipChange{Joined: true, Member: inc.self, ID: inc.sys.ID})
	}
}

// onTopology records the member's view (called by protoactor's event
// stream with its member list locked: it must not call back into it).
func (inc *incarnation) onTopology(ms []*cluster.Member) {
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(ms)
	addrs := make(map[string]bool, len(ms))
	names := make(map[string]string, len(ms))
	addrOf := make(map[string]string, len(ms))
	ids := make([]string, 0, len(ms))
	idSet := make(map[string]bool, len(ms))
	for _, m := range ms {
		idSet[m.Id] = true
		addrs[m.Address()] = true
		name := memberIDOf(m.Id)
		names[m.Address()] = name
		if cur, ok := addrOf[name]; !ok || m.Address() < cur {
			addrOf[name] = m.Address()
		}
		ids = append(ids, m.Id)
	}
	if inc.c.replicas() != nil {
		// The replicated membership follows the view (the etcd
		// membership): the engine changes each partition's voters.
		inc.c.setPeers(peersOf(ids))
	}
	inc.mu.Lock()
	inc.rdv, inc.addrs, inc.names, inc.addrOf, inc.ids = rdv, addrs, names, addrOf, idSet
	self := inc.self
	if self == "" {
		self = inc.sys.Address()
	}
	in := addrs[self]
	gone := inc.seen && !in
	inc.seen = inc.seen || in
	close(inc.changed)
	inc.changed = make(chan struct{})
	inc.mu.Unlock()
	if gone && inc.c.fencing != nil {
		go inc.c.fence(inc, errors.New("this member is no longer in its own view"))
	}
}

// changes returns a channel closed at the next topology change or fence.
func (inc *incarnation) changes() <-chan struct{} {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	return inc.changed
}

func (inc *incarnation) hasMember(addr string) bool {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	return inc.addrs[addr]
}

// owner is the member the view places (kind, identity) on ("" when
// none): with replication, the member leading the unit's partition
// (leaderOf) or, on a router-only member that knows no leader of it yet,
// the member the view's hash picks, whose activator passes the request
// on to the leader it knows.
func (inc *incarnation) owner(kind, identity string) string {
	if inc.c.leaderRouted() {
		if l := inc.leaderOf(kind, identity); l != "" || inc.c.replicas() != nil {
			return l
		}
	}
	inc.mu.Lock()
	rdv := inc.rdv
	inc.mu.Unlock()
	return rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: kind, Identity: identity})
}

// leaderOf is the address of the member leading the partition of (kind,
// identity) ("" when none is known): as this member's engine knows it
// or, where it is no voter of the partition (or a router-only member,
// with no engine), as the leaders publish it (chooseLeader).
func (inc *incarnation) leaderOf(kind, identity string) string {
	path := unitPath(kind, identity)
	var p int
	var local string
	var term uint64
	if r := inc.c.replicas(); r != nil {
		p = r.partitionOf(path)
		local, _ = r.leader(p)
		term = inc.c.lead.term(p)
	} else {
		p = routerPartitionOf(path, inc.c.cfg.Replication.Partitions)
	}
	inc.mu.Lock()
	defer inc.mu.Unlock()
	name := chooseLeader(local, term, inc.claimsLocked(p))
	if name == "" {
		return ""
	}
	return inc.addrOf[name]
}

// MemberOf implements Locator: the identity of the member this member's
// view places (kind, identity) on ("" when none).
func (c *Cluster) MemberOf(kind, identity string) string {
	inc := c.cur.Load()
	if inc == nil {
		return ""
	}
	addr := inc.owner(kind, identity)
	inc.mu.Lock()
	defer inc.mu.Unlock()
	return inc.names[addr]
}

// check allows activating or serving (kind, identity) here: the member
// is not fenced, its registration holds (Fencing), and its own view
// places the unit on it.
func (inc *incarnation) check(kind, identity string) error {
	if inc.fenced.Load() {
		return fmt.Errorf("%w: %s", ErrFenced, inc.self)
	}
	if f := inc.c.fencing; f != nil && !time.Now().Before(f.ValidUntil()) {
		// Suspended, not fenced: the provider decides whether the
		// registration resumes or is lost (watchValidity).
		return fmt.Errorf("%w: %s: registration not renewed in time (suspended)", ErrFenced, inc.self)
	}
	if r := inc.c.replicas(); r != nil {
		// The partition's leader serves, once it applied everything
		// committed before its term; the engine's term fences its writes
		// and reads (serve).
		if !inc.started.Load() {
			// Requests may reach the grains while protoactor's member
			// starts: its replies would carry the previous
			// incarnation's id.
			return fmt.Errorf("%w: %s is starting", ErrUnavailable, inc.c.h.member())
		}
		p := r.partitionOf(unitPath(kind, identity))
		if !r.isLeader(p) || !inc.c.lead.serving(p) {
			return fmt.Errorf("%w: %s %q: %s does not lead partition %d (or is not ready)", ErrNotOwner, kind, identity, inc.self, p)
		}
		return nil
	}
	if o := inc.owner(kind, identity); o != inc.self {
		return fmt.Errorf("%w: %s %q is placed on %q in the view of %s", ErrNotOwner, kind, identity, o, inc.self)
	}
	return nil
}

// deadline bounds a request served here: the member's timeout, and the
// end of its registration's validity (Fencing).
func (inc *incarnation) deadline() time.Time {
	d := time.Now().Add(inc.c.timeout)
	if f := inc.c.fencing; f != nil {
		if v := f.ValidUntil(); v.Before(d) {
			d = v
		}
	}
	return d
}

// fence closes every unit of the incarnation at once, shuts it down and
// starts a new one (retrying until Close). It runs once per incarnation.
func (c *Cluster) fence(inc *incarnation, reason error) {
	if !inc.fenced.CompareAndSwap(false, true) {
		return
	}
	inc.mu.Lock()
	close(inc.changed)
	inc.changed = make(chan struct{})
	inc.mu.Unlock()
	c.h.log.Warn("hosting: member fenced itself", "member", inc.self, "id", inc.sys.ID, "reason", reason)
	_ = c.h.releaseAll(false)
	if c.cfg.OnMembership != nil {
		c.cfg.OnMembership(MembershipChange{Member: inc.self, ID: inc.sys.ID, Reason: reason})
	}
	stop := func() {
		if c.cur.Load() == inc {
			inc.shutdown(false)
		}
	}
	// Counted in wg only while Close has not begun waiting for it (Close
	// sets closed under mu before wg.Wait).
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.life.Lock()
		stop()
		c.life.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		c.life.Lock()
		defer c.life.Unlock()
		stop()
		for attempt := 0; ; attempt++ {
			select {
			case <-c.done:
				return
			default:
			}
			if w, ok := c.cfg.Provider.(ReadyWaiter); ok {
				// Start the next incarnation once the provider can
				// register it (an outage of the membership store): not
				// on a schedule that adds seconds after it returns.
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					select {
					case <-c.done:
						cancel()
					case <-ctx.Done():
					}
				}()
				err := w.Ready(ctx)
				cancel()
				if err != nil {
					return // closed
				}
			}
			next, err := c.start()
			if err == nil {
				c.cur.Store(next)
				c.joined(next)
				return
			}
			c.h.log.Warn("hosting: rejoin failed", "err", err)
			t := time.NewTimer(rejoinDelay(attempt))
			select {
			case <-c.done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
}

// watchValidity runs the serving decision (decideServing) of one
// incarnation: it closes every unit when the registration's validity
// window passes (suspended), notes when it holds again (resumed), and
// fences the incarnation when the registration is lost.
func (c *Cluster) watchValidity(inc *incarnation, lost <-chan struct{}) {
	t := time.NewTicker(validityTick)
	defer t.Stop()
	var s servingState
	for !inc.fenced.Load() {
		var ev servingInput
		select {
		case <-c.done:
			return
		case <-lost:
			ev = servingInput{lost: true}
		case now := <-t.C:
			ev = servingInput{now: now, validUntil: c.fencing.ValidUntil()}
		}
		var eff servingEffect
		s, eff = decideServing(s, ev)
		switch eff {
		case effSuspend:
			reason := errors.New("registration not renewed in time")
			c.h.log.Warn("hosting: member suspended: closing its units until its registration is renewed", "member", inc.self, "id", inc.sys.ID)
			_ = c.h.releaseAll(false)
			if c.cfg.OnMembership != nil {
				c.cfg.OnMembership(MembershipChange{Member: inc.self, ID: inc.sys.ID, Reason: reason, Suspended: true})
			}
		case effRelease:
			// An activation that raced with the suspension is refused
			// by its own gate; close anything left all the same.
			if len(c.h.hosted()) > 0 {
				_ = c.h.releaseAll(false)
			}
		case effResume:
			c.h.log.Info("hosting: member resumed: its registration held throughout", "member", inc.self, "id", inc.sys.ID)
			if c.cfg.OnMembership != nil {
				c.cfg.OnMembership(MembershipChange{Joined: true, Resumed: true, Member: inc.self, ID: inc.sys.ID})
			}
		case effFence:
			c.fence(inc, errors.New("membership registration lost"))
			return
		}
	}
}

// validityTick is how often a member compares its registration's
// validity with the clock.
const validityTick = 50 * time.Millisecond

// servingState is a member's serving decision: serving, or suspended
// because its registration's validity window passed (or fenced, after
// which the incarnation is gone).
type servingState struct {
	suspended bool
	fenced    bool
}

// servingInput is a tick (now, and the provider's ValidUntil) or the
// registration's loss.
type servingInput struct {
	now, validUntil time.Time
	lost            bool
}

type servingEffect uint8

const (
	effNoop    servingEffect = iota
	effSuspend               // close every unit (nothing is served past validUntil)
	effRelease               // still suspended: close any unit left open
	effResume                // the registration holds again
	effFence                 // lost: close, shut the incarnation down, rejoin
)

// decideServing is the serving decision: a member never serves at or
// after its registration's ValidUntil (check refuses, and units are
// closed at once, so their next hosts can open them), is suspended
// rather than fenced while the provider has not decided the registration
// is lost, and resumes as soon as ValidUntil is in the future again.
func decideServing(s servingState, in servingInput) (servingState, servingEffect) {
	if s.fenced {
		return s, effNoop
	}
	if in.lost {
		s.fenced = true
		return s, effFence
	}
	expired := !in.now.Before(in.validUntil)
	switch {
	case expired && !s.suspended:
		s.suspended = true
		return s, effSuspend
	case expired:
		return s, effRelease
	case s.suspended:
		s.suspended = false
		return s, effResume
	}
	return s, effNoop
}

// rejoinDelay is the wait after the attempt-th failed rejoin (the
// provider reported itself ready, yet the start failed): short, since
// each attempt follows a readiness check.
func rejoinDelay(attempt int) time.Duration {
	return min(250*time.Millisecond<<min(attempt, 3), 2*time.Second)
}

// shutdown shuts the protoactor member down, once: gracefully on Close
// (deregistered, protoactor's 2 s hand-over), at once for a fenced member
// (its registration is gone; the provider's is ended too).
func (inc *incarnation) shutdown(graceful bool) {
	inc.down.Do(func() {
		if !graceful || inc.fenced.Load() {
			_ = inc.c.cfg.Provider.Shutdown(false)
			inc.cl.Shutdown(false)
			return
		}
		inc.cl.Shutdown(true)
	})
}

// Member implements Placement: the member's remote address (host:port).
func (c *Cluster) Member() string { return c.h.member() }

// MemberID is the member id of the current incarnation (it changes when
// the member fenced itself and rejoined).
func (c *Cluster) MemberID() string { return c.h.memberID() }

// Hosted implements Placement.
func (c *Cluster) Hosted() []Unit { return c.h.hosted() }

// ActorSystem returns the member's actor system (for custom actors). A
// member that fenced itself rejoins on a new one.
func (c *Cluster) ActorSystem() *actor.ActorSystem { return c.cur.Load().sys }

type attempt struct {
	res any
	err error
}

// Request implements Placement: cluster.Request to the grain (kind,
// identity), attempt after attempt (each bounded by RequestTimeout) while
// the unit is unavailable or unreachable, until ctx ends. An attempt to a
// member that leaves this member's view meanwhile is abandoned and
// retried at once on the unit's new owner, not waited out.
func (c *Cluster) Request(ctx context.Context, kind, identity string, req *Request) (*Reply, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: nil request", ErrBadRequest)
	}
	if err := checkUnit(kind, identity); err != nil {
		return nil, err
	}
	// The request comes from this member: a remote receiver replaces
	// Caller with the name of this member's certificate; a grain here
	// sees this.
	cp := *req
	cp.Caller = c.ident
	req = &cp
	// A frame the codec refuses is refused here, typed: protoactor's
	// endpoint writer would log it and send nothing, and the request
	// would only time out, again and again.
	if _, err := req.Serialize(); err != nil {
		return nil, fmt.Errorf("%w: %s %q: %w", ErrBadRequest, kind, identity, err)
	}
	var last error
	for n := 0; ; n++ {
		select {
		case <-c.done:
			return nil, ErrClosed
		default:
		}
		t := c.timeout
		if dl, ok := ctx.Deadline(); ok {
			t = min(t, time.Until(dl))
		}
		if t <= 0 {
			return nil, fmt.Errorf("%w: %s %q: %w (last: %v)", ErrUnavailable, kind, identity, context.DeadlineExceeded, last)
		}
		inc := c.cur.Load()
		if inc.fenced.Load() {
			last = fmt.Errorf("%w: %s is rejoining", ErrFenced, inc.self)
		} else {
			res, err, abandoned := c.attempt(ctx, inc, kind, identity, req, t)
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("%w: %s %q: %w (last: %v)", ErrUnavailable, kind, identity, err, last)
			}
			if abandoned != nil {
				last = abandoned
				continue
			}
			switch r := res.(type) {
			case *Reply:
				if r.Code != CodeUnavailable {
					return r, r.Err()
				}
				last = r.Err()
				// The cached grain may be on a member that does not own
				// the unit (any more): resolve it again next time.
				inc.cl.PidCache.Remove(identity, kind)
			case *wire.Undecodable:
				return nil, fmt.Errorf("%w: undecodable reply: %w", ErrFailed, r)
			case nil:
				last = err
				if last == nil {
					last = errors.New("no reply")
				}
			default:
				return nil, fmt.Errorf("%w: unexpected reply %T", ErrFailed, res)
			}
		}
		var lead <-chan struct{}
		if c.leaderRouted() {
			lead = c.lead.changes()
		}
		moved, err := retryWait(ctx, retryBackoff(n), lead)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q: %w (last: %v)", ErrUnavailable, kind, identity, err, last)
		}
		if moved {
			// A new leader: try it now, then back off from the start.
			n = -1
		}
	}
}

// attempt runs one cluster.Request and waits for it, unless ctx ends,
// the member closes or fences, or the member the request went to (its
// cached grain's or the unit's owner in this view) leaves the view: then
// it returns a non-nil abandoned error, and the request still running in
// protoactor ends by its own timeout.
func (c *Cluster) attempt(ctx context.Context, inc *incarnation, kind, identity string, req *Request, t time.Duration) (any, error, error) {
	target := inc.owner(kind, identity)
	if pid, ok := inc.cl.PidCache.Get(identity, kind); ok && pid != nil {
		if inc.leaderMoved(kind, identity, pid.Address) {
			// A grain on a replaced leader: resolve the new one.
			inc.cl.PidCache.Remove(identity, kind)
		} else {
			target = pid.Address
		}
	}
	ch := make(chan attempt, 1)
	go func() {
		res, err := inc.cl.Request(identity, kind, req, cluster.WithTimeout(t))
		ch <- attempt{res, err}
	}()
	var lead <-chan struct{}
	for {
		changed := inc.changes()
		if c.leaderRouted() {
			lead = c.lead.changes()
		}
		if inc.fenced.Load() {
			return nil, nil, fmt.Errorf("%w: %s fenced during the request", ErrFenced, inc.self)
		}
		if target != "" && !inc.hasMember(target) {
			inc.cl.PidCache.Remove(identity, kind)
			return nil, nil, fmt.Errorf("%w: %s left during the request", ErrUnavailable, target)
		}
		if inc.leaderMoved(kind, identity, target) {
			inc.cl.PidCache.Remove(identity, kind)
			return nil, nil, fmt.Errorf("%w: %s no longer leads the partition of %s %q", ErrNotOwner, target, kind, identity)
		}
		select {
		case a := <-ch:
			return a.res, a.err, nil
		case <-ctx.Done():
			return nil, ctx.Err(), nil
		case <-c.done:
			return nil, ErrClosed, nil
		case <-changed:
		case <-lead:
		}
	}
}

// Close leaves the cluster gracefully: units hosted here are closed first
// (releasing their files for their next hosts; requests reaching them
// meanwhile answer ErrUnavailable and are retried by their callers), then
// the member deregisters from the provider and shuts down (protoactor's
// graceful Shutdown: about 2 s). It is safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	err := c.h.close()
	c.life.Lock()
	c.cur.Load().shutdown(true)
	c.life.Unlock()
	c.wg.Wait()
	if c.h.repl != nil {
		err = errors.Join(err, c.h.repl.close())
	}
	return err
}

// grain is the virtual actor of one unit. Requests run concurrently (a
// hosted node is safe for concurrent use, and a device's hand-off calls
// other grains, which must not wait on this mailbox); activation and
// deactivation run in the mailbox. It activates its unit only while its
// member's own view places the unit here (incarnation.check).
type grain struct {
	inc  *incarnation
	kind string
	id   string
	u    *unit
	err  error // the last activation failure
	// idle passivates the grain after Config.IdleTimeout without a
	// message (nil: never).
	idle *runtime.IdleTimer
}

// Receive implements actor.Actor.
func (g *grain) Receive(ctx actor.Context) {
	h := g.inc.c.h
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if ci := cluster.GetClusterIdentity(ctx); ci != nil {
			g.id = ci.Identity
		}
		// The unit opens at its first admitted request: a grain made
		// for an address nobody provisioned opens nothing.
		if d := g.inc.c.cfg.IdleTimeout; d > 0 {
			g.idle = runtime.NewIdleTimer(d)
			g.idle.Touch(ctx)
		}
		return
	case *runtime.IdleTick:
		// Passivation: Stopping closes the node. Requests served
		// meanwhile by goroutines answer ErrUnavailable and are retried
		// on the next activation.
		if g.idle.Fired(ctx, m) {
			ctx.Stop(ctx.Self())
		}
		return
	case *actor.Stopping:
		if g.idle != nil {
			g.idle.Stop()
		}
		if g.u != nil {
			_ = h.release(g.u)
			g.u = nil
		}
	case *Request:
		g.touch(ctx)
		sender := ctx.Sender()
		if err := g.admit(m); err != nil {
			ctx.Respond(h.fail(err))
			if errors.Is(err, ErrNotProvisioned) || errors.Is(err, ErrNotOwner) || errors.Is(err, ErrFenced) {
				// Nothing to keep for an address without a unit.
				ctx.Stop(ctx.Self())
			}
			return
		}
		if m.Op == OpDelete {
			if g.u != nil {
				_ = h.release(g.u)
				g.u = nil
			}
			rep, err := h.remove(g.kind, g.id)
			if err != nil {
				rep = h.fail(err)
			}
			ctx.Respond(rep)
			ctx.Stop(ctx.Self())
			return
		}
		if g.u == nil || g.u.closed.Load() {
			g.u = nil
			g.activate()
		}
		if g.u == nil {
			err := g.err
			if err == nil {
				err = fmt.Errorf("%w: %s %q is not open on %s", ErrUnavailable, g.kind, g.id, h.member())
			}
			ctx.Respond(h.fail(err))
			if errors.Is(err, ErrNotOwner) || errors.Is(err, ErrFenced) {
				// Not ours: do not linger as the grain callers have
				// cached; the next activation request asks the owner of
				// the caller's (updated) view.
				ctx.Stop(ctx.Self())
			}
			return
		}
		u, inc, sys := g.u, g.inc, g.inc.sys
		kind, id := g.kind, g.id
		go func() {
			rctx, cancel := context.WithDeadline(context.Background(), inc.deadline())
			defer cancel()
			rep := h.serve(rctx, u, m, func() error { return inc.check(kind, id) })
			if sender != nil {
				if sender.Address != sys.Address() {
					rep = h.framed(rep)
				}
				sys.Root.Send(sender, rep)
			}
		}()
	case *wire.Undecodable:
		g.touch(ctx)
		ctx.Respond(h.fail(fmt.Errorf("%w: %v", ErrBadRequest, m)))
	}
}

// admit runs the host's admission of m (attribution, authorization,
// provisioning) once this member may serve the unit.
func (g *grain) admit(m *Request) error {
	if err := g.inc.check(g.kind, g.id); err != nil {
		return err
	}
	return g.inc.c.h.admit(g.kind, g.id, m)
}

// touch restarts the grain's idle period (a request arrived).
func (g *grain) touch(ctx actor.Context) {
	if g.idle != nil {
		g.idle.Touch(ctx)
	}
}

// activate opens the unit's node (bounded by LockTimeout when a previous
// host still holds its file) if this member owns it; on failure the next
// request tries again.
func (g *grain) activate() {
	h := g.inc.c.h
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.LockTimeout+g.inc.c.timeout)
	defer cancel()
	inc, kind, id := g.inc, g.kind, g.id
	g.u, g.err = h.acquire(ctx, kind, id, func() error { return inc.check(kind, id) })
}

// Members lists the addresses of the members this member currently sees
// (its view of the topology; no consensus is implied).
func (c *Cluster) Members() []string {
	ms := c.cur.Load().cl.MemberList.Members().Members()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Address())
	}
	slices.Sort(out)
	return out
}
