package hosting

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime"
)

// Kinds of hosted units.
const (
	// KindDevice is a hosted device: identity = the device address in the
	// form of DeviceIdentity ("user.device"). Its node carries the delivery
	// plane (runtime.Config.Device).
	KindDevice = "device"
	// KindGroup is a hosted sync group (a tenant's replicated tables):
	// identity = the group name. Its node carries the sync plane only.
	KindGroup = "group"
)

// MaxIdentity bounds an identity (it is also the hosted node's Name).
const MaxIdentity = 256

// Config configures the hosting of units on one member; it is shared by
// every Placement implementation.
type Config struct {
	// Root is the data root shared by every member: a unit's node lives in
	// Root/<kind>/<hex(identity)> (runtime.Config.Dir). Every member must
	// see the same files at Root (one machine, or storage that moves with
	// the unit); see the package documentation. Required.
	Root string
	// MeshID is every hosted node's mesh id. Required.
	MeshID []byte
	// Logger receives hosting logs and the hosted nodes' logs. Nil:
	// discarded.
	Logger *slog.Logger
	// LockTimeout bounds how long an activation waits for a unit's bbolt
	// file still held by its previous host; past it the request fails with
	// ErrUnavailable and is retried. Zero: 2 s.
	LockTimeout time.Duration
	// NoSync skips fsync in the hosted nodes' bbolt files. Tests only.
	NoSync bool
	// Node, when set, adjusts each hosted node's configuration before it
	// is opened (scope, storage key, metrics, device options...). Dir,
	// MeshID, System and Device.Address/Transport are set by the host.
	Node func(kind, identity string, cfg *runtime.Config)
	// Authorizer decides which units a request's principal may act on.
	// Nil: OwnerOnly (a unit's operations are its owner tenant's alone).
	Authorizer Authorizer
	// TenantQuota bounds the units one tenant may own (across the
	// cluster: the count lives in the shared root). Zero:
	// DefaultTenantQuota.
	TenantQuota int
}

func (c *Config) validate() error {
	if c.Root == "" {
		return fmt.Errorf("%w: Root is required", ErrInvalidConfig)
	}
	if len(c.MeshID) == 0 || len(c.MeshID) > 64 {
		return fmt.Errorf("%w: MeshID must be 1..64 bytes", ErrInvalidConfig)
	}
	if c.LockTimeout < 0 {
		return fmt.Errorf("%w: LockTimeout must not be negative", ErrInvalidConfig)
	}
	if c.TenantQuota < 0 {
		return fmt.Errorf("%w: TenantQuota must not be negative", ErrInvalidConfig)
	}
	return nil
}

// DeviceIdentity is the identity of the device grain at a:
// a.String() ("user.device", the user quoted when needed).
func DeviceIdentity(a messages.DeviceAddress) string { return a.String() }

// ParseDeviceIdentity parses an identity made by DeviceIdentity.
func ParseDeviceIdentity(s string) (messages.DeviceAddress, error) {
	i := strings.LastIndexByte(s, '.')
	if i <= 0 {
		return messages.DeviceAddress{}, fmt.Errorf("%w: %q is not user.device", ErrInvalidIdentity, s)
	}
	user, num := s[:i], s[i+1:]
	if strings.HasPrefix(user, `"`) {
		u, err := strconv.Unquote(user)
		if err != nil {
			return messages.DeviceAddress{}, fmt.Errorf("%w: %q: bad quoted user", ErrInvalidIdentity, s)
		}
		user = u
	}
	d, err := strconv.ParseUint(num, 10, 32)
	if err != nil || (len(num) > 1 && num[0] == '0') || num[0] == '+' {
		return messages.DeviceAddress{}, fmt.Errorf("%w: %q: bad device number", ErrInvalidIdentity, s)
	}
	a := messages.DeviceAddress{User: user, Device: uint32(d)}
	if err := a.Validate(); err != nil {
		return messages.DeviceAddress{}, fmt.Errorf("%w: %q: %w", ErrInvalidIdentity, s, err)
	}
	if a.String() != s {
		return messages.DeviceAddress{}, fmt.Errorf("%w: %q is not in canonical form %q", ErrInvalidIdentity, s, a.String())
	}
	return a, nil
}

