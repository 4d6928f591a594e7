// Package device is the delivery plane's facade for one local device: it
// wires the peer-session layer (actors/session), the inbound store
// (actors/inbound: the commit boundary, docs/protocol.md) and the
// outbound store (actors/outbound) over one persistence.DeliveryStore and
// a transport, and is what the runtime embeds.
//
// Sending: Send stores the message as pending outbound (durably, before
// the hand-off), encrypts it and hands it to the transport; it stays
// pending until the recipient's ACK arrives (PendingSentMessages, Resend,
// Abandon; an opt-in retry schedule).
//
// Receiving: the transport calls Receive for each envelope; the ratchet
// step and the pending row are written in one transaction; the
// application gets each pending message (Config.Handler, Messages, or by
// paging PendingReceivedMessages), applies it idempotently keyed by
// (sender, id) in its own transaction, then calls CommitReceivedMessage —
// or DiscardReceivedMessage for a message it can never apply. Only then
// is the ACK sent. Pending messages persisted before a crash are delivered
// again on Open.
package device

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Types shared with the stores, re-exported so applications import one
// package.
type (
	// ReceivedMessage is a message pending application commit.
	ReceivedMessage = inbound.ReceivedMessage
	// PendingPage is one page of pending received messages (at most
	// MaxPageSize; Next is the cursor = the last sequence seen).
	PendingPage = inbound.Page
	// RetentionPolicy is the processed-ID retention of
	// PruneProcessedMessages (MaxAge > 0; inbound.RetentionInfinite keeps all).
	RetentionPolicy = inbound.RetentionPolicy
	// Outcome is the kind of a ReceiveResult or the status of a
	// CommitResult.
	Outcome = inbound.Outcome
	// SentMessage is a pending outbound message.
	SentMessage = outbound.SentMessage
	// SentPage is one page of pending outbound messages.
	SentPage = outbound.SentPage
	// RetryPolicy is the opt-in outbound retry schedule.
	RetryPolicy = outbound.RetryPolicy
	// DiscardReason is the closed set of discard reasons.
	DiscardReason = persistence.DiscardReason
	// ProcessedMessage is the processed entry of a finalized message
	// (finalization, time, digest, discard reason), readable locally.
	ProcessedMessage = persistence.ProcessedInbound
)

// Outcomes (ReceiveResult.Kind, CommitResult.Status).
const (
	Delivery         = inbound.OutcomeDelivery
	AlreadyCommitted = inbound.OutcomeAlreadyCommitted
	AlreadyDiscarded = inbound.OutcomeAlreadyDiscarded
	Acknowledgement  = inbound.OutcomeAcknowledgement
	Committed        = inbound.OutcomeCommitted
	Discarded        = inbound.OutcomeDiscarded
	// Held is the Kind of a held receipt from the recipient of a sent
	// message (docs/protocol.md, "Held receipt"): not an ACK.
	Held = inbound.OutcomeHeld
)

// MaxPageSize is the largest page PendingReceivedMessages and
// PendingSentMessages return.
const MaxPageSize = inbound.MaxPageSize

// RetentionInfinite keeps every processed entry.
const RetentionInfinite = inbound.RetentionInfinite

// ReceiveResult is the result of Receive: Kind Delivery (Message set: new
// or still pending, same sequence and receive time on every redelivery),
// AlreadyCommitted or AlreadyDiscarded (AckSent: whether the ACK was sent
// again), or Acknowledgement (Cleared: whether a pending sent message was
// cleared).
type ReceiveResult struct {
	Kind    Outcome
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	Message *ReceivedMessage
	AckSent bool
	Cleared bool
	// SessionReplaced: the envelope was a fresh initiation from the
	// sender's pinned identity that replaced the current session (the
	// sender reset or repaired it). The messages pending to the sender
	// were sent again on the new session (Resent of them; the ones that
	// could not be are retried by Retry or a later Resend).
	SessionReplaced bool
	Resent          int
	// HeldSent: this copy of a still-pending message was answered with a
	// held receipt, handed to the transport.
	HeldSent bool
	// Held: a held receipt (Kind Held) named a pending sent message and
	// the digest of its body: the retry schedule now sends it again only
	// after Retry.HeldInterval. False for a receipt naming nothing
	// pending or another body (ignored, counted).
	Held bool
	// UnknownAck (an Acknowledgement): the recipient finalized ID, a
	// message this device neither holds pending nor remembers sending —
	// one its store lost when it was rolled back to an older copy. It was
	// delivered: do not send it again. Reported once per id.
	UnknownAck bool
}

// CommitResult is the result of a commit or discard: Status COMMITTED,
// DISCARDED, ALREADY_COMMITTED or ALREADY_DISCARDED, and whether the ACK
// was handed to the transport (an ACK failure never undoes the commit).
type CommitResult struct {
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	Status  Outcome
	AckSent bool
}

// PruneSchedule is the opt-in processed-ID prune schedule (nothing prunes
// implicitly otherwise).
type PruneSchedule struct {
	// Interval between prunes; 0: off.
	Interval time.Duration
	// Policy applied at each prune (MaxAge > 0).
	Policy RetentionPolicy
}

