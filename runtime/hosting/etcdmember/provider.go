// Package etcdmember is a protoactor-go cluster provider keeping the
// membership of a hosting cluster in etcd, adapted from protoactor's own
// clusterproviders/etcd for self-fencing:
//
//   - each registration is one incarnation: a fresh lease (Config.TTL) and
//     a key named after the member's actor system id, so a member that
//     lost its registration rejoins under a NEW member id (protoactor's
//     provider re-registers the same key, and members that block-listed
//     the old id would ignore it while members that join later route to
//     it);
//   - the member tracks how long its registration is known to hold
//     (ValidUntil: the send time of the last renewal the server accepted,
//     plus the TTL, minus a margin). Past that time the registration has
//     lapsed (hosting.Cluster serves nothing meanwhile) but is not lost:
//     during an etcd outage no lease expires, so once etcd accepts a
//     renewal again and the member's key is unchanged since it
//     registered, the registration holds again under the same id, with
//     no view change anywhere. It reports its loss (Lost) when etcd
//     answers that the lease is gone or its own key disappears or was
//     replaced; hosting.Cluster then fences itself (closes its units,
//     refuses activations) and rejoins as soon as etcd answers (Ready);
//   - the view is a Get followed by a Watch from the next revision, so no
//     change between the two is missed.
//
// Because etcd expires the lease no earlier than TTL after it accepted a
// renewal, and a renewal is accepted after it was sent, no other member
// sees this member leave before ValidUntil: a member that stops serving
// at ValidUntil never overlaps with its units' next hosts, whatever the
// length of a pause (SIGSTOP, a stalled VM) or a partition.
package etcdmember

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// MinTTL is the shortest lease etcd grants with its default timing
// (3/2 election timeouts of 1 s, rounded up to whole seconds).
const MinTTL = 2 * time.Second

// Config configures a Provider.
type Config struct {
	// Endpoints are the etcd client URLs. Required.
	Endpoints []string
	// Prefix is the key prefix under which members register
	// (Prefix/<cluster name>/<member id>). Empty: "/syncmesh/members".
	Prefix string
	// TTL is the lease time to live: a member that crashed or was cut
	// off is removed from every view about TTL after its last renewal.
	// Zero: 3 s. At least MinTTL; whole seconds (etcd's unit).
	TTL time.Duration
	// Margin is subtracted from TTL for the member's own validity window
	// (clock rate differences, scheduling). Zero: TTL/10.
	Margin time.Duration
	// DialTimeout bounds connecting to etcd. Zero: 5 s.
	DialTimeout time.Duration
	// Client adjusts the etcd client configuration (TLS, credentials)
	// before it is created.
	Client func(*clientv3.Config)
	// Logger receives membership changes. Nil: discarded.
	Logger *slog.Logger
}

// Provider implements cluster.ClusterProvider on etcd. One Provider serves
// one member across its incarnations: each StartMember (a new actor system
// and cluster after a fence) registers anew, on its own etcd client (made
// after protoactor's remote.Start, which replaces gRPC's global logger:
// an etcd client running meanwhile would race with it).
type Provider struct {
	cfg  Config
	ccfg clientv3.Config
	log  *slog.Logger

	mu  sync.Mutex
	cur *registration
}

var _ cluster.ClusterProvider = (*Provider)(nil)

// New checks the configuration; StartMember connects.
func New(cfg Config) (*Provider, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: Endpoints are required", ErrInvalidConfig)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/syncmesh/members"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 3 * time.Second
	}
	if cfg.TTL < MinTTL || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("%w: TTL %v: whole seconds, at least %v", ErrInvalidConfig, cfg.TTL, MinTTL)
	}
	if cfg.Margin == 0 {
		cfg.Margin = cfg.TTL / 10
	}
	if cfg.Margin < 0 || cfg.Margin >= cfg.TTL {
		return nil, fmt.Errorf("%w: Margin %v", ErrInvalidConfig, cfg.Margin)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ccfg := clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, Logger: zap.NewNop(),
		// gRPC's default reconnection backoff grows to 2 minutes: after
		// an etcd outage of 20 s the client would stay away for several
		// seconds more, every member lapsed meanwhile. Reconnect within
		// a renewal period instead (loopback-cheap: one dial per try).
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: min(cfg.TTL/3, time.Second)},
			MinConnectTimeout: cfg.DialTimeout,
		})}}
	if cfg.Client != nil {
		cfg.Client(&ccfg)
	}
	return &Provider{cfg: cfg, ccfg: ccfg, log: log}, nil
}