func checkUnit(kind, identity string) error {
	if identity == "" || len(identity) > MaxIdentity || !utf8.ValidString(identity) {
		return fmt.Errorf("%w: identity must be 1..%d bytes of UTF-8", ErrInvalidIdentity, MaxIdentity)
	}
	switch kind {
	case KindGroup:
		return nil
	case KindDevice:
		_, err := ParseDeviceIdentity(identity)
		return err
	}
	return fmt.Errorf("%w: unknown kind %q", ErrBadRequest, kind)
}

// unitDir is where the unit's node keeps its files.
func unitDir(root, kind, identity string) string {
	return filepath.Join(root, kind, hex.EncodeToString([]byte(identity)))
}

type unitKey struct{ kind, identity string }

// unit is one open hosted node: one activation of the unit.
type unit struct {
	key    unitKey
	ready  chan struct{} // closed once node/err are set
	node   *runtime.Node
	err    error
	closed atomic.Bool
	// epoch numbers this activation: one more than the previous
	// activation's, persisted in the unit's directory while its bbolt
	// file is locked, so no two activations of a unit share one (a
	// fencing token replies carry).
	epoch uint64
	// activatedAt is when this activation began serving (after its epoch
	// was persisted).
	activatedAt time.Time
	// term is, for a replicated unit, the raft term of its partition in
	// which this member led when the activation began: it serves only
	// while it still leads in that term (replicaSet.checkTerm).
	term uint64
	// busy counts requests in progress and lastUsed is when the last one
	// ended (Unix ns): Local's passivation of idle units.
	busy     atomic.Int32
	lastUsed atomic.Int64
}

// host opens, serves and closes the units of one member. Its methods are
// safe for concurrent use.
type host struct {
	cfg       Config
	name      atomic.Pointer[string]
	id        atomic.Pointer[string]
	system    atomic.Pointer[actor.ActorSystem]
	log       *slog.Logger
	transport func(self messages.DeviceAddress) runtime.DeviceTransport
	// ident is the member's identity in attribution: its certificate's
	// name (Cluster with TLS) or its member name.
	ident atomic.Pointer[string]
	// placedOn names the identity of the member a unit is placed on (in
	// this member's view; "" when unknown).
	placedOn func(kind, identity string) string
	// repl replicates units' files (ClusterConfig.Replicas ≥ 2); nil:
	// the files are local (or on a shared volume).
	repl replicaSet

	mu      sync.Mutex
	units   map[unitKey]*unit
	closing bool
}

func newHost(cfg Config, member string, sys *actor.ActorSystem, transport func(messages.DeviceAddress) runtime.DeviceTransport) *host {
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = 2 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Authorizer == nil {
		cfg.Authorizer = OwnerOnly
	}
	if cfg.TenantQuota == 0 {
		cfg.TenantQuota = DefaultTenantQuota
	}
	h := &host{cfg: cfg, log: log, transport: transport, units: map[unitKey]*unit{}}
	h.system.Store(sys)
	h.setMember(member, member)
	h.ident.Store(&member)
	return h
}

// member names the member in replies and logs.
func (h *host) member() string { return *h.name.Load() }

// memberID is the member's current incarnation (its cluster member id).
func (h *host) memberID() string { return *h.id.Load() }

func (h *host) setMember(m, id string) { h.name.Store(&m); h.id.Store(&id) }