// Config configures a Device. Store and Transport are required.
type Config struct {
	// Store holds sessions, prekeys and the commit-boundary records. The
	// Device does not close it.
	Store persistence.DeliveryStore
	// Transport fetches bundles and carries envelopes to peers.
	Transport session.Transport
	// Address is this device's address (session.Config.Local): signed
	// into its initiations and required of the initiations it accepts.
	// Zero: the Transport's, when it implements session.LocalAddresser.
	Address messages.DeviceAddress
	// Now is the client wall clock (receive, commit and prune times);
	// nil: time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Session tweaks the session.Config (ratchet limits, prekey schedule,
	// timeouts) before the manager starts; Store, Transport, Now, Logger,
	// the limits and the hooks are set by the Device.
	Session func(*session.Config)
	// MaxPendingPerSender caps one sender's pending messages; past it new
	// messages are refused before their ratchet step is persisted
	// (inbound.ErrSenderBacklogFull). 0: no cap.
	MaxPendingPerSender int
	// MaxPending caps the pending messages of all senders together (the
	// global cap beside MaxPendingPerSender); past it a new message is
	// refused before its ratchet step is persisted
	// (inbound.ErrBacklogFull; the sender keeps it pending and retries).
	// 0: no cap.
	MaxPending int
	// MaxQueued and MaxQueuedBytes bound the in-memory delivery queue
	// between the store and Handler / Messages: past either, deliveries
	// are not queued and the dispatcher pages them from the store once
	// the queue drained (nothing is lost: a delivery is durable before it
	// is queued). Copies of one pending message (sender retries) are
	// queued once. 0: DefaultMaxQueued, DefaultMaxQueuedBytes.
	MaxQueued      int
	MaxQueuedBytes int
	// RedeliverAfter is how long after a message was handed to Handler /
	// Messages a copy of it (a sender's retry of a pending message) may
	// be handed again: a copy arriving sooner is dropped from the
	// delivery queue (the application holds the message already; the
	// receive still counts it). A message still pending is also handed
	// again on the next Open. 0: DefaultRedeliverAfter; < 0: every copy
	// is handed.
	RedeliverAfter time.Duration
	// MaxBatch bounds the items of one group commit of the store's
	// committer; 0: session.DefaultMaxBatch.
	MaxBatch int
	// Handler, when set, is called with every Delivery (new messages,
	// redeliveries on sender retries, and on Open every message still
	// pending), one at a time, in order, from a goroutine of the Device.
	Handler func(ctx context.Context, m ReceivedMessage)
	// Buffer > 0 enables Messages(): a channel of that capacity carrying
	// the same deliveries as Handler (used only when Handler is nil). The
	// channel holds at most one copy of a message: a copy arriving while
	// one is still in the channel is dropped, and RedeliverAfter counts
	// from when the application took the message from the channel (as
	// seen by the device: at the latest its next receive or hand-off), not
	// from when it was put in.
	Buffer int
	// Retry is the opt-in outbound retry schedule (zero: off).
	Retry RetryPolicy
	// OnRetryExhausted is told about each pending sent message that
	// reached Retry.MaxAttempts.
	OnRetryExhausted func(SentMessage)
	// Prune is the opt-in prune schedule (zero: off).
	Prune PruneSchedule
	// Mailboxes measures the device's actors' mailboxes (nil: not measured).
	Mailboxes *mailbox.Depths
	// OnUndecryptable, when set, is told about every envelope that could
	// not be decrypted, with its reason (session.Reason*); it is also
	// counted in syncmesh_delivery_undecryptable_envelopes_total. It must
	// not block.
	OnUndecryptable func(from messages.DeviceAddress, reason string, err error)
	// Restored says the store may be a restored or copied one (the
	// node's restore check suspected it, or the operator said so): the
	// first send to each peer starts a fresh session instead of using the
	// stored one, and every message still pending is sent again on it
	// after Open.
	Restored bool
	// OnSessionRepair, when set, is told about every step of a session
	// repair (step: RepairStarted, RepairFailed with err,
	// RepairSuppressed, RepairReplaced with how many pending messages
	// were sent again); each is also counted in
	// syncmesh_delivery_session_repairs_total{step}. It must not block.
	OnSessionRepair func(peer messages.DeviceAddress, step string, resent int, err error)
	// StaleAfter is how long a message may stay pending (received and not
	// committed or discarded, or sent and not acknowledged) before it is
	// reported (CheckPending, OnStale, syncmesh_delivery_stale_pending_total).
	// 0: DefaultStaleAfter; < 0: never.
	StaleAfter time.Duration
	// StaleCheckInterval is how often CheckPending runs on its own; 0:
	// StaleAfter / 4 (at least a second); < 0: only when called.
	StaleCheckInterval time.Duration
	// OnStale, when set, is told about each message found pending past
	// StaleAfter, once per process. It must not block.
	OnStale func(StalePending)
	// OnDropped, when set, is told about every envelope a transport could
	// not carry (a refused hand-off here, or a drop the transport reports
	// with Dropped); each is also counted in
	// syncmesh_delivery_envelopes_dropped_total. It must not block.
	OnDropped func(Dropped)
}

// Dropped is an envelope a transport could not carry (see
// messages.EnvelopeDropped for the fields).
type Dropped struct {
	Sent   bool
	Peer   messages.DeviceAddress
	ID     messages.LogicalMessageID
	Ack    bool
	Reason string
	Err    error
}

// Reasons of Dropped (a closed set: they label a metric).
const (
	// DropHandOff: this device's transport refused the hand-off.
	DropHandOff = "handoff"
	// DropLinkQueueFull: the receiving node's queue for the link was at
	// its bound.
	DropLinkQueueFull = "link_queue_full"
)

// dropped counts and reports one envelope a transport could not carry.
func (d *Device) dropped(x Dropped) {
	side := "received"
	if x.Sent {
		side = "sent"
	}
	d.metrics.dropped.WithLabelValues(side, x.Reason).Inc()
	d.cfg.Logger.Debug("device: envelope not carried by the transport (the message stays pending at its sender)",
		"side", side, "peer", x.Peer.String(), "reason", x.Reason, "ack", x.Ack, "err", x.Err)
	if d.cfg.OnDropped != nil {
		d.cfg.OnDropped(x)
	}
}

// Dropped is called by a transport that dropped an envelope from from
// before it reached this device (reason: DropLinkQueueFull): it is counted
// and reported like a refused hand-off, so no drop is silent.
func (d *Device) Dropped(from messages.DeviceAddress, reason string, err error) {
	if reason != DropLinkQueueFull {
		reason = DropHandOff
	}
	d.dropped(Dropped{Peer: from, Reason: reason, Err: err})
}

// Device is one local device's delivery plane. Methods are safe for
// concurrent use.
type Device struct {
	cfg      Config
	sessions *session.Manager
	out      *outbound.Outbox
	metrics  *metrics

	feed  chan ReceivedMessage // to the application (Messages); nil without Buffer
	queue *deliveryQueue
	// openBound: the last sequence pending before this Open's receives
	// began; the redelivery pass (dispatch) covers those only.
	openBound uint64
	stop      chan struct{}
	ctx       context.Context // cancelled by Close: ends a handler's wait
	cancel    context.CancelFunc
	loops     sync.WaitGroup
	mu        sync.Mutex
	closed    bool
	stopOnce  sync.Once

	opened atomic.Bool // Open finished: the retry schedule may run

	staleMu    sync.Mutex
	stale      map[staleKey]bool // reported by CheckPending and still pending
	staleTimer *time.Timer
}

