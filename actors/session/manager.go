// Package session is the delivery plane's per-peer layer: one actor per
// remote device owns everything keyed by that device — its ratchet record
// and pin, the receive decision of its envelopes (the commit boundary of
// docs/protocol.md (commit boundary), decided by actors/inbound's pure functions),
// the finalization of its pending messages with the ACK's encryption, and
// the pending outbound rows addressed to it (docs/architecture.md, "Actor topology").
//
// Peer actors decide; one committer per store writes. A peer actor hands
// the writes of each decision to the committer and goes on with the next
// input on its speculative state; the committer drains its mailbox into
// one transaction and answers after it is durable, so concurrent peers and
// consecutive messages of one peer share an fsync. Nothing leaves before
// its writes are durable: a Delivery, a commit's result, an envelope or an
// ACK handed to the transport. When a write fails, the committer writes
// nothing more that was computed on top of it and the peer actor reloads
// its state from the store, so the ratchet never forks and the stored
// state is always a prefix of what was decided.
//
// Identities are pinned per DeviceAddress: the first identity seen (in a
// bundle or an initiation) is pinned; a different one is refused with
// *IdentityChangedError until the application calls AcceptIdentity.
//
// Idle peer actors passivate after Config.IdleTimeout and are spawned
// again on demand from the store.
package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Defaults of Config.
const (
	DefaultIdleTimeout = time.Minute
	// DefaultMaxUnpinnedPeers is Config.MaxUnpinnedPeers' default.
	DefaultMaxUnpinnedPeers = 1024
	DefaultRefreshInterval  = time.Hour
	// DefaultMaxSkippedKeysPerDevice is Config.MaxSkippedKeysPerDevice's
	// default: ten records at the per-record cap (about 2 MiB sealed).
	DefaultMaxSkippedKeysPerDevice = 20_000
)

// Config configures a Manager. Store and Transport are required.
type Config struct {
	// Store holds the local identity, the prekeys, the sessions, the pins
	// and the commit-boundary records. The Manager does not close it; it
	// is the store's only writer while it runs.
	Store persistence.DeliveryStore
	// Transport fetches bundles and carries envelopes.
	Transport Transport
	// Local is this device's address, signed into its initiations and
	// required of the initiations it accepts; zero: the Transport's
	// LocalAddress when it has one (LocalAddresser). Without either, this
	// device cannot initiate sessions.
	Local messages.DeviceAddress
	// Now is the injected clock (prekey schedule, initiation checks,
	// receive, commit and send times); nil: time.Now.
	Now func() time.Time
	// Ratchet bounds per-session state; zero value: ratchet.DefaultConfig.
	Ratchet ratchet.Config
	// Prekeys is the prekey schedule used when the store is created and
	// applied to an existing store at start; zero value:
	// ratchet.DefaultPrekeyConfig (rotation 7 days, grace 30 days).
	Prekeys ratchet.PrekeyConfig
	// Mailboxes measures the peer actors' and the committer's mailboxes
	// (nil: not measured).
	Mailboxes *mailbox.Depths
	// RefreshInterval is how often the prekey schedule is applied
	// (rotation, expiry, one-time replenishment); 0: DefaultRefreshInterval,
	// negative: never (call RefreshPrekeys).
	RefreshInterval time.Duration
	// IdleTimeout passivates a peer actor that received no message for
	// this long (and has no write in flight); 0: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxUnpinnedPeers caps the peer actors live at once for envelopes
	// from addresses with no stored pin or session (unauthenticated
	// senders, first contacts); past it such an envelope is refused with
	// ErrTooManyUnpinned and nothing is kept (its sender retries). 0:
	// DefaultMaxUnpinnedPeers.
	MaxUnpinnedPeers int
	// MaxPendingPerSender caps one sender's pending messages; a new
	// message past it is refused before its ratchet step is persisted
	// (inbound.ErrSenderBacklogFull). 0: no cap (the spec's behaviour).
	MaxPendingPerSender int
	// MaxPending caps the pending messages of all senders together; a new
	// message past it is refused in the committer's transaction (where the
	// count of every peer's writes is exact), before its ratchet step is
	// persisted (inbound.ErrBacklogFull). 0: no cap.
	MaxPending int
	// FailedDecryptBurst and FailedDecryptRate are each sender's budget
	// of decrypt attempts that fail (budget.go): a burst, refilled per
	// second of Now. 0: DefaultFailedDecryptBurst, DefaultFailedDecryptRate;
	// a negative burst turns the budget off.
	FailedDecryptBurst int
	FailedDecryptRate  float64
	// OnUndecryptable, when set, is told about every envelope that could
	// not be decrypted (from the peer's actor: it must not block), with
	// its reason (UndecryptableReason).
	OnUndecryptable func(peer messages.DeviceAddress, reason string, err error)
	// MaxSkippedKeysPerDevice caps the skipped message keys stored for
	// all peers together (beside Ratchet.MaxSkippedKeysPerRecord per
	// peer). Past it, at the end of the transaction that crossed it, the
	// peers holding the most keys lose their oldest ones until the cap
	// holds (persistence.PlanSkippedEviction): a peer that floods skipped
	// keys loses its own first, and a peer holding fewer keys than the
	// flooder keeps all of them. An evicted key's message then fails with
	// ratchet.ErrReplay (as past the per-record cap); a loaded peer actor
	// may still use a key evicted from storage until it reloads. Reported
	// in Stats (SkippedKeys, SkippedEvicted) and logged once per episode
	// at the cap. 0: DefaultMaxSkippedKeysPerDevice;
	// negative: no device-wide cap.
	MaxSkippedKeysPerDevice int
	// MaxBatch bounds the items of one committer transaction; 0:
	// DefaultMaxBatch.
	MaxBatch int
	// Observe, when set, receives the Stats of each committed transaction
	// (from the committer: it must not block).
	Observe func(Stats)
	// OnDelivery, when set, is called with every Delivery once it is
	// durable, in commit order, before the receiver's caller is answered
	// (from the committer's replier goroutine: it must not block).
	OnDelivery func(inbound.ReceivedMessage)
	// NoHeldReceipts turns off the held receipt a copy of a pending
	// message is answered with (docs/protocol.md, "Held receipt"): only
	// for a rolling upgrade while some senders run a build that cannot
	// read one (it refuses the frame, and its sender keeps resending on
	// its short schedule).
	NoHeldReceipts bool
	// OnHeld, when set, is told about every held receipt this device tried
	// to send, as OnAck about ACKs.
	OnHeld func(to messages.DeviceAddress, id messages.LogicalMessageID, err error)
	// OnAck, when set, is told about every ACK this device tried to send:
	// err nil when it was handed to the transport (from the committer's
	// replier goroutine).
	OnAck func(to messages.DeviceAddress, id messages.LogicalMessageID, err error)
	// Logger receives failures of the scheduled prekey refresh (which has
	// no caller to return them to); nil discards them.
	Logger *slog.Logger
	// RepairInterval is the least time between two session repairs with
	// one peer (repair.go): when an envelope from a peer with a pinned
	// identity names a session this device does not hold (it reset the
	// session, or lost it to a restore), the device starts a fresh
	// authenticated initiation to the peer, so the peer's next messages
	// decrypt again. 0: DefaultRepairInterval; negative: no repairs.
	RepairInterval time.Duration
	// OnRepair, when set, is told about every step of a session repair
	// (step: RepairStarted or RepairFailed with err, RepairSuppressed,
	// RepairRestored). From the peer's actor, the committer's replier or
	// a caller's goroutine: it must not block.
	OnRepair func(peer messages.DeviceAddress, step string, err error)
	// Restored says the store may be a restored or copied one (the node's
	// restore check suspected it, or the operator said so): every stored
	// session may be behind its peer, so the first encryption to each
	// peer after Open starts a fresh initiation instead of using it (the
	// old sessions stay archived and decryptable), reported as
	// RepairRestored.
	Restored bool
}