// acquire returns the open unit (kind, identity), opening its node from
// the shared root if needed. Concurrent callers share one open. gate, when
// set, must allow the activation before and after the node is opened (the
// member still owns the unit and is not fenced); nil allows it.
func (h *host) acquire(ctx context.Context, kind, identity string, gate func() error) (*unit, error) {
	if err := checkUnit(kind, identity); err != nil {
		return nil, err
	}
	if gate != nil {
		if err := gate(); err != nil {
			return nil, err
		}
	}
	k := unitKey{kind, identity}
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: member %s is stopping", ErrUnavailable, h.member())
	}
	if u, ok := h.units[k]; ok {
		h.mu.Unlock()
		select {
		case <-u.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		if u.err != nil {
			return nil, u.err
		}
		return u, nil
	}
	u := &unit{key: k, ready: make(chan struct{})}
	h.units[k] = u
	h.mu.Unlock()

	if h.repl != nil {
		// The term before the unit's state is read: a reply is current
		// only if this member still leads in it (serve).
		t, leading := h.repl.term(h.repl.partitionOf(unitPath(kind, identity)))
		if !leading {
			u.err = fmt.Errorf("%w: %s %q: this member does not lead its partition", ErrNotOwner, kind, identity)
		}
		u.term = t
	}
	if u.err == nil {
		if _, err := ownerOf(h.cfg.Root, kind, identity); err != nil {
			u.err = err
		} else {
			u.node, u.err = h.open(ctx, kind, identity)
		}
	}
	if u.err == nil {
		// Deleted while it was being opened: do not serve (or leave
		// behind) a unit that no longer exists.
		if _, err := ownerOf(h.cfg.Root, kind, identity); err != nil {
			_ = u.node.Close()
			u.node, u.err = nil, err
		}
	}
	if u.err == nil {
		u.epoch, u.err = h.bumpEpoch(ctx, kind, identity)
		if u.err == nil && gate != nil {
			u.err = gate()
		}
		if u.err != nil {
			_ = u.node.Close()
			u.node = nil
		}
		u.activatedAt = time.Now()
	}
	if u.err != nil {
		h.mu.Lock()
		delete(h.units, k)
		h.mu.Unlock()
		h.log.Warn("hosting: activation failed", "kind", kind, "identity", identity, "member", h.member(), "err", u.err)
	} else {
		h.log.Debug("hosting: activated", "kind", kind, "identity", identity, "member", h.member(), "epoch", u.epoch)
	}
	close(u.ready)
	if u.err != nil {
		return nil, u.err
	}
	return u, nil
}

func (h *host) open(ctx context.Context, kind, identity string) (*runtime.Node, error) {
	cfg := runtime.Config{
		Dir:          unitDir(h.cfg.Root, kind, identity),
		MeshID:       h.cfg.MeshID,
		Name:         identity,
		Logger:       h.log,
		System:       h.system.Load(),
		NoSync:       h.cfg.NoSync,
		LockTimeout:  h.cfg.LockTimeout,
		SyncInterval: -1,
	}
	var addr messages.DeviceAddress
	if kind == KindDevice {
		var err error
		if addr, err = ParseDeviceIdentity(identity); err != nil {
			return nil, err
		}
		cfg.Device = &runtime.DeviceConfig{}
	}
	if h.cfg.Node != nil {
		h.cfg.Node(kind, identity, &cfg)
	}
	cfg.Dir, cfg.MeshID, cfg.System = unitDir(h.cfg.Root, kind, identity), h.cfg.MeshID, h.system.Load()
	if kind == KindDevice {
		if cfg.Device == nil {
			cfg.Device = &runtime.DeviceConfig{}
		}
		dc := *cfg.Device
		dc.Address, dc.Transport = addr, h.transport(addr)
		cfg.Device = &dc
	} else {
		cfg.Device = nil
	}
	if h.repl != nil {
		// A replicated unit: node.db is this member's replica, written
		// only through the partition's log (a write is visible once a
		// quorum holds it), so it cannot go back in time and needs no
		// mark files; its storage key is replicated beside it.
		if len(cfg.StorageKey) == 0 {
			key, err := h.unitStorageKey(ctx, kind, identity)
			if err != nil {
				return nil, err
			}
			cfg.StorageKey, cfg.PreviousStorageKeys = key, nil
		}
		path := unitPath(kind, identity)
		cfg.NoMarkFiles = true
		// The node detaches the store from the engine after its last
		// write, before it closes it.
		cfg.OpenStore = func(file string, opts bolt.Options) (*bolt.DB, func(), error) {
			return h.repl.openStore(path, file, opts)
		}
	}
	n, err := runtime.Open(ctx, cfg)
	if err != nil {
		err = h.replErr(err)
		if errors.Is(err, runtime.ErrLocked) {
			return nil, fmt.Errorf("%w: %s %q still held by its previous host: %w", ErrUnavailable, kind, identity, err)
		}
		if ctx.Err() != nil || errors.Is(err, ErrUnavailable) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, fmt.Errorf("hosting: open %s %q: %w", kind, identity, err)
	}
	return n, nil
}