// Open starts the device's actors on sys over cfg.Store: the session
// manager (creating the local identity on first use), the inbound and
// outbound stores, the optional schedules, and the delivery of every
// message still pending to Handler / Messages.
func Open(ctx context.Context, sys *actor.ActorSystem, cfg Config) (*Device, error) {
	if sys == nil || cfg.Store == nil || cfg.Transport == nil {
		return nil, fmt.Errorf("%w: actor system, Store and Transport are required", ErrInvalidConfig)
	}
	if cfg.Prune.Interval < 0 || (cfg.Prune.Interval > 0 && cfg.Prune.Policy.MaxAge <= 0) {
		return nil, fmt.Errorf("%w: prune schedule needs a positive interval and MaxAge", ErrInvalidConfig)
	}
	if cfg.Buffer < 0 || cfg.MaxPending < 0 || cfg.MaxQueued < 0 || cfg.MaxQueuedBytes < 0 {
		return nil, fmt.Errorf("%w: negative Buffer, MaxPending or queue bound", ErrInvalidConfig)
	}
	if cfg.MaxQueued == 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.MaxQueuedBytes == 0 {
		cfg.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("device: metrics: %w", err)
	}
	d := &Device{cfg: cfg, metrics: m, stop: make(chan struct{}), stale: map[staleKey]bool{}}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if cfg.Handler != nil || cfg.Buffer > 0 {
		if cfg.Handler == nil {
			d.feed = make(chan ReceivedMessage, cfg.Buffer)
		}
		// The dispatcher runs only while there is something to hand over
		// (an idle device costs no goroutine); it starts at the end of
		// Open with the messages still pending from before.
		d.queue = newDeliveryQueue(cfg.MaxQueued, cfg.MaxQueuedBytes, func() { d.loops.Add(1); go d.dispatch(false) })
		d.queue.now, d.queue.redeliverAfter, d.queue.feed = cfg.Now, cfg.RedeliverAfter, d.feed
		if d.queue.redeliverAfter == 0 {
			d.queue.redeliverAfter = DefaultRedeliverAfter
		}
		d.queue.running = true
	}
	scfg := session.Config{}
	if cfg.Session != nil {
		cfg.Session(&scfg)
	}
	scfg.Store, scfg.Transport, scfg.Now, scfg.Logger, scfg.Mailboxes = cfg.Store, cfg.Transport, cfg.Now, cfg.Logger, cfg.Mailboxes
	if cfg.Address != (messages.DeviceAddress{}) {
		scfg.Local = cfg.Address
	}
	scfg.MaxPendingPerSender, scfg.MaxPending, scfg.MaxBatch, scfg.Observe, scfg.OnAck = cfg.MaxPendingPerSender, cfg.MaxPending, cfg.MaxBatch, d.observe, d.acked
	if d.queue != nil {
		scfg.OnDelivery = d.queue.push
	}
	scfg.OnRepair = func(peer messages.DeviceAddress, step string, err error) { d.repaired(peer, step, 0, err) }
	scfg.OnHeld = d.heldSent
	scfg.Restored = scfg.Restored || cfg.Restored
	scfg.OnUndecryptable = func(from messages.DeviceAddress, reason string, err error) {
		d.metrics.undecryptable.WithLabelValues(reason).Inc()
		if cfg.OnUndecryptable != nil {
			cfg.OnUndecryptable(from, reason, err)
		}
	}
	// The outbox first: the committer's first observation may wake its
	// schedule.
	d.out, err = outbound.New(outbound.Config{Store: cfg.Store, Now: cfg.Now, Retry: cfg.Retry, Logger: cfg.Logger,
		Resend:      func(ctx context.Context, sm SentMessage) error { return d.Resend(ctx, sm.Recipient, sm.ID) },
		OnExhausted: cfg.OnRetryExhausted})
	if err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	if d.queue != nil {
		// Before the session manager receives: a message received after
		// this point was counted by its receive and is queued by it, so the
		// redelivery pass must neither count it again nor hand it with
		// that count (sequences only grow, so one bound tells them apart).
		if d.openBound, err = d.lastPendingSequence(ctx); err != nil {
			_ = d.out.Close()
			return nil, fmt.Errorf("device: %w", err)
		}
	}
	if d.sessions, err = session.NewManager(ctx, sys, scfg); err != nil {
		_ = d.out.Close()
		return nil, fmt.Errorf("device: %w", err)
	}
	if err := d.refreshGauges(ctx); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("device: %w", err)
	}
	if d.queue != nil {
		d.loops.Add(1)
		go d.dispatch(true)
	}
	if cfg.Restored {
		// Everything still pending goes out again, each peer's on a fresh
		// session (session.Config.Restored).
		d.loops.Add(1)
		go func() {
			defer d.loops.Done()
			d.resendAll(d.ctx, nil)
		}()
	}
	// The retry schedule's first pass looks at what is pending from
	// before; later ones are armed while messages are pending.
	d.opened.Store(true)
	d.out.Wake()
	if cfg.Prune.Interval > 0 {
		d.loops.Add(1)
		go d.pruneLoop()
	}
	if iv := cfg.StaleCheckInterval; iv >= 0 && d.staleAfter() > 0 {
		if iv == 0 {
			iv = max(time.Second, d.staleAfter()/4)
		}
		d.armStale(iv)
	}
	return d, nil
}

// refreshGauges sets the pending gauges from the store.
func (d *Device) refreshGauges(ctx context.Context) error {
	return d.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		in, err := r.PendingInboundCount(nil)
		if err != nil {
			return err
		}
		out, err := r.PendingOutboundCount()
		if err != nil {
			return err
		}
		d.metrics.pendingIn.Set(float64(in))
		d.metrics.pendingOut.Set(float64(out))
		return nil
	})
}

// observe updates the gauges and counters after each committed
// transaction. The oldest pending outbound message is exported as its
// creation time (a timestamp gauge: its age is time() − the value, always
// current without a timer); 0 when none is pending.
func (d *Device) observe(s session.Stats) {
	d.metrics.pendingIn.Set(float64(s.PendingInbound))
	d.metrics.pendingOut.Set(float64(s.PendingOutbound))
	if s.PendingOutbound > 0 && d.opened.Load() {
		// The retry schedule runs only while messages are pending.
		d.out.Wake()
	}
	d.metrics.commits.Add(float64(s.Committed))
	d.metrics.discards.Add(float64(s.Discarded))
	d.metrics.pruned.Add(float64(s.Pruned))
	d.metrics.skipped.Set(float64(s.SkippedKeys))
	for _, e := range s.SkippedEvicted {
		d.metrics.evicted.Add(float64(e.Count))
	}
	if !s.OutboundChanged {
		return
	}
	if s.OldestOutbound.IsZero() {
		d.metrics.oldestOut.Set(0)
		return
	}
	d.metrics.oldestOut.Set(float64(s.OldestOutbound.UnixMilli()) / 1000)
}