func (c *Config) setDefaults() error {
	if c.Store == nil || c.Transport == nil {
		return fmt.Errorf("%w: Store and Transport are required", ErrInvalidConfig)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if la, ok := c.Transport.(LocalAddresser); ok && c.Local == (messages.DeviceAddress{}) {
		c.Local = la.LocalAddress()
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
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxUnpinnedPeers <= 0 {
		c.MaxUnpinnedPeers = DefaultMaxUnpinnedPeers
	}
	if c.MaxSkippedKeysPerDevice == 0 {
		c.MaxSkippedKeysPerDevice = DefaultMaxSkippedKeysPerDevice
	}
	if c.FailedDecryptBurst == 0 {
		c.FailedDecryptBurst = DefaultFailedDecryptBurst
	}
	if c.FailedDecryptRate <= 0 {
		c.FailedDecryptRate = DefaultFailedDecryptRate
	}
	if c.MaxPendingPerSender < 0 || c.MaxPending < 0 {
		return fmt.Errorf("%w: negative MaxPendingPerSender or MaxPending", ErrInvalidConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RepairInterval == 0 {
		c.RepairInterval = DefaultRepairInterval
	}
	return nil
}

// Received is what receiving one envelope did: Outcome Delivery (Message
// set: new or still pending, same sequence and receive time on every
// redelivery; New on first acceptance), AlreadyCommitted or
// AlreadyDiscarded (the ACK was sent again: AckSent), or Acknowledgement
// (Cleared: a pending outbound message was cleared).
type Received struct {
	Outcome inbound.Outcome
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	Message *inbound.ReceivedMessage
	New     bool
	Cleared bool
	AckSent bool
	// SessionReplaced: the envelope was a fresh initiation from the
	// peer's pinned identity that replaced the current session (the peer
	// reset or repaired it). Messages still pending to the peer were
	// encrypted on the old session, which the peer may no longer hold:
	// send them again (the device layer does).
	SessionReplaced bool
	// UnknownAck: an ACK of an id this device neither holds pending nor
	// remembers retiring (persistence.RetiredOutbound). The recipient
	// finalized a message this store no longer knows it sent: one a
	// rolled-back (restored) store lost (docs/delivery.md).
	UnknownAck bool

	// HeldSent: a held receipt answered this copy of a pending message
	// and was handed to the transport (docs/protocol.md, "Held receipt").
	HeldSent bool
	// Receipt is, for a held receipt (Outcome inbound.OutcomeHeld), what
	// it resolved to against the pending sent message it names.
	Receipt outbound.ReceiptVerdict

	ack    *handoff // the ACK (or held receipt: held) to hand over (sent again for a finalized copy)
	repair *handoff // a repair initiation to hand over (repair.go), also on error
}

// handoff is an envelope whose writes are durable, to be handed to the
// transport by the caller's goroutine — never by the committer's (unless
// the transport only queues: OrderedTransport): a transport may deliver
// synchronously into another device, whose ACK then comes back through
// this store's committer.
type handoff struct {
	env  []byte
	err  error // the ACK could not be encrypted
	held bool  // a held receipt, not an ACK (OnAck is not told)
}

// Finalized is the result of a commit or discard: COMMITTED, DISCARDED,
// ALREADY_COMMITTED or ALREADY_DISCARDED, and whether the ACK was handed
// to the transport (an ACK failure never undoes the finalization).
type Finalized struct {
	Outcome inbound.Outcome
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	AckSent bool

	ack *handoff
}

// Sent is the result of SendMessage: the stored pending message, and
// HandOff, the error of its encryption or of the hand-off to the transport
// (nil: handed over). With HandOff set the message is pending all the same.
type Sent struct {
	Message outbound.SentMessage
	HandOff error

	env []byte // the envelope to hand over
}

// Manager owns the local device's delivery plane state: one peer actor
// per remote device, spawned on demand on its actor system, and the
// store's committer. All methods are safe for concurrent use and honour
// their context (a request whose context ended before its actor reached
// it changes nothing; one whose writes were handed to the committer
// completes, and its caller gets ctx.Err()).
type Manager struct {
	cfg       Config
	sys       *actor.ActorSystem
	local     ratchet.Identity
	pub       ratchet.IdentityPublic
	self      messages.DeviceAddress // Config.Local
	committer *actor.PID
	budgets   budgets
	// ordered is Config.Transport when it is an OrderedTransport: then
	// envelopes are handed over from the committer's replier goroutine, in chain
	// order (handOffSent, handOffAck); nil: from the callers' goroutines.
	ordered OrderedTransport

	// repairs rate-limits session repairs per peer (repair.go).
	repairs repairLimiter
	// freshened holds the peers re-initiated since Open under
	// Config.Restored, or since the last MarkRestored (repair.go).
	freshened peerSet
	// restored is Config.Restored, or set later by MarkRestored.
	restored atomic.Bool
	// abandoned remembers the body digests of abandoned outbound ids
	// (Abandon, SendMessage: ErrLogicalIDReused).
	abandoned abandonedIDs

	mu        sync.Mutex
	peers     map[messages.DeviceAddress]*peerEntry
	unpinned  int // live entries with unpinned set (Config.MaxUnpinnedPeers)
	closed    bool
	closing   chan struct{}
	refreshMu sync.Mutex
	refresh   *time.Timer

	// prekeyCache is the prekey store updatePrekeys last read or wrote,
	// with its encoding; touched only on the committer's goroutine. A
	// stored encoding equal to raw decodes to ps, so a run of bundle
	// requests decodes once (decoding builds key objects: an X25519
	// multiplication per signed prekey, an ML-KEM expansion per KEM key).
	prekeyCache struct {
		raw []byte
		ps  ratchet.PrekeyStore
	}
}

// managerCache is the Manager as the committer's cache: the decoded prekey
// store (about 17 KiB) is dropped when the committer goes idle.
type managerCache Manager

func (c *managerCache) held() bool { return c.prekeyCache.raw != nil }
func (c *managerCache) drop()      { c.prekeyCache.raw, c.prekeyCache.ps = nil, ratchet.PrekeyStore{} }

// peerEntry is the routing entry of one live peer actor. pending counts
// requests sent to it and not yet processed; the actor passivates only
// when it is zero (under Manager.mu), so no request reaches a stopped actor.
type peerEntry struct {
	pid     *actor.PID
	pending int
	// unpinned: spawned for an envelope from an address not known to hold
	// a pin or a session (counted in Manager.unpinned until its actor
	// finds or makes one durable, or stops).
	unpinned bool
}

// NewManager loads the local identity and prekey store from cfg.Store,
// creating and persisting them on first use (a read transaction only when
// they exist and the prekey schedule is unchanged), and starts the
// committer (and the prekey refresh schedule) on sys.
func NewManager(ctx context.Context, sys *actor.ActorSystem, cfg Config) (*Manager, error) {
	if sys == nil {
		return nil, fmt.Errorf("%w: nil actor system", ErrInvalidConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, sys: sys, peers: make(map[messages.DeviceAddress]*peerEntry), closing: make(chan struct{}), self: cfg.Local}
	m.restored.Store(cfg.Restored)
	m.budgets.rate, m.budgets.burst = cfg.FailedDecryptRate, cfg.FailedDecryptBurst
	m.ordered, _ = cfg.Transport.(OrderedTransport)
	// ready reports whether the stored identity and prekeys are usable as
	// they are (loading the identity).
	ready := func(r persistence.DeliveryReader) (bool, error) {
		idRaw, hasID, err := r.LocalIdentity()
		if err != nil {
			return false, err
		}
		pkRaw, hasPK, err := r.Prekeys()
		if err != nil {
			return false, err
		}
		switch {
		case hasID != hasPK:
			return false, ErrNoIdentity
		case !hasID:
			return false, nil
		}
		if m.local, err = ratchet.UnmarshalIdentity(idRaw); err != nil {
			return false, corrupt("local identity", err)
		}
		ps, err := ratchet.UnmarshalPrekeyStore(pkRaw)
		if err != nil {
			return false, corrupt("prekeys", err)
		}
		return ps.Config() == cfg.Prekeys, nil
	}
	var ok bool
	err := cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		ok, err = ready(r)
		return err
	})
	if err == nil && !ok {
		err = cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error { return m.initStore(tx) })
	}
	if err != nil {
		return nil, fmt.Errorf("session: start: %w", err)
	}
	m.pub = m.local.Public()
	m.committer = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &committer{store: cfg.Store, maxBatch: cfg.MaxBatch, observe: cfg.Observe, logger: cfg.Logger, maxSkipped: max(cfg.MaxSkippedKeysPerDevice, 0), cache: (*managerCache)(m)}
	}, cfg.Mailboxes.Option("delivery_committer"), mailbox.Pooled()))
	if cfg.RefreshInterval > 0 {
		m.scheduledRefresh()
		m.armRefresh(cfg.RefreshInterval)
	}
	return m, nil
}