// TTL is the lease time to live.
func (p *Provider) TTL() time.Duration { return p.cfg.TTL }

// Close ends the current registration gracefully (its key is deleted).
func (p *Provider) Close() error {
	return p.Shutdown(true)
}

// registration is one incarnation of the member.
type registration struct {
	p       *Provider
	client  *clientv3.Client
	c       *cluster.Cluster
	self    string // member id
	key     string
	lease   clientv3.LeaseID
	ctx     context.Context
	cancel  context.CancelFunc
	valid   atomic.Int64 // unix nanos: ValidUntil (state.valid)
	created int64        // the key's create revision
	smu     sync.Mutex   // state
	state   leaseState
	lost    chan struct{}
	lostErr atomic.Pointer[error]
	once    sync.Once
	wg      sync.WaitGroup
	members map[string]*cluster.Member // by id, the watch goroutine only
}

// node is the value stored under a member's key.
type node struct {
	ID    string   `json:"id"`
	Host  string   `json:"host"`
	Port  int      `json:"port"`
	Kinds []string `json:"kinds"`
}

// StartMember implements cluster.ClusterProvider: a new lease, this
// member's key under it (id = the actor system's id), the initial view
// (which includes this member), then the watch and the renewals.
func (p *Provider) StartMember(c *cluster.Cluster) error {
	return p.start(c, true)
}

// StartClient implements cluster.ClusterProvider: the view only.
func (p *Provider) StartClient(c *cluster.Cluster) error {
	return p.start(c, false)
}