// acked counts an ACK this device tried to send.
func (d *Device) acked(to messages.DeviceAddress, id messages.LogicalMessageID, err error) {
	if err != nil {
		d.metrics.acksFailed.Inc()
		d.cfg.Logger.Warn("device: ACK not sent (the finalization stands)", "to", to.String(), "id", id.String(), "err", err)
		d.dropped(Dropped{Sent: true, Peer: to, ID: id, Ack: true, Reason: DropHandOff, Err: err})
		return
	}
	d.metrics.acksSent.Inc()
}

// heldSent counts a held receipt this device tried to send; one not
// handed over is reported as dropped (its sender keeps the short
// schedule).
func (d *Device) heldSent(to messages.DeviceAddress, id messages.LogicalMessageID, err error) {
	if err != nil {
		d.dropped(Dropped{Sent: true, Peer: to, ID: id, Reason: DropHandOff, Err: err})
		return
	}
	d.metrics.heldSent.Inc()
}

// Close stops the schedules, the delivery to the application (messages
// not yet handed over stay pending and are delivered again on the next
// Open), then the actors after the requests already queued were
// processed. It does not close the store. Other calls after Close
// return ErrClosed; Close itself is idempotent (a second call returns
// nil).
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.stopOnce.Do(func() { close(d.stop); d.cancel() })
	d.stopStale()
	if d.queue != nil {
		d.queue.close()
	}
	d.loops.Wait()
	errs := []error{d.out.Close(), d.sessions.Close()}
	// A closed device no longer counts in the shared gauges.
	d.metrics.pendingIn.Set(0)
	d.metrics.pendingOut.Set(0)
	if d.feed != nil {
		close(d.feed)
	}
	return errors.Join(errs...)
}

func (d *Device) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Sessions returns the session manager (identity pinning, resets).
func (d *Device) Sessions() *session.Manager { return d.sessions }

// Identity returns the local device's public identity.
func (d *Device) Identity() ratchet.IdentityPublic { return d.sessions.Identity() }

// Bundle issues a prekey bundle of this device (what a transport serves to
// initiators).
func (d *Device) Bundle(ctx context.Context) (*messages.PrekeyBundle, error) {
	return d.sessions.Bundle(ctx)
}

// Messages returns the channel of deliveries when Config.Buffer > 0 and
// Config.Handler is nil (else nil). It is closed by Close.
//
// Application delivery (never after finalization): the channel holds at
// most one copy of each message; a copy of a message the application took
// is put in only RedeliverAfter after the take (the application may have
// lost it); and once a message was committed or discarded no copy of it
// is put in again. So a message the application finalizes within
// RedeliverAfter of taking it is never received from the channel again.
// A channel cannot be recalled: the copy it may still hold when a message
// is finalized — put in before, because the application held the message
// longer than RedeliverAfter or finalized it without taking it (found by
// PendingReceivedMessages) — is still received, and committing it again
// answers ALREADY_COMMITTED or ALREADY_DISCARDED.
func (d *Device) Messages() <-chan ReceivedMessage { return d.feed }

// NewLogicalMessageID returns a new 16-byte logical message id: the Unix
// time in milliseconds (48 bits, big-endian), then 80 random bits. The
// time prefix makes one sender's ids ascend, so both stores keep the
// rows keyed by them next to each other: a commit of many messages
// rewrites one or two leaf pages of the receiver's processed index and of
// the pending buckets instead of one page per message (random ids scatter
// them). Uniqueness rests on the random bits, not on the clock; the time
// is what the receiver's plaintext received_at already tells.
func NewLogicalMessageID() (messages.LogicalMessageID, error) {
	return newLogicalMessageID(time.Now())
}

func newLogicalMessageID(now time.Time) (messages.LogicalMessageID, error) {
	var id messages.LogicalMessageID
	_, err := rand.Read(id[6:])
	ms := uint64(max(now.UnixMilli(), 0))
	for i := 5; i >= 0; i-- {
		id[i] = byte(ms)
		ms >>= 8
	}
	return id, err
}

// Send sends body to to under a new logical id (NewLogicalMessageID); see
// SendWithID.
func (d *Device) Send(ctx context.Context, to messages.DeviceAddress, body []byte) (SentMessage, error) {
	id, err := NewLogicalMessageID()
	if err != nil {
		return SentMessage{}, fmt.Errorf("device: send: %w", err)
	}
	return d.SendWithID(ctx, to, id, body)
}

// SendWithID stores body as a pending outbound message under the caller's
// logical id (durably, before the hand-off), encrypts it on the session
// with to and hands it to the transport. It stays pending until to's ACK
// arrives (its application committed or discarded it) or Abandon. When the
// store succeeded but the encryption or the hand-off failed, the returned
// SentMessage is valid and the error matches ErrNotHandedOff: the message
// is pending, Resend it later. A (to, id) already pending fails with
// outbound.ErrAlreadyPending; an id this device retired (abandoned, or
// acknowledged, until pruned) with another body with
// session.ErrLogicalIDReused, since the receiver's ACK of the retired
// body would clear this one. If ctx ends while the store write is queued
// the write may still happen: PendingSentMessages tells.
func (d *Device) SendWithID(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID, body []byte) (SentMessage, error) {
	if d.isClosed() {
		return SentMessage{}, ErrClosed
	}
	r, err := d.sessions.SendMessage(ctx, to, id, body)
	if err != nil {
		return SentMessage{}, fmt.Errorf("device: send: %w", err)
	}
	if r.HandOff != nil {
		d.dropped(Dropped{Sent: true, Peer: to, ID: id, Reason: DropHandOff, Err: r.HandOff})
		return r.Message, fmt.Errorf("device: send %s/%s: %w: %w", to, id, ErrNotHandedOff, r.HandOff)
	}
	return r.Message, nil
}

// Resend re-encrypts a pending sent message under the current ratchet
// state (a fresh encryption, never a replay of old ciphertext) and hands
// it to the transport. outbound.ErrNotPending when it was acknowledged or
// abandoned.
func (d *Device) Resend(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID) error {
	if d.isClosed() {
		return ErrClosed
	}
	r, err := d.sessions.Resend(ctx, to, id)
	if err != nil {
		return fmt.Errorf("device: resend: %w", err)
	}
	if r.HandOff != nil {
		d.dropped(Dropped{Sent: true, Peer: to, ID: id, Reason: DropHandOff, Err: r.HandOff})
		return fmt.Errorf("device: resend %s/%s: %w", to, id, r.HandOff)
	}
	return nil
}