// release closes the unit's node (releasing its bbolt lock) and forgets it.
func (h *host) release(u *unit) error {
	if u == nil {
		return nil
	}
	h.mu.Lock()
	if h.units[u.key] == u {
		delete(h.units, u.key)
	}
	h.mu.Unlock()
	<-u.ready
	if u.node == nil || u.closed.Swap(true) {
		return nil
	}
	err := u.node.Close()
	h.log.Debug("hosting: deactivated", "kind", u.key.kind, "identity", u.key.identity, "member", h.member(), "err", err)
	return err
}

// close refuses new activations and closes every open unit.
func (h *host) close() error {
	return h.releaseAll(true)
}

// releaseAll closes every open unit; closing also refuses activations from
// now on (a fenced member only closes them: it activates again once it
// rejoined).
func (h *host) releaseAll(closing bool) error {
	h.mu.Lock()
	h.closing = h.closing || closing
	us := make([]*unit, 0, len(h.units))
	for _, u := range h.units {
		us = append(us, u)
	}
	h.mu.Unlock()
	var errs []error
	for _, u := range us {
		errs = append(errs, h.release(u))
	}
	return errors.Join(errs...)
}

// idleUnits lists the open units with no request in progress and none
// ended after cutoff (Unix ns).
func (h *host) idleUnits(cutoff int64) []*unit {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*unit
	for _, u := range h.units {
		select {
		case <-u.ready:
		default:
			continue
		}
		if u.node != nil && u.busy.Load() == 0 && u.lastUsed.Load() < cutoff && u.activatedAt.UnixNano() < cutoff {
			out = append(out, u)
		}
	}
	return out
}

// hosted lists the open units (kind, identity).
func (h *host) hosted() []Unit {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Unit, 0, len(h.units))
	for k := range h.units {
		out = append(out, Unit{Kind: k.kind, Identity: k.identity})
	}
	return out
}

// Unit names a hosted unit.
type Unit struct {
	Kind     string // KindDevice or KindGroup
	Identity string // device identity or group name
}

// fail builds an error reply.
func (h *host) fail(err error) *Reply {
	return &Reply{Member: h.member(), MemberID: h.memberID(), Code: codeOf(err), Error: err.Error()}
}

// framed returns rep, or a CodeFailed reply when rep is a frame the codec
// refuses (one item larger than a page can carry): protoactor's endpoint
// writer would log and drop it, and the caller would only time out.
func (h *host) framed(rep *Reply) *Reply {
	if _, err := rep.Serialize(); err != nil {
		return h.fail(fmt.Errorf("%w: reply: %w", ErrFailed, err))
	}
	return rep
}

// epochFile holds a unit's last activation epoch (decimal), beside its
// node's files.
const epochFile = "hosting.epoch"

// bumpEpoch reads the unit's last activation epoch, persists the next one
// and returns it. It runs while the unit's bbolt file is locked by this
// activation, so epochs of one unit are unique and increasing whatever
// the members believe about the topology. A replicated unit's epoch is
// written through its partition's log by its leader (after the barrier
// of its term: it read the last one), so it is unique the same way.
func (h *host) bumpEpoch(ctx context.Context, kind, identity string) (uint64, error) {
	dir := unitDir(h.cfg.Root, kind, identity)
	e, err := readEpoch(dir)
	if err != nil || h.repl == nil {
		if err != nil {
			return 0, err
		}
		return bumpEpoch(dir, e, !h.cfg.NoSync)
	}
	e++
	if err := h.repl.writeFile(ctx, unitPath(kind, identity), epochFile, []byte(strconv.FormatUint(e, 10)+"\n")); err != nil {
		return 0, h.replErr(fmt.Errorf("hosting: persist epoch of %s %q: %w", kind, identity, err))
	}
	return e, nil
}