// initStore creates the identity and prekeys (first use) or applies a new
// prekey schedule to the stored prekeys, inside tx.
func (m *Manager) initStore(tx persistence.DeliveryTx) error {
	cfg := m.cfg
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
		m.scheduledRefresh()
		m.armRefresh(interval)
	})
}

func (m *Manager) scheduledRefresh() {
	_ = m.updatePrekeys(func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error) {
		return ps.Refresh(m.local, m.cfg.Now())
	}, func(_ bool, err error) {
		if err != nil && !errors.Is(err, ErrClosed) {
			m.cfg.Logger.Warn("session: scheduled prekey refresh failed", "err", err)
		}
	})
}

// submit hands an item to the committer.
func (m *Manager) submit(it *item) { m.sys.Root.Send(m.committer, it) }

// submitOwn submits an item that belongs to no peer (prekeys, prune),
// refused after Close.
func (m *Manager) submitOwn(it *item) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.submit(it)
	return nil
}

// updatePrekeys runs fn on the stored prekey store inside a committer
// transaction (the prekey store is one record shared by every peer: its
// read-modify-writes, like a one-time prekey consumption, serialize in the
// committer) and persists the result when fn reports a change. done gets
// whether it changed, after the transaction is durable.
func (m *Manager) updatePrekeys(fn func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error), done func(bool, error)) error {
	var changed bool
	return m.submitOwn(&item{
		apply: func(tx persistence.DeliveryTx, _ *Stats) error {
			changed = false
			raw, ok, err := tx.Prekeys()
			if err != nil {
				return err
			}
			if !ok {
				return ErrNoIdentity
			}
			c := &m.prekeyCache
			ps := c.ps
			if c.raw == nil || !bytes.Equal(c.raw, raw) {
				if ps, err = ratchet.UnmarshalPrekeyStore(raw); err != nil {
					return corrupt("prekeys", err)
				}
				c.raw, c.ps = bytes.Clone(raw), ps
			}
			next, ch, err := fn(ps)
			if err != nil || !ch {
				return err
			}
			changed = true
			b, err := ratchet.MarshalPrekeyStore(next)
			if err != nil {
				return err
			}
			if err := tx.PutPrekeys(b); err != nil {
				return err
			}
			c.raw, c.ps = b, next
			return nil
		},
		done: func(err error) { done(changed && err == nil, err) },
	})
}