// Abandon gives up on a pending sent message explicitly and reports
// whether it was pending. A later ACK for it is an Acknowledgement with
// Cleared=false. The id stays retired with its body's digest
// (persistence.RetiredOutbound), across restarts, until pruned.
func (d *Device) Abandon(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	if d.isClosed() {
		return false, ErrClosed
	}
	had, err := d.sessions.Abandon(ctx, to, id)
	if err != nil {
		return false, fmt.Errorf("device: abandon: %w", err)
	}
	d.out.Forget(to, id)
	return had, nil
}

// PendingSentMessages returns up to limit (1..MaxPageSize) pending sent
// messages after the cursor after (0: from the first), in send order,
// only those to *recipient when recipient is not nil.
func (d *Device) PendingSentMessages(ctx context.Context, after uint64, limit int, recipient *messages.DeviceAddress) (SentPage, error) {
	return d.out.Pending(ctx, after, limit, recipient)
}

// Receive handles one envelope from sender (what the transport calls):
// sender's peer actor decrypts it, decodes the frame and decides, then
// ONE transaction writes the ratchet step with the pending row (or clears
// the pending sent message an ACK names). On any error nothing changed and
// the ratchet step rolled back: a malformed frame (messages.ErrMalformed),
// a conflict (inbound.ErrLogicalMessageConflict), a full sender backlog
// (inbound.ErrSenderBacklogFull), ratchet errors. A Delivery is returned
// only after the commit and never ACKed; a copy of a finalized message is
// ACKed again (AckSent).
func (d *Device) Receive(ctx context.Context, sender messages.DeviceAddress, envelope []byte) (ReceiveResult, error) {
	if d.isClosed() {
		return ReceiveResult{}, ErrClosed
	}
	r, err := d.sessions.Receive(ctx, sender, envelope)
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("device: receive: %w", err)
	}
	res := d.resultOf(r)
	if r.SessionReplaced {
		res.Resent = d.resendAll(ctx, &sender)
		d.repaired(sender, RepairReplaced, res.Resent, nil)
	}
	return res, nil
}

// Steps of a session repair (OnSessionRepair, the metric's label).
const (
	// RepairStarted: envelopes from a pinned peer named a session this
	// device does not hold (or failed as replays several times in a row);
	// it sent the peer a fresh authenticated initiation.
	RepairStarted = session.RepairStarted
	// RepairFailed: such a repair could not be sent (no bundle, a changed
	// identity, the transport); the next envelope after the interval tries
	// again.
	RepairFailed = session.RepairFailed
	// RepairSuppressed: a repair was due but one was started with the peer
	// less than the repair interval ago.
	RepairSuppressed = session.RepairSuppressed
	// RepairRestored: the store may be a restored copy (Config.Restored);
	// the first send to the peer started a fresh initiation instead of
	// using the stored session.
	RepairRestored = session.RepairRestored
	// RepairReplaced: the peer's fresh initiation replaced the session here
	// (it reset, repaired or restored it); the messages pending to it were
	// sent again on the new session.
	RepairReplaced = session.RepairReplaced
)

func (d *Device) repaired(peer messages.DeviceAddress, step string, resent int, err error) {
	d.metrics.repairs.WithLabelValues(step).Inc()
	if d.cfg.OnSessionRepair != nil {
		d.cfg.OnSessionRepair(peer, step, resent, err)
	}
}

// MarkRestored tells a running device that its store is an older copy
// (what Config.Restored tells it at Open): evidence found since — a peer
// holds events of this node that its store lacks — says its sessions may
// be behind its peers'. Each session is re-initiated before its next send
// and every pending sent message goes out again, each on its fresh
// session.
func (d *Device) MarkRestored() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.loops.Add(1) // under mu: Close's Wait comes after closed is set
	d.mu.Unlock()
	d.sessions.MarkRestored()
	go func() {
		defer d.loops.Done()
		d.resendAll(d.ctx, nil)
	}()
}

// resendAll sends every message pending to peer (nil: to every peer)
// again, under the current session: after the peer replaced the session, what went out on the old
// one may never decrypt there (a reset or restored peer). It returns how
// many were handed over; failures stay pending for Retry or Resend.
func (d *Device) resendAll(ctx context.Context, peer *messages.DeviceAddress) int {
	sent := 0
	var after uint64
	for {
		p, err := d.PendingSentMessages(ctx, after, MaxPageSize, peer)
		if err != nil {
			return sent
		}
		for _, m := range p.Messages {
			if ctx.Err() != nil {
				return sent
			}
			if d.Resend(ctx, m.Recipient, m.ID) == nil {
				sent++
			}
		}
		if !p.More {
			return sent
		}
		after = p.Next
	}
}

// ReceiveAsync is Receive without the wait, for transports that pipeline
// a link: it queues the envelope on sender's peer actor and returns; done
// is called once with the result (from the device's goroutines: it must
// not block). Envelopes of one sender queued by one goroutine are decided
// in that order and share transactions.
func (d *Device) ReceiveAsync(ctx context.Context, sender messages.DeviceAddress, envelope []byte, done func(ReceiveResult, error)) error {
	if d.isClosed() {
		return ErrClosed
	}
	err := d.sessions.ReceiveAsync(ctx, sender, envelope, func(r session.Received, err error) {
		if err != nil {
			done(ReceiveResult{}, fmt.Errorf("device: receive: %w", err))
			return
		}
		if r.SessionReplaced {
			// Off the committer's replier goroutine: Resend goes through
			// it again.
			go func() {
				res := d.resultOf(r)
				res.Resent = d.resendAll(d.ctx, &sender)
				d.repaired(sender, RepairReplaced, res.Resent, nil)
				done(res, nil)
			}()
			return
		}
		done(d.resultOf(r), nil)
	})
	if err != nil {
		return fmt.Errorf("device: receive: %w", err)
	}
	return nil
}

