package hosting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
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
	// Provider is the membership provider: clusterproviders/test with a
	// shared InMemAgent in one process (tests); clusterproviders/etcd or
	// clusterproviders/consul in production. Required; one per member.
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
	// RemoteOptions are passed to protoactor's remote.Configure (for
	// example TLS server and dial credentials).
	RemoteOptions []remote.ConfigOption
	// RequestTimeout bounds one attempt of a request (the caller's context
	// bounds all of them). Zero: 5 s.
	RequestTimeout time.Duration
	// IdleTimeout passivates a grain that received no request for this
	// long: its node is closed (its file released) and the next request
	// activates it again, possibly on another member. Zero: grains stay
	// active until their member leaves or a topology change moves them.
	IdleTimeout time.Duration
}

// Cluster is the protoactor-go cluster Placement: this process is one
// member of a cluster; units are grains of the kinds KindDevice and
// KindGroup, placed by the identity lookup; a grain opens its unit's node
// from the shared root when it is activated and closes it when it stops
// (passivation, a topology change moving it, or Close).
type Cluster struct {
	cfg     ClusterConfig
	sys     *actor.ActorSystem
	cl      *cluster.Cluster
	h       *host
	timeout time.Duration

	mu     sync.Mutex
	closed bool
	done   chan struct{}
}

var _ Placement = (*Cluster)(nil)

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
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	c := &Cluster{cfg: cfg, timeout: cfg.RequestTimeout, done: make(chan struct{})}
	if c.timeout == 0 {
		c.timeout = 5 * time.Second
	}
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
	c.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
	opts := append([]remote.ConfigOption(nil), cfg.RemoteOptions...)
	if cfg.AdvertisedHost != "" {
		opts = append(opts, remote.WithAdvertisedHost(cfg.AdvertisedHost))
	}
	rc := remote.Configure(cfg.Host, cfg.Port, opts...)
	// One dial attempt per endpoint writer: with the default (5 attempts,
	// 2 s apart) every request to a lost member's cached PIDs stalls 10 s
	// before the cluster re-places it (runtime/remote.go does the same).
	rc.MaxRetryCount = 1
	lookup := cfg.Lookup
	if lookup == nil {
		lookup = disthash.New()
	}
	props := func(kind string) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return &grain{c: c, kind: kind} })
	}
	ccfg := cluster.Configure(cfg.Name, cfg.Provider, lookup, rc,
		cluster.WithKinds(cluster.NewKind(KindDevice, props(KindDevice)), cluster.NewKind(KindGroup, props(KindGroup))),
		cluster.WithRequestTimeout(c.timeout))
	// The host exists before the member joins: other members may route
	// requests here as soon as it is registered. Until its address is
	// known it answers as "starting".
	c.h = newHost(cfg.Config, "starting", c.sys, func(self messages.DeviceAddress) runtime.DeviceTransport {
		return &placedTransport{p: c, self: self, timeout: 30 * time.Second}
	})
	c.cl = cluster.New(c.sys, ccfg)
	if err := panics.Call(c.cl.StartMember); err != nil {
		c.sys.Shutdown()
		return nil, fmt.Errorf("hosting: start cluster member: %w", err)
	}
	c.h.setMember(c.sys.Address())
	return c, nil
}

// Member implements Placement: the member's remote address (host:port).
func (c *Cluster) Member() string { return c.h.member() }

// Hosted implements Placement.
func (c *Cluster) Hosted() []Unit { return c.h.hosted() }

// ActorSystem returns the member's actor system (for custom actors).
func (c *Cluster) ActorSystem() *actor.ActorSystem { return c.sys }

// Request implements Placement: cluster.Request to the grain (kind,
// identity), attempt after attempt (each bounded by RequestTimeout) while
// the unit is unavailable or unreachable, until ctx ends.
func (c *Cluster) Request(ctx context.Context, kind, identity string, req *Request) (*Reply, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: nil request", ErrBadRequest)
	}
	if err := checkUnit(kind, identity); err != nil {
		return nil, err
	}
	var last error
	for attempt := 0; ; attempt++ {
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
		res, err := c.cl.Request(identity, kind, req, cluster.WithTimeout(t))
		switch r := res.(type) {
		case *Reply:
			if r.Code != CodeUnavailable {
				return r, r.Err()
			}
			last = r.Err()
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
		if err := sleepCtx(ctx, retryBackoff(attempt)); err != nil {
			return nil, fmt.Errorf("%w: %s %q: %w (last: %v)", ErrUnavailable, kind, identity, err, last)
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
	c.cl.Shutdown(true)
	return err
}

// grain is the virtual actor of one unit. Requests run concurrently (a
// hosted node is safe for concurrent use, and a device's hand-off calls
// other grains, which must not wait on this mailbox); activation and
// deactivation run in the mailbox.
type grain struct {
	c    *Cluster
	kind string
	id   string
	u    *unit
	err  error // the last activation failure
}

// Receive implements actor.Actor.
func (g *grain) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if ci := cluster.GetClusterIdentity(ctx); ci != nil {
			g.id = ci.Identity
		}
		g.activate()
		if g.c.cfg.IdleTimeout > 0 {
			ctx.SetReceiveTimeout(g.c.cfg.IdleTimeout)
		}
	case *actor.ReceiveTimeout:
		// Passivation: Stopping closes the node. Requests served
		// meanwhile by goroutines answer ErrUnavailable and are retried
		// on the next activation.
		ctx.Stop(ctx.Self())
	case *actor.Stopping:
		if g.u != nil {
			_ = g.c.h.release(g.u)
			g.u = nil
		}
	case *Request:
		if g.u == nil || g.u.closed.Load() {
			g.u = nil
			g.activate()
		}
		sender := ctx.Sender()
		if g.u == nil {
			err := g.err
			if err == nil {
				err = fmt.Errorf("%w: %s %q is not open on %s", ErrUnavailable, g.kind, g.id, g.c.h.member())
			}
			ctx.Respond(g.c.h.fail(err))
			return
		}
		u, h, sys, timeout := g.u, g.c.h, g.c.sys, g.c.timeout
		go func() {
			rctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			rep := h.serve(rctx, u, m)
			if sender != nil {
				sys.Root.Send(sender, rep)
			}
		}()
	case *wire.Undecodable:
		ctx.Respond(g.c.h.fail(fmt.Errorf("%w: %v", ErrBadRequest, m)))
	}
}

// activate opens the unit's node (bounded by LockTimeout when a previous
// host still holds its file); on failure the next request tries again.
func (g *grain) activate() {
	ctx, cancel := context.WithTimeout(context.Background(), g.c.h.cfg.LockTimeout+g.c.timeout)
	defer cancel()
	g.u, g.err = g.c.h.acquire(ctx, g.kind, g.id)
}

// Members lists the addresses of the members this member currently sees
// (its view of the topology; no consensus is implied).
func (c *Cluster) Members() []string {
	ms := c.cl.MemberList.Members().Members()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Address())
	}
	slices.Sort(out)
	return out
}