// Identity returns the local device's public identity.
func (m *Manager) Identity() ratchet.IdentityPublic { return m.pub }

// Bundle issues a prekey bundle for one initiator (a fresh one-time prekey
// when one is left), after applying the prekey schedule; the prekey store
// is persisted before the bundle is returned.
func (m *Manager) Bundle(ctx context.Context) (*messages.PrekeyBundle, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out messages.PrekeyBundle
	reply := make(chan error, 1)
	err := m.updatePrekeys(func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error) {
		now := m.cfg.Now()
		ps, _, err := ps.Refresh(m.local, now)
		if err != nil {
			return ps, false, err
		}
		// Stamped: the one-time prekey stays at least MinIssuedAge, so
		// later requests cannot push out an initiation in flight.
		ps, out, err = ps.IssueBundleAt(m.pub, now)
		return ps, true, err
	}, func(_ bool, err error) { reply <- err })
	if err != nil {
		return nil, err
	}
	if err, werr := await(ctx, reply); werr != nil {
		return nil, werr
	} else if err != nil {
		return nil, fmt.Errorf("session: bundle: %w", err)
	}
	return &out, nil
}

// RefreshPrekeys applies the prekey schedule now (rotation of the signed
// prekeys, expiry after the grace period, one-time replenishment) and
// reports whether the store changed.
func (m *Manager) RefreshPrekeys(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	type res struct {
		changed bool
		err     error
	}
	reply := make(chan res, 1)
	err := m.updatePrekeys(func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error) {
		return ps.Refresh(m.local, m.cfg.Now())
	}, func(changed bool, err error) { reply <- res{changed, err} })
	if err != nil {
		return false, err
	}
	r, err := await(ctx, reply)
	if err != nil {
		return false, err
	}
	if r.err != nil {
		return false, fmt.Errorf("session: refresh prekeys: %w", r.err)
	}
	return r.changed, nil
}