// resultOf is the ReceiveResult of r; a held receipt's verdict is
// applied to the retry schedule and counted here.
func (d *Device) resultOf(r session.Received) ReceiveResult {
	res := ReceiveResult{Kind: r.Outcome, Sender: r.Sender, ID: r.ID, Message: r.Message, Cleared: r.Cleared, AckSent: r.AckSent,
		SessionReplaced: r.SessionReplaced, HeldSent: r.HeldSent, UnknownAck: r.UnknownAck}
	if r.Outcome == Held {
		d.metrics.heldReceipts.WithLabelValues(r.Receipt.String()).Inc()
		if r.Receipt == outbound.ReceiptHeld {
			d.out.Held(r.Sender, r.ID)
			res.Held = true
		} else {
			d.cfg.Logger.Debug("device: held receipt ignored", "from", r.Sender.String(), "id", r.ID.String(), "verdict", r.Receipt.String())
		}
	}
	return res
}

// CommitReceivedMessage records that the application durably applied the
// message (sender, id): one transaction removes the pending entry and
// writes the processed entry (digest, commit time); then the ACK is
// encrypted and handed to the transport. Committing again is idempotent
// (ALREADY_COMMITTED, ACK again). An id neither pending nor finalized is
// inbound.ErrReceivedMessageNotPending and changes nothing.
func (d *Device) CommitReceivedMessage(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID) (CommitResult, error) {
	if d.isClosed() {
		return CommitResult{}, ErrClosed
	}
	r, err := d.sessions.Finalize(ctx, sender, id, persistence.FinalizationCommitted, 0)
	return d.finish(r, err)
}

// CommitMessage is CommitReceivedMessage(m.Sender, m.ID); the plaintext is
// not an input.
func (d *Device) CommitMessage(ctx context.Context, m ReceivedMessage) (CommitResult, error) {
	return d.CommitReceivedMessage(ctx, m.Sender, m.ID)
}

// DiscardReceivedMessage records that the application can never apply the
// message (sender, id), with a reason of the closed set stored with the
// entry (readable by ProcessedMessage, never sent); the sender gets the
// same ACK as for a commit. Results: DISCARDED, ALREADY_DISCARDED,
// ALREADY_COMMITTED; inbound.ErrReceivedMessageNotPending otherwise.
func (d *Device) DiscardReceivedMessage(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID, reason DiscardReason) (CommitResult, error) {
	if d.isClosed() {
		return CommitResult{}, ErrClosed
	}
	if !reason.Valid() {
		return CommitResult{}, fmt.Errorf("device: %w: %s", inbound.ErrInvalidDiscardReason, reason)
	}
	r, err := d.sessions.Finalize(ctx, sender, id, persistence.FinalizationDiscarded, reason)
	return d.finish(r, err)
}

// DiscardMessage is DiscardReceivedMessage(m.Sender, m.ID, reason).
func (d *Device) DiscardMessage(ctx context.Context, m ReceivedMessage, reason DiscardReason) (CommitResult, error) {
	return d.DiscardReceivedMessage(ctx, m.Sender, m.ID, reason)
}

func (d *Device) finish(r session.Finalized, err error) (CommitResult, error) {
	if err != nil {
		return CommitResult{}, fmt.Errorf("device: %w", err)
	}
	if d.queue != nil {
		// Before the caller learns of the finalization: no copy queued
		// now or arriving later is handed to the application again.
		d.queue.finalize(r.Sender, r.ID)
	}
	return CommitResult{Sender: r.Sender, ID: r.ID, Status: r.Outcome, AckSent: r.AckSent}, nil
}

// PendingReceivedMessages returns up to limit (1..MaxPageSize) pending
// messages with a sequence greater than after (0: from the first), in
// sequence order (local acceptance order), only those of *sender when
// sender is not nil. Plaintexts are copies.
func (d *Device) PendingReceivedMessages(ctx context.Context, after uint64, limit int, sender *messages.DeviceAddress) (PendingPage, error) {
	if d.isClosed() {
		return PendingPage{}, ErrClosed
	}
	if limit < 1 || limit > MaxPageSize {
		return PendingPage{}, fmt.Errorf("device: %w: %d (1..%d)", inbound.ErrInvalidLimit, limit, MaxPageSize)
	}
	if sender != nil {
		if err := sender.Validate(); err != nil {
			return PendingPage{}, fmt.Errorf("device: pending: %w", err)
		}
	}
	var page PendingPage
	err := d.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		page, err = inbound.ReadPage(r, after, limit, sender)
		return err
	})
	if err != nil {
		return PendingPage{}, fmt.Errorf("device: pending: %w", err)
	}
	return page, nil
}

// PendingReceivedMessageCount returns how many received messages are
// pending (of *sender when sender is not nil).
func (d *Device) PendingReceivedMessageCount(ctx context.Context, sender *messages.DeviceAddress) (int, error) {
	if d.isClosed() {
		return 0, ErrClosed
	}
	if sender != nil {
		if err := sender.Validate(); err != nil {
			return 0, fmt.Errorf("device: pending count: %w", err)
		}
	}
	var n int
	err := d.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		n, err = r.PendingInboundCount(sender)
		return err
	})
	return n, err
}

// ProcessedMessage returns the processed entry of a finalized message
// (finalization, finalizedAt, digest, discard reason), if it is kept.
func (d *Device) ProcessedMessage(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID) (ProcessedMessage, bool, error) {
	var out ProcessedMessage
	var ok bool
	err := d.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		out, ok, err = r.ProcessedInbound(sender, id)
		return err
	})
	return out, ok, err
}

// PruneProcessedMessages removes the processed entries whose finalizedAt ≤
// now − maxAge (maxAge rounded up to whole milliseconds; RetentionInfinite
// prunes nothing; maxAge ≤ 0 is inbound.ErrInvalidRetention) and returns
// how many. Pending messages are never pruned; nothing prunes implicitly.
// After a prune, a sender's retry of a pruned id is delivered as new.
func (d *Device) PruneProcessedMessages(ctx context.Context, policy RetentionPolicy) (int, error) {
	if d.isClosed() {
		return 0, ErrClosed
	}
	return d.sessions.Prune(ctx, policy)
}

func (d *Device) pruneLoop() {
	defer d.loops.Done()
	t := time.NewTicker(d.cfg.Prune.Interval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Prune.Interval)
			if _, err := d.sessions.Prune(ctx, d.cfg.Prune.Policy); err != nil && !errors.Is(err, session.ErrClosed) {
				d.cfg.Logger.Warn("device: scheduled prune failed", "err", err)
			}
			cancel()
		}
	}
}

