package hosting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime"
)

// Local is the single-member Placement: every unit is hosted in this
// process, on one actor system, opened on first use and kept open until
// Close. It is the embedded deployment and the proof that callers do not
// depend on the cluster layer.
type Local struct {
	h      *host
	sys    *actor.ActorSystem
	ownSys bool
	wire   bool

	mu     sync.Mutex
	closed bool
	done   chan struct{} // closed by Close: retry loops stop
	wg     sync.WaitGroup
}

var _ Placement = (*Local)(nil)

// LocalOption tunes NewLocal.
type LocalOption func(*localOptions)

type localOptions struct {
	member string
	router Placement
	wire   bool
	idle   time.Duration
}

// WithIdleTimeout passivates a unit that served no request for d: its
// node is closed (its files stay; the next request opens it again). Zero:
// units stay open until Close.
func WithIdleTimeout(d time.Duration) LocalOption { return func(o *localOptions) { o.idle = d } }

// WithWireRoundTrip makes the Local serialize every request and reply
// through the remote envelope and back, as a cluster member does between
// machines, so in-process tests also prove every message crosses the
// wire.
func WithWireRoundTrip() LocalOption { return func(o *localOptions) { o.wire = true } }

// WithMemberName names the Local in replies and Hosted (default "local"):
// useful when several Locals are shards of one placement.
func WithMemberName(name string) LocalOption { return func(o *localOptions) { o.member = name } }

// WithRouter makes hosted devices reach their peers (prekey bundles and
// envelopes) through p instead of this Local: set it when the Local is
// one shard of a larger placement that routes units to shards.
func WithRouter(p Placement) LocalOption { return func(o *localOptions) { o.router = p } }

// NewLocal returns a Local placement hosting units under cfg.Root. sys
// hosts the units' actors; nil: a new actor system owned by the Local.
func NewLocal(cfg Config, sys *actor.ActorSystem, opts ...LocalOption) (*Local, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	o := localOptions{member: "local"}
	for _, f := range opts {
		f(&o)
	}
	if o.member == "" {
		return nil, fmt.Errorf("%w: empty member name", ErrInvalidConfig)
	}
	if o.idle < 0 {
		return nil, fmt.Errorf("%w: negative idle timeout", ErrInvalidConfig)
	}
	l := &Local{sys: sys, wire: o.wire, done: make(chan struct{})}
	if sys == nil {
		log := cfg.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		l.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
		l.ownSys = true
	}
	var router Placement = l
	if o.router != nil {
		router = o.router
	}
	l.h = newHost(cfg, o.member, l.sys, func(self messages.DeviceAddress) runtime.DeviceTransport {
		return &placedTransport{p: router, self: self, ident: l.h.self, timeout: 30 * time.Second}
	})
	// Where a sending device is placed: here, unless the Local is a shard
	// of a placement that can say (Locator).
	self := l.h.self()
	l.h.placedOn = func(string, string) string { return self }
	if loc, ok := o.router.(Locator); ok {
		l.h.placedOn = loc.MemberOf
	}
	if o.idle > 0 {
		l.wg.Add(1)
		go l.passivate(o.idle)
	}
	return l, nil
}

// Member implements Placement: "local" unless WithMemberName.
func (l *Local) Member() string { return l.h.member() }

// Hosted implements Placement.
func (l *Local) Hosted() []Unit { return l.h.hosted() }

// Request implements Placement. It retries while the unit is unavailable
// (for example still locked by a process that is shutting down) until ctx
// ends.
func (l *Local) Request(ctx context.Context, kind, identity string, req *Request) (*Reply, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	if req == nil {
		return nil, fmt.Errorf("%w: nil request", ErrBadRequest)
	}
	if err := checkUnit(kind, identity); err != nil {
		return nil, err
	}
	if req.Caller == "" {
		// In one process the caller is this member (a shard's devices
		// name theirs: placedTransport).
		c := *req
		c.Caller = l.h.self()
		req = &c
	}
	if l.wire {
		var err error
		if req, err = roundTrip[*Request](req); err != nil {
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		rep := l.once(ctx, kind, identity, req)
		if l.wire {
			var err error
			if rep, err = roundTrip[*Reply](rep); err != nil {
				return nil, err
			}
		}
		if rep.Code != CodeUnavailable {
			return rep, rep.Err()
		}
		select {
		case <-l.done:
			return nil, ErrClosed
		default:
		}
		if err := sleepCtx(ctx, retryBackoff(attempt)); err != nil {
			return nil, fmt.Errorf("%w: %s %q: %w (last: %s)", ErrUnavailable, kind, identity, err, rep.Error)
		}
	}
}

func (l *Local) once(ctx context.Context, kind, identity string, req *Request) *Reply {
	if err := l.h.admit(kind, identity, req); err != nil {
		return l.h.fail(err)
	}
	if req.Op == OpDelete {
		rep, err := l.h.remove(kind, identity)
		if err != nil {
			return l.h.fail(err)
		}
		return rep
	}
	u, err := l.h.acquire(ctx, kind, identity, nil)
	if err != nil {
		return l.h.fail(err)
	}
	u.busy.Add(1)
	defer func() { u.lastUsed.Store(time.Now().UnixNano()); u.busy.Add(-1) }()
	return l.h.serve(ctx, u, req, nil)
}

// passivate closes, every d/2, the units idle for d (no request in
// progress, none served for d). A request racing the close answers
// ErrUnavailable and is retried on a fresh activation.
func (l *Local) passivate(d time.Duration) {
	defer l.wg.Done()
	t := time.NewTicker(d / 2)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		cutoff := time.Now().Add(-d).UnixNano()
		for _, u := range l.h.idleUnits(cutoff) {
			_ = l.h.release(u)
		}
	}
}

// Close closes every hosted unit (waiting for requests in progress) and,
// if the Local created it, its actor system. It is safe to call more than
// once.
func (l *Local) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.wg.Wait()
	err := l.h.close()
	if l.ownSys {
		l.sys.Shutdown()
	}
	return errors.Join(err)
}

// roundTrip serializes m into its wire envelope and decodes it back.
func roundTrip[T remote.RootSerializable](m T) (T, error) {
	var zero T
	env, err := wire.EnvelopeOf(m)
	if err != nil {
		return zero, fmt.Errorf("%w: serialize %T: %w", ErrFailed, m, err)
	}
	v, err := env.Deserialize()
	if err != nil {
		return zero, fmt.Errorf("%w: deserialize %T: %w", ErrFailed, m, err)
	}
	out, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: %T came back as %T (%v)", ErrFailed, m, v, v)
	}
	return out, nil
}