// Prune removes the processed entries older than policy allows
// (inbound.PruneCutoff at the clock's now) and returns how many it
// removed; the retired outbound entries older than the same cutoff go
// with them. Pending messages are never pruned; nothing prunes implicitly.
func (m *Manager) Prune(ctx context.Context, policy inbound.RetentionPolicy) (int, error) {
	cutoff, prune, err := inbound.PruneCutoff(persistence.UnixMilli(m.cfg.Now()), policy)
	if err != nil || !prune {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var n int
	reply := make(chan error, 1)
	if err := m.submitOwn(&item{
		apply: func(tx persistence.DeliveryTx, st *Stats) error {
			var err error
			if n, err = tx.PruneProcessedInbound(cutoff); err != nil {
				return err
			}
			// The sender's memory of retired ids follows the receiver's
			// retention: past it a late ACK or retry is not expected.
			if _, err := tx.PruneRetiredOutbound(cutoff); err != nil {
				return err
			}
			st.Pruned += n
			return nil
		},
		done: func(err error) { reply <- err },
	}); err != nil {
		return 0, err
	}
	if err, werr := await(ctx, reply); werr != nil {
		return 0, werr
	} else if err != nil {
		return 0, fmt.Errorf("session: prune: %w", err)
	}
	return n, nil
}

// CountDeliveries records one more hand-off to the application of each
// pending message of ms, in one committer transaction (a page of messages
// redelivered from the store), and returns ms with Deliveries set to the
// new persisted counts, without those no longer pending (finalized
// meanwhile: there is nothing to hand over).
func (m *Manager) CountDeliveries(ctx context.Context, ms []inbound.ReceivedMessage) ([]inbound.ReceivedMessage, error) {
	if len(ms) == 0 {
		return ms, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []inbound.ReceivedMessage
	reply := make(chan error, 1)
	if err := m.submitOwn(&item{
		apply: func(tx persistence.DeliveryTx, _ *Stats) error {
			out = out[:0]
			for _, msg := range ms {
				n, err := tx.CountInboundDelivery(msg.Sender, msg.ID)
				if errors.Is(err, persistence.ErrNotFound) {
					continue
				}
				if err != nil {
					return err
				}
				msg.Deliveries = int(n)
				out = append(out, msg)
			}
			return nil
		},
		done: func(err error) { reply <- err },
	}); err != nil {
		return nil, err
	}
	if err, werr := await(ctx, reply); werr != nil {
		return nil, werr
	} else if err != nil {
		return nil, fmt.Errorf("session: count deliveries: %w", err)
	}
	return out, nil
}

// call routes a request to peer's actor and waits for its reply.
func call[T any](ctx context.Context, m *Manager, peer messages.DeviceAddress, mk func(reply func(T, error)) request) (T, error) {
	return callVia(ctx, m, peer, mk, func(r request) error { return m.route(peer, r) })
}

// callInbound is call for an envelope from peer (routeInbound).
func callInbound[T any](ctx context.Context, m *Manager, peer messages.DeviceAddress, mk func(reply func(T, error)) request) (T, error) {
	return callVia(ctx, m, peer, mk, func(r request) error { return m.routeInbound(ctx, peer, r) })
}

func callVia[T any](ctx context.Context, m *Manager, peer messages.DeviceAddress, mk func(reply func(T, error)) request, route func(request) error) (T, error) {
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	var zero T
	if err := route(mk(func(v T, err error) { ch <- res{v, err} })); err != nil {
		return zero, err
	}
	r, err := await(ctx, ch)
	if err != nil {
		return zero, err
	}
	return r.v, r.err
}

// Encrypt encrypts plaintext for peer and returns the envelope to send.
// Without a session it fetches peer's bundle, verifies it, checks it
// against the pinned identity (pinning it on first contact) and initiates
// one. The advanced session is persisted before the envelope is returned.
func (m *Manager) Encrypt(ctx context.Context, peer messages.DeviceAddress, plaintext []byte) ([]byte, error) {
	return call(ctx, m, peer, func(reply func([]byte, error)) request {
		return &encryptReq{ctx: ctx, plaintext: plaintext, reply: reply}
	})
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

// Decrypt opens envelope from peer and persists the new session state
// before returning the plaintext. On error nothing changed.
func (m *Manager) Decrypt(ctx context.Context, peer messages.DeviceAddress, envelope []byte) ([]byte, error) {
	return callInbound(ctx, m, peer, func(reply func([]byte, error)) request {
		return &decryptReq{ctx: ctx, envelope: envelope, reply: reply}
	})
}

// Receive handles one envelope from peer (docs/protocol.md (commit boundary),
// "Transactions", Receive): decrypt, decode the SecurePayload frame, decide
// (inbound.DecideReceive, or DecideAck for an ACK), then ONE transaction
// writes the ratchet step with the pending row (or clears the pending sent
// message an ACK names). On any error nothing changed and the ratchet step
// rolled back. A Delivery is returned only after the commit and is never
// ACKed; a copy of a finalized message is ACKed again.
func (m *Manager) Receive(ctx context.Context, peer messages.DeviceAddress, envelope []byte) (Received, error) {
	r, err := callInbound(ctx, m, peer, func(reply func(Received, error)) request {
		return &receiveReq{ctx: ctx, envelope: envelope, reply: reply}
	})
	if r.repair != nil {
		m.handRepair(ctx, peer, r.repair)
		r.repair = nil
	}
	if err == nil && r.ack != nil {
		m.handReply(ctx, peer, &r)
	}
	return r, err
}

// handReply hands r's ACK or held receipt to the transport and records
// how that went.
func (m *Manager) handReply(ctx context.Context, peer messages.DeviceAddress, r *Received) {
	h := r.ack
	r.ack = nil
	if h.held {
		r.HeldSent = m.handHeld(ctx, peer, r.ID, h)
		return
	}
	r.AckSent = m.handAck(ctx, peer, r.ID, h)
}

// ReceiveAsync is Receive without the wait: it queues the envelope on
// peer's actor and returns; done is called once, from the committer's
// replier goroutine (or the actor's, on an error before any write), when the
// result is known. Envelopes of one peer queued by one goroutine are
// decided in that order, and their writes share transactions: this is how
// a transport pipelines a link. done must not block.
func (m *Manager) ReceiveAsync(ctx context.Context, peer messages.DeviceAddress, envelope []byte, done func(Received, error)) error {
	return m.routeInbound(ctx, peer, &receiveReq{ctx: ctx, envelope: envelope, reply: func(r Received, err error) {
		if r.repair != nil {
			// Off the committer's replier goroutine, as an ACK.
			h := r.repair
			r.repair = nil
			go m.handRepair(context.WithoutCancel(ctx), peer, h)
		}
		if err != nil || r.ack == nil {
			done(r, err)
			return
		}
		// A copy of a finalized message: the ACK is handed over off the
		// committer's replier goroutine (the transport may deliver
		// synchronously).
		go func() {
			m.handReply(ctx, peer, &r)
			done(r, nil)
		}()
	}})
}

// Finalize commits (persistence.FinalizationCommitted, reason 0) or
// discards the message (peer, id): the pending entry is removed, the
// processed entry written and the ACK's ratchet step persisted in one
// transaction; the ACK is handed to the transport after it is durable
// (Finalized.AckSent). An id neither pending nor finalized is
// inbound.ErrReceivedMessageNotPending and changes nothing.
func (m *Manager) Finalize(ctx context.Context, peer messages.DeviceAddress, id messages.LogicalMessageID, fin persistence.Finalization, reason persistence.DiscardReason) (Finalized, error) {
	r, err := call(ctx, m, peer, func(reply func(Finalized, error)) request {
		return &finalizeReq{ctx: ctx, id: id, fin: fin, reason: reason, reply: reply}
	})
	if err == nil && r.ack != nil {
		r.AckSent, r.ack = m.handAck(ctx, peer, id, r.ack), nil
	}
	return r, err
}

// SendMessage stores body as a pending outbound message to peer under id
// and encrypts it, in one transaction, then hands the envelope to the
// transport. outbound.ErrAlreadyPending when (peer, id) is pending. When
// the encryption or the hand-off failed the message is stored all the
// same (Sent.HandOff).
func (m *Manager) SendMessage(ctx context.Context, peer messages.DeviceAddress, id messages.LogicalMessageID, body []byte) (Sent, error) {
	r, err := call(ctx, m, peer, func(reply func(Sent, error)) request {
		return &sendReq{ctx: ctx, id: id, body: body, reply: reply}
	})
	return m.handSent(ctx, peer, r, err)
}

// handSent hands a durable envelope of SendMessage or Resend over.
func (m *Manager) handSent(ctx context.Context, peer messages.DeviceAddress, r Sent, err error) (Sent, error) {
	if err != nil || r.env == nil {
		return r, err
	}
	if err := m.cfg.Transport.Send(ctx, peer, r.env); err != nil {
		r.HandOff = fmt.Errorf("session: send to %s: %w", peer, err)
	}
	r.env = nil
	return r, nil
}

// Resend re-encrypts the pending outbound message (peer, id) under the
// current ratchet state (a fresh encryption) and records the attempt in
// the same transaction, then hands it to the transport.
// outbound.ErrNotPending when it is not pending.
func (m *Manager) Resend(ctx context.Context, peer messages.DeviceAddress, id messages.LogicalMessageID) (Sent, error) {
	r, err := call(ctx, m, peer, func(reply func(Sent, error)) request {
		return &sendReq{ctx: ctx, id: id, resend: true, reply: reply}
	})
	return m.handSent(ctx, peer, r, err)
}

// Abandon removes the pending outbound message (peer, id) and reports
// whether it was pending.
func (m *Manager) Abandon(ctx context.Context, peer messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	return call(ctx, m, peer, func(reply func(bool, error)) request {
		return &abandonReq{ctx: ctx, id: id, reply: reply}
	})
}

// handAck hands an ACK envelope (encrypted by a peer actor, its ratchet
// step now durable) to the transport and reports success.
func (m *Manager) handAck(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID, h *handoff) bool {
	return m.ackVia(to, id, h, func(env []byte) error { return m.cfg.Transport.Send(ctx, to, env) })
}

// handOffSent is called by a send's item once it is durable, on the
// committer's replier goroutine: with an OrderedTransport the envelope is queued
// now, in chain order, and r.HandOff says how that went; otherwise r keeps
// it for handSent on the caller's goroutine.
func (m *Manager) handOffSent(to messages.DeviceAddress, r Sent) Sent {
	if m.ordered == nil || r.env == nil {
		return r
	}
	if err := m.ordered.Enqueue(to, r.env); err != nil {
		r.HandOff = fmt.Errorf("session: send to %s: %w", to, err)
	}
	r.env = nil
	return r
}

// handOffAck is handOffSent for an ACK (encryption error ackErr): with an
// OrderedTransport it is queued now and the result says whether it was
// (AckSent); otherwise the returned handoff goes to handAck on the
// caller's goroutine.
func (m *Manager) handOffAck(to messages.DeviceAddress, id messages.LogicalMessageID, env []byte, ackErr error) (bool, *handoff) {
	h := &handoff{env: env, err: ackErr}
	if m.ordered == nil {
		return false, h
	}
	return m.ackVia(to, id, h, func(env []byte) error { return m.ordered.Enqueue(to, env) }), nil
}

// handOffHeld is handOffAck for a held receipt (OnHeld is told, not
// OnAck).
func (m *Manager) handOffHeld(to messages.DeviceAddress, id messages.LogicalMessageID, env []byte, encErr error) (bool, *handoff) {
	h := &handoff{env: env, err: encErr, held: true}
	if m.ordered == nil {
		return false, h
	}
	return m.heldVia(to, id, h, func(env []byte) error { return m.ordered.Enqueue(to, env) }), nil
}

// handHeld hands a held receipt's envelope to the transport and reports
// success.
func (m *Manager) handHeld(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID, h *handoff) bool {
	return m.heldVia(to, id, h, func(env []byte) error { return m.cfg.Transport.Send(ctx, to, env) })
}

// heldVia hands a held receipt over with send, tells OnHeld and reports
// success. A receipt that could not be encrypted or handed over only
// leaves the sender on its short schedule.
func (m *Manager) heldVia(to messages.DeviceAddress, id messages.LogicalMessageID, h *handoff, send func([]byte) error) bool {
	err := h.err
	if err == nil {
		if err = send(h.env); err != nil {
			err = fmt.Errorf("session: send held receipt to %s: %w", to, err)
		}
	}
	if m.cfg.OnHeld != nil {
		m.cfg.OnHeld(to, id, err)
	}
	return err == nil
}

// ackVia hands h over with send, tells OnAck and reports success.
func (m *Manager) ackVia(to messages.DeviceAddress, id messages.LogicalMessageID, h *handoff, send func([]byte) error) bool {
	err := h.err
	if err == nil {
		if err = send(h.env); err != nil {
			err = fmt.Errorf("session: send ACK to %s: %w", to, err)
		}
	}
	if m.cfg.OnAck != nil {
		m.cfg.OnAck(to, id, err)
	}
	return err == nil
}

// AcceptIdentity pins identity for peer (the application accepted a
// changed identity). A stored session with another identity is deleted,
// so the next Encrypt fetches a new bundle and the next initiation from
// identity is accepted.
func (m *Manager) AcceptIdentity(ctx context.Context, peer messages.DeviceAddress, identity ratchet.IdentityPublic) error {
	_, err := call(ctx, m, peer, func(reply func(struct{}, error)) request {
		return &acceptReq{ctx: ctx, identity: identity, reply: func(err error) { reply(struct{}{}, err) }}
	})
	return err
}

// MarkRestored tells the manager, while it runs, what Config.Restored
// tells it at start: evidence found since (a peer holds events of this
// node that its store lacks) says the store is an older copy, so every
// stored session may be behind its peer's. The next encryption to each
// peer starts a fresh initiation (RepairRestored), also for peers
// re-initiated before.
func (m *Manager) MarkRestored() {
	m.freshened.clear()
	m.restored.Store(true)
}

// ResetSession deletes the session with peer (the pin is kept), so the
// next Encrypt starts a new session from a fresh bundle.
func (m *Manager) ResetSession(ctx context.Context, peer messages.DeviceAddress) error {
	_, err := call(ctx, m, peer, func(reply func(struct{}, error)) request {
		return &resetReq{ctx: ctx, reply: func(err error) { reply(struct{}{}, err) }}
	})
	return err
}

// Warm spawns peer's actor (if it is not live) and loads its state from
// the store, without any other effect.
func (m *Manager) Warm(ctx context.Context, peer messages.DeviceAddress) error {
	_, err := call(ctx, m, peer, func(reply func(struct{}, error)) request {
		return &warmReq{ctx: ctx, reply: func(err error) { reply(struct{}{}, err) }}
	})
	return err
}

// LiveSessions returns how many peer actors are live (not passivated).
func (m *Manager) LiveSessions() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.peers)
}

// Close stops every peer actor after the requests already queued were
// decided, then the committer after it wrote what they handed it (every
// caller is answered). It does not close the store. Other calls after
// Close return ErrClosed; Close itself is idempotent (a second call
// returns nil).
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.closing)
	pids := make([]*actor.PID, 0, len(m.peers))
	for _, e := range m.peers {
		pids = append(pids, e.pid)
	}
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
	// Every item of the stopped actors is in the committer's mailbox,
	// ahead of the pill.
	_ = m.sys.Root.PoisonFuture(m.committer).Wait()
	return nil
}