// dispatch hands deliveries to the application, in order: with
// redeliver, first every message still pending (persisted before a crash
// or a restart); then what the queue holds, returning when it is empty
// (the next push starts it again).
func (d *Device) dispatch(redeliver bool) {
	defer d.loops.Done()
	ctx := d.ctx
	// A message received while the pending ones are read is both in the
	// store and in the queue: hand it once.
	var handed map[uint64]bool
	if redeliver {
		if h := beforeRedelivery; h != nil {
			h()
		}
		handed = map[uint64]bool{}
		var after uint64
		for {
			page, err := d.PendingReceivedMessages(ctx, after, MaxPageSize, nil)
			if err != nil {
				if ctx.Err() == nil {
					d.cfg.Logger.Warn("device: redelivery of pending messages failed", "err", err)
				}
				break
			}
			// Only what was pending before Open: later receives are
			// queued by their receive.
			last := !page.More
			for i, m := range page.Messages {
				if m.Sequence > d.openBound {
					page.Messages, last = page.Messages[:i], true
					break
				}
			}
			// Each redelivery from the store is a hand-off no receive
			// counted: record them, one transaction per page, before
			// handing them (a crash in between over-counts, never under).
			msgs, err := d.sessions.CountDeliveries(ctx, page.Messages)
			if err != nil {
				if ctx.Err() == nil {
					d.cfg.Logger.Warn("device: counting redeliveries failed", "err", err)
				}
				break
			}
			for _, m := range msgs {
				handed[m.Sequence] = true
				if !d.hand(ctx, m) {
					d.queue.stopped()
					return
				}
			}
			if last {
				break
			}
			after = page.Next
		}
	}
	for {
		m, ok, page, from := d.queue.take()
		if page {
			// The queue overflowed: what it did not take is in the store.
			if !d.pageFrom(ctx, from) {
				d.queue.stopped()
				return
			}
			continue
		}
		if !ok {
			return
		}
		if handed[m.Sequence] {
			delete(handed, m.Sequence)
			continue
		}
		if !d.hand(ctx, m) {
			d.queue.stopped()
			return
		}
	}
}

// pageFrom hands every pending message from sequence from on, paged from
// the store (after the delivery queue overflowed); false when the device
// is closing.
func (d *Device) pageFrom(ctx context.Context, from uint64) bool {
	var after uint64
	if from > 0 {
		after = from - 1
	}
	for {
		page, err := d.PendingReceivedMessages(ctx, after, MaxPageSize, nil)
		if err != nil {
			if ctx.Err() == nil {
				d.cfg.Logger.Warn("device: paging pending messages failed", "err", err)
			}
			return ctx.Err() == nil
		}
		for _, m := range page.Messages {
			if !d.hand(ctx, m) {
				return false
			}
		}
		if !page.More {
			return true
		}
		after = page.Next
	}
}

// Queued returns how many deliveries the in-memory delivery queue holds
// (bounded by Config.MaxQueued).
func (d *Device) Queued() int {
	if d.queue == nil {
		return 0
	}
	d.queue.mu.Lock()
	defer d.queue.mu.Unlock()
	return len(d.queue.items)
}

func (d *Device) hand(ctx context.Context, m ReceivedMessage) bool {
	// A message finalized since it was queued or paged from the store is
	// not handed over (application delivery: never after finalization).
	if !d.queue.handing(m) {
		return true
	}
	if d.cfg.Handler != nil {
		d.cfg.Handler(ctx, m)
		return ctx.Err() == nil
	}
	select {
	case d.feed <- m:
		d.queue.fed(true)
		return true
	case <-ctx.Done():
		d.queue.fed(false)
		return false
	}
}

// Defaults of Config.MaxQueued, MaxQueuedBytes and RedeliverAfter.
const (
	DefaultMaxQueued      = 1024
	DefaultMaxQueuedBytes = 64 << 20
	DefaultRedeliverAfter = 30 * time.Second
)

// maxRemembered bounds the finalized and the handed-over messages the
// delivery queue remembers (each the oldest out first): past it a late
// copy is at worst handed once more, as before it was remembered.
const maxRemembered = 8192

// queueKey names a message in the delivery queue.
type queueKey struct {
	sender messages.DeviceAddress
	id     messages.LogicalMessageID
}

// recent is a bounded set of message keys with a time each, the oldest
// inserted going first.
type recent struct {
	at    map[queueKey]time.Time
	order []queueKey
}

func (r *recent) put(k queueKey, t time.Time) {
	if r.at == nil {
		r.at = map[queueKey]time.Time{}
	}
	if _, ok := r.at[k]; !ok {
		r.order = append(r.order, k)
	}
	r.at[k] = t
	for len(r.at) > maxRemembered && len(r.order) > 0 {
		old := r.order[0]
		r.order = r.order[1:]
		delete(r.at, old)
	}
	if len(r.order) > 2*maxRemembered {
		// Drop the keys already deleted, so order stays bounded too.
		kept := r.order[:0]
		for _, k := range r.order {
			if _, ok := r.at[k]; ok {
				kept = append(kept, k)
			}
		}
		r.order = kept
	}
}

func (r *recent) get(k queueKey) (time.Time, bool) {
	t, ok := r.at[k]
	return t, ok
}

func (r *recent) del(k queueKey) { delete(r.at, k) }

// deliveryQueue is a bounded FIFO between Receive and dispatch, so a slow
// application never blocks the receive path. A copy of
// a message already queued (same sequence: a sender's retry of a pending
// message) is not queued again. Past maxItems or maxBytes a delivery is
// not queued: the queue remembers the lowest sequence it left out and the
// dispatcher, once it drained what is queued, pages from the store from
// there (every delivery is durable before it is queued). A dispatcher
// runs only while it holds messages: push starts one when none is running.
type deliveryQueue struct {
	mu       sync.Mutex
	items    []ReceivedMessage
	queued   map[uint64]bool // sequences in items
	bytes    int
	maxItems int
	maxBytes int
	overflow bool
	from     uint64 // lowest sequence left out while overflowing
	closed   bool
	running  bool
	start    func() // starts a dispatcher (called with mu held)

	// finalized: committed or discarded in this process — never handed
	// again. handed: handed over and not finalized, with when — a copy
	// arriving within redeliverAfter is dropped.
	finalized      recent
	handed         recent
	now            func() time.Time
	redeliverAfter time.Duration

	// The Messages channel (nil with a Handler): the keys put in it,
	// oldest first, that the application has not been seen to take
	// (inFeed, counted by key in inFeedN), and the key the dispatcher is
	// putting in it now (sending). Only the dispatcher sends and only the
	// application receives, so of the keys in inFeed all but the last
	// len(feed) were taken.
	feed    chan ReceivedMessage
	inFeed  []queueKey
	inFeedN map[queueKey]int
	sending *queueKey
}

