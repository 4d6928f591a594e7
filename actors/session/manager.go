// Package session is the delivery plane's peer-session layer: one actor per
// remote device serializes that device's ratchet (encrypt and decrypt), a
// prekey actor owns the local prekey store, and a Manager routes calls by
// peer (docs/architecture.md, "Actor topology": session actor per remote device).
//
// Every state change is persisted before its result leaves the actor:
// Encrypt writes the advanced record before returning the envelope; Decrypt
// writes it before returning the plaintext. For the commit boundary
// (docs/protocol.md, commit boundary, "Transactions"), Open returns a Candidate — the
// plaintext and the new state, not persisted — which the caller writes in
// its own persistence.DeliveryTx together with its pending row, then
// releases. Until then the peer's actor accepts no other operation, so two
// candidates never fork a ratchet.
//
// Every write is a compare-and-swap on the stored record: a transaction
// writes a new session record only if the stored one is still the record
// the new one was computed from (else ErrStaleState and nothing changes),
// so even a candidate persisted after its actor gave up on it cannot fork
// the ratchet. Prekey consumption is merged the same way: a receive
// transaction re-reads the prekey store it writes (see Candidate.Persist).
//
// Identities are pinned per DeviceAddress: the first identity seen (in a
// bundle or an initiation) is pinned; a different one is refused with
// *IdentityChangedError until the application calls AcceptIdentity.
//
// Idle session actors passivate after Config.IdleTimeout and are spawned
// again on demand from the store.
package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Defaults of Config.
const (
	DefaultIdleTimeout      = time.Minute
	DefaultCandidateTimeout = 30 * time.Second
	DefaultRefreshInterval  = time.Hour
)

// Config configures a Manager. Store and Transport are required.
type Config struct {
	// Store holds the local identity, the prekeys, the sessions and the
	// pins. The Manager does not close it.
	Store persistence.DeliveryStore
	// Transport fetches bundles (and is where callers send envelopes).
	Transport Transport
	// Now is the injected clock (prekey schedule, initiation checks);
	// nil: time.Now.
	Now func() time.Time
	// Ratchet bounds per-session state; zero value: ratchet.DefaultConfig.
	Ratchet ratchet.Config
	// Prekeys is the prekey schedule used when the store is created and
	// applied to an existing store at start; zero value:
	// ratchet.DefaultPrekeyConfig (rotation 7 days, grace 30 days).
	Prekeys ratchet.PrekeyConfig
	// Mailboxes measures the session and prekey actors' mailboxes (nil:
	// not measured).
	Mailboxes *mailbox.Depths
	// RefreshInterval is how often the prekey actor applies the schedule
	// (rotation, expiry, one-time replenishment); 0: DefaultRefreshInterval,
	// negative: never (call RefreshPrekeys).
	RefreshInterval time.Duration
	// IdleTimeout passivates a session actor that received no message for
	// this long; 0: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// CandidateTimeout is how long a peer's actor waits for an Open
	// candidate to be committed or aborted before it abandons it;
	// 0: DefaultCandidateTimeout.
	CandidateTimeout time.Duration
	// Logger receives failures of the scheduled prekey refresh (which has
	// no caller to return them to); nil discards them.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Store == nil || c.Transport == nil {
		return fmt.Errorf("%w: Store and Transport are required", ErrInvalidConfig)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Ratchet == (ratchet.Config{}) {
		c.Ratchet = ratchet.DefaultConfig()
	}
	if err := c.Ratchet.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Prekeys == (ratchet.PrekeyConfig{}) {
		c.Prekeys = ratchet.DefaultPrekeyConfig()
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.CandidateTimeout <= 0 {
		c.CandidateTimeout = DefaultCandidateTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Manager owns the local device's sessions: it spawns one session actor
// per remote device on demand on its actor system, routes calls to it, and
// owns the prekey store through a prekey actor. All methods are safe for
// concurrent use and honour their context.
type Manager struct {
	cfg   Config
	sys   *actor.ActorSystem
	local ratchet.Identity
	pub   ratchet.IdentityPublic

	prekeys *actor.PID

	mu        sync.Mutex
	peers     map[messages.DeviceAddress]*peerEntry
	closed    bool
	closing   chan struct{}
	refreshMu sync.Mutex
	refresh   *time.Timer
}

// peerEntry is the routing entry of one live session actor. pending counts
// requests sent to it and not yet processed; the actor passivates only
// when it is zero (under Manager.mu), so no request reaches a stopped actor.
type peerEntry struct {
	pid     *actor.PID
	pending int
}

// NewManager loads the local identity and prekey store from cfg.Store,
// creating and persisting them on first use, and starts the prekey actor
// (and its refresh schedule) on sys.
func NewManager(ctx context.Context, sys *actor.ActorSystem, cfg Config) (*Manager, error) {
	if sys == nil {
		return nil, fmt.Errorf("%w: nil actor system", ErrInvalidConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, sys: sys, peers: make(map[messages.DeviceAddress]*peerEntry), closing: make(chan struct{})}
	err := cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error {
		idRaw, hasID, err := tx.LocalIdentity()
		if err != nil {
			return err
		}
		pkRaw, hasPK, err := tx.Prekeys()
		if err != nil {
			return err
		}
		switch {
		case hasID && hasPK:
			if m.local, err = ratchet.UnmarshalIdentity(idRaw); err != nil {
				return corrupt("local identity", err)
			}
			ps, err := ratchet.UnmarshalPrekeyStore(pkRaw)
			if err != nil {
				return corrupt("prekeys", err)
			}
			if ps.Config() != cfg.Prekeys {
				if ps, err = ps.WithConfig(cfg.Prekeys); err != nil {
					return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
				}
				return putPrekeys(tx, ps)
			}
			return nil
		case hasID != hasPK:
			return ErrNoIdentity
		}
		if m.local, err = ratchet.NewIdentity(); err != nil {
			return err
		}
		ps, err := ratchet.NewPrekeyStore(m.local, cfg.Now(), cfg.Prekeys)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		b, err := ratchet.MarshalIdentity(m.local)
		if err != nil {
			return err
		}
		if err := tx.PutLocalIdentity(b); err != nil {
			return err
		}
		return putPrekeys(tx, ps)
	})
	if err != nil {
		return nil, fmt.Errorf("session: start: %w", err)
	}
	m.pub = m.local.Public()
	m.prekeys = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &prekeyActor{m: m} }, m.cfg.Mailboxes.Option("prekeys")))
	if cfg.RefreshInterval > 0 {
		m.sys.Root.Send(m.prekeys, &refreshReq{ctx: context.Background()})
		m.armRefresh(cfg.RefreshInterval)
	}
	return m, nil
}