// route sends msg to peer's actor, spawning it when it is not live.
func (m *Manager) route(peer messages.DeviceAddress, msg request) error {
	return m.routeAs(peer, msg, routeLocal)
}

// How an entry a request spawns is counted against MaxUnpinnedPeers.
const (
	routeLocal         = iota // a local operation: never refused, not counted
	routeInboundNew           // an envelope from an address not known to hold anything
	routeInboundPinned        // an envelope from an address with a stored pin or session
)

// errUnpinnedCap: routeAs would spawn an unpinned entry past the cap; the
// caller checks the store before refusing.
var errUnpinnedCap = errors.New("session: unpinned cap reached")

// routeInbound routes an envelope's request from peer. A new entry for an
// address with no stored pin or session counts against MaxUnpinnedPeers;
// past it the envelope is refused (ErrTooManyUnpinned, an undecryptable
// notice, nothing kept), so spoofed addresses cannot make the device hold
// more than the cap of peer actors at once. A pinned
// peer's envelope is never refused by the cap.
func (m *Manager) routeInbound(ctx context.Context, peer messages.DeviceAddress, msg request) error {
	err := m.routeAs(peer, msg, routeInboundNew)
	if !errors.Is(err, errUnpinnedCap) {
		return err
	}
	var known bool
	if err := m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		_, hasSession, err := r.Session(peer)
		if err != nil {
			return err
		}
		_, pinned, err := r.Pin(peer)
		known = hasSession || pinned
		return err
	}); err != nil {
		return wrapPeer("load", peer, err)
	}
	if !known {
		err := fmt.Errorf("%w: %d addresses without a pin are being served; refused %s", ErrTooManyUnpinned, m.cfg.MaxUnpinnedPeers, peer)
		if f := m.cfg.OnUndecryptable; f != nil {
			f(peer, ReasonUnpinnedLimit, err)
		}
		return err
	}
	return m.routeAs(peer, msg, routeInboundPinned)
}