func newDeliveryQueue(maxItems, maxBytes int, start func()) *deliveryQueue {
	return &deliveryQueue{start: start, maxItems: maxItems, maxBytes: maxBytes, queued: map[uint64]bool{}}
}

func (q *deliveryQueue) push(m ReceivedMessage) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.queued[m.Sequence] {
		return
	}
	k := queueKey{m.Sender, m.ID}
	if _, ok := q.finalized.get(k); ok {
		return
	}
	q.syncFeed()
	if q.inChannel(k) {
		// The application has not taken the copy in the channel yet.
		return
	}
	if q.recentlyHanded(k) {
		return
	}
	switch {
	case q.overflow || len(q.items) >= q.maxItems || (len(q.items) > 0 && q.bytes+len(m.Plaintext) > q.maxBytes):
		if !q.overflow || m.Sequence < q.from {
			q.from = m.Sequence
		}
		q.overflow = true
	default:
		q.items = append(q.items, m)
		q.queued[m.Sequence] = true
		q.bytes += len(m.Plaintext)
	}
	if !q.running {
		q.running = true
		q.start()
	}
}

// take returns the next message; or page with the sequence to page the
// store from, when the queue drained after an overflow; or false when the
// queue is empty (the dispatcher then stops) or closed.
func (q *deliveryQueue) take() (m ReceivedMessage, ok, page bool, from uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		q.running = false
		return m, false, false, 0
	}
	if len(q.items) == 0 {
		if q.overflow {
			// Cleared before paging: a delivery pushed meanwhile is
			// queued (at worst handed twice, never missed).
			q.overflow = false
			return m, false, true, q.from
		}
		q.running = false
		return m, false, false, 0
	}
	m = q.items[0]
	q.items[0] = ReceivedMessage{}
	q.items = q.items[1:]
	delete(q.queued, m.Sequence)
	q.bytes -= len(m.Plaintext)
	return m, true, false, 0
}

func (q *deliveryQueue) clock() time.Time {
	if q.now == nil {
		return time.Now()
	}
	return q.now()
}

// finalize removes every queued copy of (sender, id) and drops any copy
// pushed later (it was committed or discarded).
func (q *deliveryQueue) finalize(sender messages.DeviceAddress, id messages.LogicalMessageID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := queueKey{sender, id}
	q.finalized.put(k, time.Time{})
	q.handed.del(k)
	kept := q.items[:0]
	for _, m := range q.items {
		if m.Sender == sender && m.ID == id {
			delete(q.queued, m.Sequence)
			q.bytes -= len(m.Plaintext)
			continue
		}
		kept = append(kept, m)
	}
	clear(q.items[len(kept):])
	q.items = kept
}

// handing reports whether m may be handed to the application now (it was
// not finalized meanwhile) and records the hand-off.
func (q *deliveryQueue) handing(m ReceivedMessage) bool {
	if q == nil {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	k := queueKey{m.Sender, m.ID}
	if _, ok := q.finalized.get(k); ok {
		return false
	}
	if q.feed == nil {
		// The handler is called now: that is the hand-off.
		q.handed.put(k, q.clock())
		return true
	}
	q.syncFeed()
	if q.inChannel(k) {
		// One copy in the channel at a time: the one there is received
		// first, and a finalization cannot reach a second one.
		return false
	}
	if q.recentlyHanded(k) {
		// A copy pushed after the dispatcher took the first one from the
		// queue but before it was handed (neither queued nor sending
		// then): the application may hold the first and finalize it
		// after this one reached the channel.
		return false
	}
	q.sending = &k
	return true
}

// recentlyHanded reports whether k was handed over (or seen taken from
// the Messages channel) less than redeliverAfter ago (mu held).
func (q *deliveryQueue) recentlyHanded(k queueKey) bool {
	t, ok := q.handed.get(k)
	return ok && q.redeliverAfter > 0 && q.clock().Sub(t) < q.redeliverAfter
}

// inChannel reports whether a copy of k is in the Messages channel or
// being put in it (mu held).
func (q *deliveryQueue) inChannel(k queueKey) bool {
	return q.inFeedN[k] > 0 || (q.sending != nil && *q.sending == k)
}

// fed records that the dispatcher put the message handing allowed in the
// Messages channel (sent), or gave up on it (the device is closing).
func (q *deliveryQueue) fed(sent bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := q.sending
	q.sending = nil
	if k == nil || !sent {
		return
	}
	if q.inFeedN == nil {
		q.inFeedN = map[queueKey]int{}
	}
	q.inFeed = append(q.inFeed, *k)
	q.inFeedN[*k]++
	q.syncFeed()
}

// syncFeed forgets the keys the application took from the Messages
// channel and starts their RedeliverAfter clock now (mu held). A key is
// recorded only after its send completed, so len(feed) never counts a key
// inFeed lacks except the one being recorded: the count of taken keys is
// never too high.
func (q *deliveryQueue) syncFeed() {
	if q.feed == nil {
		return
	}
	taken := len(q.inFeed) - len(q.feed)
	if taken <= 0 {
		return
	}
	now := q.clock()
	for _, k := range q.inFeed[:taken] {
		if q.inFeedN[k]--; q.inFeedN[k] <= 0 {
			delete(q.inFeedN, k)
		}
		if _, ok := q.finalized.get(k); !ok {
			q.handed.put(k, now)
		}
	}
	clear(q.inFeed[:taken])
	q.inFeed = q.inFeed[taken:]
}

// stopped records that the dispatcher gave up (the device is closing).
func (q *deliveryQueue) stopped() {
	q.mu.Lock()
	q.running = false
	q.mu.Unlock()
}

func (q *deliveryQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
}

// lastPendingSequence is the sequence of the last received message pending
// in the store (0: none).
func (d *Device) lastPendingSequence(ctx context.Context) (uint64, error) {
	var last, after uint64
	for {
		page, err := d.PendingReceivedMessages(ctx, after, MaxPageSize, nil)
		if err != nil {
			return 0, err
		}
		if n := len(page.Messages); n > 0 {
			last = page.Messages[n-1].Sequence
		}
		if !page.More {
			return last, nil
		}
		after = page.Next
	}
}

// beforeRedelivery, when set (tests only), runs as the redelivery pass at
// Open starts, before it reads the store.
var beforeRedelivery func()