func (p *Provider) start(c *cluster.Cluster, member bool) error {
	p.mu.Lock()
	old := p.cur
	p.mu.Unlock()
	if old != nil {
		old.stop(false)
	}
	host, port, err := splitHostPort(c.ActorSystem.Address())
	if err != nil {
		return err
	}
	client, err := clientv3.New(p.ccfg)
	if err != nil {
		return fmt.Errorf("etcdmember: client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &registration{p: p, client: client, c: c, self: c.ActorSystem.ID, ctx: ctx, cancel: cancel, lost: make(chan struct{}), members: map[string]*cluster.Member{}}
	r.key = p.key(c.Config.Name, r.self)
	fail := func(err error) error {
		cancel()
		_ = client.Close()
		return fmt.Errorf("etcdmember: start: %w", err)
	}
	if member {
		sent := time.Now()
		opCtx, opCancel := context.WithTimeout(ctx, p.cfg.TTL)
		g, err := r.client.Grant(opCtx, int64(p.cfg.TTL/time.Second))
		opCancel()
		if err != nil {
			return fail(fmt.Errorf("grant lease: %w", err))
		}
		r.lease = g.ID
		r.state.valid = sent.Add(p.cfg.TTL - p.cfg.Margin)
		r.valid.Store(r.state.valid.UnixNano())
		val, err := json.Marshal(node{ID: r.self, Host: host, Port: port, Kinds: c.GetClusterKinds()})
		if err != nil {
			return fail(err)
		}
		opCtx, opCancel = context.WithTimeout(ctx, p.cfg.TTL)
		put, err := r.client.Put(opCtx, r.key, string(val), clientv3.WithLease(r.lease))
		opCancel()
		if err != nil {
			return fail(fmt.Errorf("register: %w", err))
		}
		// The key's create revision identifies this registration: the
		// key found with it later has existed ever since.
		r.created = put.Header.Revision
	}
	rev, err := r.list()
	if err != nil {
		return fail(err)
	}
	seen := len(r.members)
	p.mu.Lock()
	p.cur = r
	p.mu.Unlock()
	r.wg.Add(1)
	go r.watch(rev)
	if member {
		r.wg.Add(2)
		go r.renew()
		go r.expire()
	}
	p.log.Info("etcdmember: registered", "member", r.self, "address", c.ActorSystem.Address(), "lease", int64(r.lease), "members", seen)
	return nil
}

// Shutdown implements cluster.ClusterProvider: the registration ends; a
// graceful one deletes this member's key at once (a lost one is already
// gone from etcd).
func (p *Provider) Shutdown(graceful bool) error {
	p.mu.Lock()
	r := p.cur
	p.cur = nil
	p.mu.Unlock()
	if r != nil {
		r.stop(graceful)
	}
	return nil
}

// GetHealthStatus implements cluster.ClusterProvider.
func (p *Provider) GetHealthStatus() error {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return ErrNotStarted
	}
	if e := r.lostErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Lost is closed when the current registration is lost (hosting.Fencing).
// With no registration it is closed.
func (p *Provider) Lost() <-chan struct{} {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return r.lost
}

// ValidUntil is the time until which the current registration is known to
// hold: the send time of the last renewal etcd accepted (and, after a
// lapse, whose key check found the key held throughout) plus TTL minus
// Margin (hosting.Fencing). In the past while the registration has
// lapsed; zero with no registration or once it is lost.
func (p *Provider) ValidUntil() time.Time {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return time.Time{}
	}
	select {
	case <-r.lost:
		return time.Time{}
	default:
	}
	return time.Unix(0, r.valid.Load())
}

// Ready returns once etcd answers a read (hosting.Cluster waits for it
// before it starts a new incarnation after a loss, instead of starting
// one that cannot register), or ctx's error. Each try is bounded by
// TTL/3.
func (p *Provider) Ready(ctx context.Context) error {
	client, err := clientv3.New(p.ccfg)
	if err != nil {
		return fmt.Errorf("etcdmember: client: %w", err)
	}
	defer client.Close()
	for {
		tctx, cancel := context.WithTimeout(ctx, p.cfg.TTL/3)
		_, err := client.Get(tctx, p.cfg.Prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// MemberID is the id of the current registration ("" with none).
func (p *Provider) MemberID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return ""
	}
	return p.cur.self
}

func (p *Provider) key(names ...string) string {
	return strings.Join(append([]string{p.cfg.Prefix}, names...), "/")
}

// apply runs one input through step and carries out its effect.
func (r *registration) apply(in leaseInput) {
	r.smu.Lock()
	next, eff := step(r.state, in, r.p.cfg.TTL-r.p.cfg.Margin)
	r.state = next
	r.valid.Store(next.valid.UnixNano())
	r.smu.Unlock()
	switch eff {
	case effLapse:
		r.p.log.Warn("etcdmember: registration not renewed in time: serving nothing until etcd accepts a renewal", "member", r.self, "window", r.p.cfg.TTL-r.p.cfg.Margin)
	case effCheckKey:
		r.checkKey(in.now)
	case effResume:
		r.p.log.Info("etcdmember: registration renewed after a lapse: the key was held throughout", "member", r.self, "valid_until", next.valid)
	case effLose:
		err := fmt.Errorf("%w: lease %x or key gone", ErrLeaseLost, int64(r.lease))
		if in.kind == inKeyGone {
			err = fmt.Errorf("%w: own key deleted or replaced", ErrLeaseLost)
		}
		r.loseWith(err)
	}
}

// checkKey reads the member's key after a renewal accepted past the
// window: unchanged since registration (same create revision and lease)
// means no member ever saw it leave.
func (r *registration) checkKey(now time.Time) {
	ctx, cancel := context.WithTimeout(r.ctx, r.p.cfg.TTL/3)
	resp, err := r.client.Get(ctx, r.key)
	cancel()
	switch {
	case err != nil:
		// Unknown: stay lapsed; the next accepted renewal checks again.
		r.p.log.Debug("etcdmember: key check failed", "member", r.self, "err", err)
	case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != r.created || clientv3.LeaseID(resp.Kvs[0].Lease) != r.lease:
		r.apply(leaseInput{kind: inKeyGone, now: time.Now()})
	default:
		r.apply(leaseInput{kind: inKeyHeld, now: time.Now()})
	}
}

// loseWith marks the registration lost (once).
func (r *registration) loseWith(err error) {
	r.once.Do(func() {
		r.lostErr.Store(&err)
		close(r.lost)
		r.p.log.Warn("etcdmember: registration lost", "member", r.self, "err", err)
	})
}

func (r *registration) stop(graceful bool) {
	r.loseWith(fmt.Errorf("%w: shut down", ErrLeaseLost))
	r.cancel()
	r.wg.Wait()
	if graceful && r.lease != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), r.p.cfg.TTL)
		_, _ = r.client.Revoke(ctx, r.lease) // deletes the key
		cancel()
	}
}