// knownPeer marks e as holding a durable pin or session: it no longer
// counts against MaxUnpinnedPeers.
func (m *Manager) knownPeer(e *peerEntry) {
	m.mu.Lock()
	if e.unpinned {
		e.unpinned = false
		m.unpinned--
	}
	m.mu.Unlock()
}

func (m *Manager) routeAs(peer messages.DeviceAddress, msg request, how int) error {
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
		if how == routeInboundNew && m.unpinned >= m.cfg.MaxUnpinnedPeers {
			return errUnpinnedCap
		}
		e = &peerEntry{unpinned: how == routeInboundNew}
		if e.unpinned {
			m.unpinned++
		}
		a := &peerActor{m: m, peer: peer, entry: e}
		e.pid = m.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }, m.cfg.Mailboxes.Option("session"), mailbox.Pooled()))
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
	if e.unpinned {
		e.unpinned = false
		m.unpinned--
	}
	return true
}

// await waits for one reply or the context. A reply that is already
// there wins over a context that ended meanwhile (select would pick
// either at random): the caller learns what its durable writes did.
func await[T any](ctx context.Context, ch <-chan T) (T, error) {
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		select {
		case r := <-ch:
			return r, nil
		default:
		}
		var zero T
		return zero, ctx.Err()
	}
}