func putPrekeys(tx persistence.DeliveryTx, ps ratchet.PrekeyStore) error {
	b, err := ratchet.MarshalPrekeyStore(ps)
	if err != nil {
		return err
	}
	return tx.PutPrekeys(b)
}

func corrupt(what string, err error) error {
	return fmt.Errorf("session: stored %s: %w: %w", what, persistence.ErrCorrupt, err)
}

// armRefresh applies the prekey schedule after interval, and again after
// each interval until Close: a timer, not a goroutine per device.
func (m *Manager) armRefresh(interval time.Duration) {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	select {
	case <-m.closing:
		return
	default:
	}
	m.refresh = time.AfterFunc(interval, func() {
		m.sys.Root.Send(m.prekeys, &refreshReq{ctx: context.Background()})
		m.armRefresh(interval)
	})
}

// Identity returns the local device's public identity.
func (m *Manager) Identity() ratchet.IdentityPublic { return m.pub }

// Bundle issues a prekey bundle for one initiator (a fresh one-time prekey
// when one is left), after applying the prekey schedule; the prekey store
// is persisted before the bundle is returned.
func (m *Manager) Bundle(ctx context.Context) (*messages.PrekeyBundle, error) {
	reply := make(chan bundleRes, 1)
	if err := m.sendPrekeys(&bundleReq{ctx: ctx, reply: reply}); err != nil {
		return nil, err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return nil, err
	}
	return r.bundle, r.err
}

// RefreshPrekeys applies the prekey schedule now (rotation of the signed
// prekeys, expiry after the grace period, one-time replenishment) and
// reports whether the store changed.
func (m *Manager) RefreshPrekeys(ctx context.Context) (bool, error) {
	reply := make(chan refreshRes, 1)
	if err := m.sendPrekeys(&refreshReq{ctx: ctx, reply: reply}); err != nil {
		return false, err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return false, err
	}
	return r.changed, r.err
}

func (m *Manager) sendPrekeys(msg any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.sys.Root.Send(m.prekeys, msg)
	return nil
}

// Encrypt encrypts plaintext for peer and returns the envelope to send.
// Without a session it fetches peer's bundle, verifies it, checks it
// against the pinned identity (pinning it on first contact) and initiates
// one. The advanced session is persisted before the envelope is returned.
func (m *Manager) Encrypt(ctx context.Context, peer messages.DeviceAddress, plaintext []byte) ([]byte, error) {
	reply := make(chan encryptRes, 1)
	if err := m.route(peer, &encryptReq{ctx: ctx, plaintext: plaintext, reply: reply}); err != nil {
		return nil, err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return nil, err
	}
	return r.envelope, r.err
}

// Send encrypts plaintext for peer (as Encrypt: the advanced session is
// persisted first) and hands the envelope to the transport. It returns the
// envelope, so a caller may keep it for a retry after a transport error.
func (m *Manager) Send(ctx context.Context, peer messages.DeviceAddress, plaintext []byte) ([]byte, error) {
	env, err := m.Encrypt(ctx, peer, plaintext)
	if err != nil {
		return nil, err
	}
	if err := m.cfg.Transport.Send(ctx, peer, env); err != nil {
		return env, fmt.Errorf("session: send to %s: %w", peer, err)
	}
	return env, nil
}