// renew sends a renewal every TTL/3, each bounded by TTL/3; the validity
// window moves only on an accepted renewal, from its send time (step).
func (r *registration) renew() {
	defer r.wg.Done()
	every := r.p.cfg.TTL / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.lost:
			return
		case <-t.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(r.ctx, every)
		resp, err := r.client.KeepAliveOnce(ctx, r.lease)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			r.apply(leaseInput{kind: inLeaseGone, now: time.Now()})
		case err != nil:
			r.p.log.Debug("etcdmember: renewal failed", "member", r.self, "err", err)
		case resp.TTL <= 0:
			r.apply(leaseInput{kind: inLeaseGone, now: time.Now()})
		default:
			r.apply(leaseInput{kind: inRenewed, now: time.Now(), sent: sent})
		}
	}
}

// expire marks the registration lapsed when the validity window passes
// without an accepted renewal (etcd unreachable, the process paused). It
// does not lose it: renewals go on, and one accepted with the key held
// throughout resumes it (step).
func (r *registration) expire() {
	defer r.wg.Done()
	t := time.NewTicker(min(100*time.Millisecond, r.p.cfg.Margin))
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.lost:
			return
		case now := <-t.C:
			r.apply(leaseInput{kind: inTick, now: now})
		}
	}
}

// list reads every registered member, publishes the view and returns the
// revision it was read at.
func (r *registration) list() (int64, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.p.cfg.TTL)
	defer cancel()
	resp, err := r.client.Get(ctx, r.p.key(r.c.Config.Name)+"/", clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list members: %w", err)
	}
	r.members = map[string]*cluster.Member{}
	for _, kv := range resp.Kvs {
		if m, ok := r.decode(kv); ok {
			r.members[m.Id] = m
		}
	}
	r.publish()
	return resp.Header.Revision, nil
}

func (r *registration) decode(kv *mvccpb.KeyValue) (*cluster.Member, bool) {
	var n node
	if err := json.Unmarshal(kv.Value, &n); err != nil || n.ID == "" {
		r.p.log.Warn("etcdmember: undecodable member", "key", string(kv.Key), "err", err)
		return nil, false
	}
	kinds := n.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return &cluster.Member{Id: n.ID, Host: n.Host, Port: int32(n.Port), Kinds: kinds}, true
}

func (r *registration) publish() {
	ms := make([]*cluster.Member, 0, len(r.members))
	for _, m := range r.members {
		ms = append(ms, m)
	}
	r.c.MemberList.UpdateClusterTopology(ms)
}

// watch follows the members from rev+1; a failed watch (compaction,
// etcd restart) lists again and resumes. The member's own key vanishing
// loses the registration.
func (r *registration) watch(rev int64) {
	defer r.wg.Done()
	prefix := r.p.key(r.c.Config.Name) + "/"
	for r.ctx.Err() == nil {
		wch := r.client.Watch(clientv3.WithRequireLeader(r.ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				r.p.log.Debug("etcdmember: watch failed", "member", r.self, "err", err)
				break
			}
			for _, ev := range resp.Events {
				switch ev.Type {
				case clientv3.EventTypePut:
					if m, ok := r.decode(ev.Kv); ok {
						r.members[m.Id] = m
					}
				case clientv3.EventTypeDelete:
					id := string(ev.Kv.Key[strings.LastIndexByte(string(ev.Kv.Key), '/')+1:])
					delete(r.members, id)
					if id == r.self && r.lease != 0 {
						r.apply(leaseInput{kind: inKeyGone, now: time.Now()})
					}
				}
			}
			rev = resp.Header.Revision
			r.publish()
		}
		if r.ctx.Err() != nil {
			return
		}
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if n, err := r.list(); err == nil {
			rev = n
			if _, ok := r.members[r.self]; !ok && r.lease != 0 {
				r.apply(leaseInput{kind: inKeyGone, now: time.Now()})
			}
		}
	}
}

func splitHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("etcdmember: member address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("etcdmember: member address %q: %w", addr, err)
	}
	return h, port, nil
}