// readEpoch reads the unit's last activation epoch (0: none yet).
func readEpoch(dir string) (uint64, error) {
	path := filepath.Join(dir, epochFile)
	var e uint64
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if e, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return 0, fmt.Errorf("hosting: %s is damaged: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("hosting: read %s: %w", path, err)
	}
	return e, nil
}

// bumpEpoch persists epoch e+1 in dir (a local or shared root) and
// returns it.
func bumpEpoch(dir string, e uint64, sync bool) (uint64, error) {
	path := filepath.Join(dir, epochFile)
	e++
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("hosting: write %s: %w", tmp, err)
	}
	_, err = f.WriteString(strconv.FormatUint(e, 10) + "\n")
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && sync {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			_ = d.Close()
		}
	}
	if err != nil {
		return 0, fmt.Errorf("hosting: persist epoch in %s: %w", dir, err)
	}
	return e, nil
}

// self is the member's identity in attribution.
func (h *host) self() string { return *h.ident.Load() }

// admit decides whether req may run on the unit (kind, identity), before
// the unit is activated: device-to-device delivery and bundle requests
// are attributed (the sending device, req.Peer, must be placed on the
// member that sent the request, req.Caller, as its certificate names
// it); every other operation is the Authorizer's to allow, for the
// unit's owner. OpCreate provisions the unit (within the tenant's quota)
// when allowed. A refusal changes nothing.
func (h *host) admit(kind, identity string, req *Request) error {
	if req == nil {
		return fmt.Errorf("%w: nil request", ErrBadRequest)
	}
	switch req.Op {
	case OpDeliver, OpBundle:
		if kind != KindDevice {
			return fmt.Errorf("%w: %s is not an operation of a %s", ErrBadRequest, req.Op, kind)
		}
		if req.Peer == nil || req.Peer.Validate() != nil {
			return fmt.Errorf("%w: %s needs the sending device", ErrBadRequest, req.Op)
		}
		if _, err := ownerOf(h.cfg.Root, kind, identity); err != nil {
			return err
		}
		from := DeviceIdentity(*req.Peer)
		where := ""
		if h.placedOn != nil {
			where = h.placedOn(KindDevice, from)
		}
		if req.Caller == "" || where != req.Caller {
			return fmt.Errorf("%w: %s as %s from member %q, but %s is placed on %q", ErrForbidden, req.Op, from, req.Caller, from, where)
		}
		return nil
	}
	var p Principal
	if req.Principal != nil {
		p = *req.Principal
	}
	owner, err := ownerOf(h.cfg.Root, kind, identity)
	if err != nil && (req.Op != OpCreate || !errors.Is(err, ErrNotProvisioned)) {
		return err
	}
	if err := h.cfg.Authorizer.Authorize(Access{Principal: p, Op: req.Op, Unit: Unit{Kind: kind, Identity: identity}, Owner: owner}); err != nil {
		return fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	if req.Op == OpCreate {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.LockTimeout+5*time.Second)
		created, err := provision(ctx, h.repl, h.cfg.Root, kind, identity, p.Tenant, h.cfg.TenantQuota, !h.cfg.NoSync)
		cancel()
		if err != nil {
			return h.replErr(err)
		}
		if created {
			h.log.Info("hosting: unit created", "kind", kind, "identity", identity, "tenant", p.Tenant, "member", h.member())
		}
	}
	return nil
}

// remove closes the unit if it is open here and deletes its files
// (OpDelete, after admit allowed it).
func (h *host) remove(kind, identity string) (*Reply, error) {
	h.mu.Lock()
	u := h.units[unitKey{kind, identity}]
	h.mu.Unlock()
	if err := h.release(u); err != nil {
		h.log.Warn("hosting: close before delete", "kind", kind, "identity", identity, "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.LockTimeout+5*time.Second)
	defer cancel()
	if err := unprovision(ctx, h.repl, h.cfg.Root, kind, identity); err != nil {
		return nil, h.replErr(err)
	}
	h.log.Info("hosting: unit deleted", "kind", kind, "identity", identity, "member", h.member())
	return &Reply{Member: h.member(), MemberID: h.memberID()}, nil
}