// Decrypt opens envelope from peer and persists the new session state in
// one transaction before returning the plaintext. On error nothing changed.
func (m *Manager) Decrypt(ctx context.Context, peer messages.DeviceAddress, envelope []byte) ([]byte, error) {
	reply := make(chan openRes, 1)
	if err := m.route(peer, &openReq{ctx: ctx, envelope: envelope, persist: true, reply: reply}); err != nil {
		return nil, err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return nil, err
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.cand.plaintext, nil
}

// Open decrypts envelope from peer without persisting anything and returns
// the Candidate holding the plaintext and the new state. The caller must
// persist it in its own transaction (Candidate.Persist) and then release it
// (Candidate.Committed or Candidate.Abort; Candidate.Commit does all
// three); until then, or until Config.CandidateTimeout, peer's actor
// processes no other operation.
func (m *Manager) Open(ctx context.Context, peer messages.DeviceAddress, envelope []byte) (*Candidate, error) {
	reply := make(chan openRes, 1)
	if err := m.route(peer, &openReq{ctx: ctx, envelope: envelope, reply: reply}); err != nil {
		return nil, err
	}
	select {
	case r := <-reply:
		return r.cand, r.err
	case <-ctx.Done():
		// The actor may still produce a candidate: abandon it when it does.
		go func() {
			if r := <-reply; r.cand != nil {
				r.cand.Abort()
			}
		}()
		return nil, ctx.Err()
	}
}

// AcceptIdentity pins identity for peer (the application accepted a
// changed identity). A stored session with another identity is deleted,
// so the next Encrypt fetches a new bundle and the next initiation from
// identity is accepted.
func (m *Manager) AcceptIdentity(ctx context.Context, peer messages.DeviceAddress, identity ratchet.IdentityPublic) error {
	reply := make(chan error, 1)
	if err := m.route(peer, &acceptReq{ctx: ctx, identity: identity, reply: reply}); err != nil {
		return err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return err
	}
	return r
}

// ResetSession deletes the session with peer (the pin is kept), so the
// next Encrypt starts a new session from a fresh bundle.
func (m *Manager) ResetSession(ctx context.Context, peer messages.DeviceAddress) error {
	reply := make(chan error, 1)
	if err := m.route(peer, &resetReq{ctx: ctx, reply: reply}); err != nil {
		return err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return err
	}
	return r
}

// Warm spawns peer's session actor (if it is not live) and loads its state
// from the store, without any other effect.
func (m *Manager) Warm(ctx context.Context, peer messages.DeviceAddress) error {
	reply := make(chan error, 1)
	if err := m.route(peer, &warmReq{ctx: ctx, reply: reply}); err != nil {
		return err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return err
	}
	return r
}

// LiveSessions returns how many session actors are live (not passivated).
func (m *Manager) LiveSessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.peers)
}

// Close stops every actor of the manager after the requests already
// queued were processed (a candidate awaiting release is abandoned). It
// does not close the store. Calls after Close return ErrClosed.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.closed = true
	close(m.closing)
	pids := make([]*actor.PID, 0, len(m.peers)+1)
	for _, e := range m.peers {
		pids = append(pids, e.pid)
	}
	pids = append(pids, m.prekeys)
	m.mu.Unlock()
	m.refreshMu.Lock()
	if m.refresh != nil {
		m.refresh.Stop()
	}
	m.refreshMu.Unlock()
	var wg sync.WaitGroup
	for _, pid := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.sys.Root.PoisonFuture(pid).Wait()
		}()
	}
	wg.Wait()
	return nil
}

// route sends msg to peer's session actor, spawning it when it is not live.
func (m *Manager) route(peer messages.DeviceAddress, msg any) error {
	if err := peer.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidPeer, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	e := m.peers[peer]
	if e == nil {
		e = &peerEntry{}
		a := &peerActor{m: m, peer: peer, entry: e}
		e.pid = m.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }, m.cfg.Mailboxes.Option("session")))
		m.peers[peer] = e
	}
	e.pending++
	m.sys.Root.Send(e.pid, msg)
	return nil
}

// done records that a's entry processed one request.
func (m *Manager) done(e *peerEntry) {
	m.mu.Lock()
	e.pending--
	m.mu.Unlock()
}

// passivate removes e when it has no pending request and reports whether
// its actor may stop.
func (m *Manager) passivate(peer messages.DeviceAddress, e *peerEntry) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.pending != 0 || m.closed {
		return false
	}
	if m.peers[peer] == e {
		delete(m.peers, peer)
	}
	return true
}

// await waits for one reply or the context.
func await[T any](ctx context.Context, ch <-chan T) (T, error) {
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}
