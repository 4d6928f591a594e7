package runtime

import (
	"context"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// The delivery plane (docs/protocol.md, commit boundary): end-to-end encrypted
// device-to-device messages with a commit boundary. Types are those of
// actors/device, re-exported so an application imports one package.
type (
	// DeviceAddress names a device: a user and a device number.
	DeviceAddress = messages.DeviceAddress
	// MessageID is a message's 16-byte logical id.
	MessageID = messages.LogicalMessageID
	// DiscardReason is the closed set of reasons a message is discarded.
	DiscardReason = device.DiscardReason
	// ProcessedMessage is the local record of a finalized message.
	ProcessedMessage = device.ProcessedMessage
)

// ReceivedMessage is a message pending the application's commit.
//
// Fields:
//   - Sender DeviceAddress: the authenticated sender.
//   - ID MessageID: the message's logical id.
//   - Sequence uint64: its place in the pending list (the cursor of
//     PendingPage.Next).
//   - ReceivedAt time.Time: when it was first received; the same on every
//     redelivery.
//   - Plaintext []byte: the decrypted body.
//   - Deliveries int: the persisted count of hand-offs of the message to
//     the application, this one included.
type ReceivedMessage = device.ReceivedMessage

// ReceiveResult is what receiving one envelope did.
//
// Fields:
//   - Kind: Delivery (Message set: new or still pending),
//     AlreadyCommitted, AlreadyDiscarded, Acknowledgement or Held (a
//     held receipt from the recipient of a sent message).
//   - Sender DeviceAddress: the authenticated sender.
//   - ID MessageID: the message's logical id.
//   - Message *ReceivedMessage: the message when Kind is Delivery.
//   - AckSent bool: the ACK was sent again (AlreadyCommitted,
//     AlreadyDiscarded).
//   - Cleared bool: an Acknowledgement cleared a pending sent message.
//   - SessionReplaced bool: the envelope was a fresh initiation from the
//     sender's pinned identity that replaced the current session; the
//     messages pending to the sender were sent again on the new session.
//   - Resent int: how many of them were sent again (the rest are retried
//     by the retry schedule or a later Resend).
//   - HeldSent bool: this copy of a still-pending message was answered
//     with a held receipt.
//   - Held bool: a held receipt named a pending sent message and its
//     body's digest; it is now resent only after Retry.HeldInterval.
//   - UnknownAck bool: an Acknowledgement of a message this node's store
//     does not know it sent (lost when node.db was rolled back; it was
//     delivered). Also a SentMessageLost notice, once per id.
type ReceiveResult = device.ReceiveResult

// CommitResult is the result of a commit or a discard.
//
// Fields:
//   - Sender DeviceAddress: the message's sender.
//   - ID MessageID: the message's logical id.
//   - Status: Committed, Discarded, AlreadyCommitted or AlreadyDiscarded.
//   - AckSent bool: the ACK was handed to the transport (an ACK failure
//     never undoes the commit).
type CommitResult = device.CommitResult

// PendingPage is one page of pending received messages.
//
// Fields:
//   - Messages []ReceivedMessage: the page, in sequence order.
//   - Next uint64: the cursor for the next page (the last sequence seen).
//   - More bool: more messages may follow.
type PendingPage = device.PendingPage

// SentMessage is a pending sent message (waiting for its ACK).
//
// Fields:
//   - Recipient DeviceAddress: where it goes.
//   - ID MessageID: the message's logical id.
//   - Sequence uint64: its place in the pending list (SentPage.Next).
//   - CreatedAt time.Time: when it was sent first.
//   - Attempts int: the tries so far, the first send included.
//   - LastAttemptAt time.Time: when the last try was.
//   - Body []byte: a copy of the plaintext the caller owns.
type SentMessage = device.SentMessage

// SentPage is one page of pending sent messages.
//
// Fields:
//   - Messages []SentMessage: the page, in sequence order.
//   - Next uint64: the cursor for the next page (the last sequence seen).
//   - More bool: more messages may follow.
type SentPage = device.SentPage

// RetentionPolicy is the processed-ID retention of PruneProcessedMessages.
//
// Fields:
//   - MaxAge time.Duration: processed ids older than this are pruned
//     (MaxAge > 0).
type RetentionPolicy = device.RetentionPolicy

// RetryPolicy is the opt-in resend schedule of pending sent messages.
//
// Fields:
//   - Interval time.Duration: how long after an attempt the first retry
//     is due, and how often the schedule looks for due messages; 0: off.
//   - Backoff float64: multiplies the delay after each attempt (≥ 1; 0: 2).
//   - MaxInterval time.Duration: caps the delay (0: no cap).
//   - MaxAttempts int: caps the tries, the first send included (0: no
//     cap); every try counts, also one that failed before its encryption
//     was stored. A message at the cap stays pending (only the ACK or
//     Abandon removes it) and is reported once to
//     DeviceConfig.OnRetryExhausted.
//   - Jitter float64: (0..1) shortens each delay by up to that fraction,
//     drawn per message and attempt, so the copies of a burst come due
//     spread out; 0: no jitter.
//   - HeldInterval time.Duration: how long after its last attempt (or
//     the recipient's held receipt, if later) a message the recipient
//     holds pending its application's commit is sent again, a safety net
//     until the ACK; 0: 5 minutes.
type RetryPolicy = device.RetryPolicy

// StalePending is a message pending past DeviceConfig.StaleAfter.
type StalePending struct {
	// Sent: a sent message (Peer is its recipient); else a received one
	// (Peer is its authenticated sender).
	Sent bool
	Peer DeviceAddress
	ID   MessageID
	// Since is when it was received or sent.
	Since time.Time
	// Reason is why it is stale: "uncommitted" (received, still pending
	// in the application), "unacknowledged" (sent, not acknowledged),
	// "unanswered_initiation" (sent on a session this device initiated
	// that the recipient never answered) or "peer_identity_changed" (the
	// recipient's current bundle names another identity than the one
	// pinned).
	Reason string
	// Reinitiated: the device reset the session and resent (Retry on, an
	// unanswered initiation).
	Reinitiated bool
}

// StalePending is the device layer's, field for field.
var _ = StalePending(device.StalePending{})

// PruneSchedule is the opt-in processed-ID prune schedule.
//
// Fields:
//   - Interval time.Duration: time between prunes; 0: off.
//   - Policy RetentionPolicy: applied at each prune (MaxAge > 0).
type PruneSchedule = device.PruneSchedule

// DeviceTransport fetches peers' prekey bundles and carries envelopes.
type DeviceTransport interface {
	// FetchBundle returns a fresh prekey bundle published by peer.
	FetchBundle(ctx context.Context, peer DeviceAddress) (*messages.PrekeyBundle, error)
	// Send hands envelope to the transport for delivery to peer. It is
	// called once the writes that produced the envelope are durable, on
	// the caller's goroutine, so a transport may deliver synchronously.
	Send(ctx context.Context, peer DeviceAddress, envelope []byte) error
}

// OrderedDeviceTransport is a DeviceTransport whose hand-off only queues
// (Enqueue never waits for the receiver): the device then hands each
// peer's envelopes over in ratchet-chain order, as soon as they are
// durable. The Network's and the remote's transports are. A transport
// whose Send waits for the receiver must not implement it.
type OrderedDeviceTransport interface {
	DeviceTransport
	// Enqueue queues envelope for peer behind every envelope enqueued for
	// peer before it, and returns at once. It takes ownership of
	// envelope. An error means it was not queued (as a failed Send: the
	// message stays pending). It must not block.
	Enqueue(peer DeviceAddress, envelope []byte) error
}

// The runtime's transport interfaces are the session layer's, method for
// method: a value of either satisfies the other.
var (
	_ session.Transport        = DeviceTransport(nil)
	_ session.OrderedTransport = OrderedDeviceTransport(nil)
	_ DeviceTransport          = session.Transport(nil)
	_ OrderedDeviceTransport   = session.OrderedTransport(nil)
)

// SessionConfig tunes the session layer of a node's device (DeviceConfig.
// Session). A zero field keeps the layer's default.
type SessionConfig struct {
	// Ratchet bounds per-session state; zero: ratchet.DefaultConfig.
	Ratchet ratchet.Config
	// Prekeys is the prekey schedule used when the store is created and
	// applied to an existing store at start; zero:
	// ratchet.DefaultPrekeyConfig (rotation 7 days, grace 30 days).
	Prekeys ratchet.PrekeyConfig
	// RefreshInterval is how often the prekey schedule is applied
	// (rotation, expiry, one-time replenishment); 0: the default
	// (hourly), negative: never.
	RefreshInterval time.Duration
	// IdleTimeout passivates a peer's session state that received no
	// message for this long; 0: the default.
	IdleTimeout time.Duration
	// MaxUnpinnedPeers caps the peers live at once for envelopes from
	// addresses with no stored pin or session (first contacts); past it
	// such an envelope is refused and nothing is kept (its sender
	// retries). 0: the default.
	MaxUnpinnedPeers int
	// MaxSkippedKeysPerDevice caps the skipped message keys stored for
	// all peers together; past it the peers holding the most keys lose
	// their oldest first. 0: the default; negative: no device-wide cap.
	MaxSkippedKeysPerDevice int
	// NoHeldReceipts stops answering a sender's copy of a message still
	// pending the application's commit with a held receipt. Only for a
	// rolling upgrade while some peers run v0.1.0, which refuses the
	// receipt's frame (docs/protocol.md, "Held receipt"); turn it off
	// once every node runs this build.
	NoHeldReceipts bool
}

// apply sets the non-zero fields of c on the session layer's config.
func (c *SessionConfig) apply(sc *session.Config) {
	var zeroRatchet ratchet.Config
	var zeroPrekeys ratchet.PrekeyConfig
	if c.Ratchet != zeroRatchet {
		sc.Ratchet = c.Ratchet
	}
	if c.Prekeys != zeroPrekeys {
		sc.Prekeys = c.Prekeys
	}
	if c.RefreshInterval != 0 {
		sc.RefreshInterval = c.RefreshInterval
	}
	if c.IdleTimeout != 0 {
		sc.IdleTimeout = c.IdleTimeout
	}
	if c.MaxUnpinnedPeers != 0 {
		sc.MaxUnpinnedPeers = c.MaxUnpinnedPeers
	}
	if c.MaxSkippedKeysPerDevice != 0 {
		sc.MaxSkippedKeysPerDevice = c.MaxSkippedKeysPerDevice
	}
	if c.NoHeldReceipts {
		sc.NoHeldReceipts = true
	}
}

// Receive and commit outcomes (ReceiveResult.Kind, CommitResult.Status).
const (
	Delivery         = device.Delivery
	AlreadyCommitted = device.AlreadyCommitted
	AlreadyDiscarded = device.AlreadyDiscarded
	Acknowledgement  = device.Acknowledgement
	Committed        = device.Committed
	Discarded        = device.Discarded
	// Held is the Kind of a held receipt: the recipient of a sent message
	// holds it pending its application's commit (not an ACK: the message
	// stays pending, and the retry schedule sends it again only after
	// Retry.HeldInterval).
	Held = device.Held
)

// Discard reasons (stored with the processed entry, never sent).
const (
	DiscardMalformed        = persistence.DiscardMalformed
	DiscardUnsupported      = persistence.DiscardUnsupported
	DiscardRejectedByPolicy = persistence.DiscardRejectedByPolicy
	DiscardExpired          = persistence.DiscardExpired
	DiscardOther            = persistence.DiscardOther
)

// DefaultRetry is DeviceConfig.Retry's default: a pending sent message is
// sent again 2 s after its last attempt, then after 4 s, 8 s, … up to one
// minute between attempts, each delay shortened by up to a fifth at
// random (per message, so a burst's retries spread out), without an
// attempt cap (as JetStream's MaxDeliver −1): it stays pending until its
// ACK arrives or Abandon.
var DefaultRetry = RetryPolicy{Interval: 2 * time.Second, Backoff: 2, MaxInterval: time.Minute, Jitter: 0.2}

// RetentionInfinite keeps every processed entry.
const RetentionInfinite = device.RetentionInfinite

// DeviceConfig turns on the delivery plane of a node: the node is also
// the device Address, on the same actor system and the same bbolt file as
// its sync plane.
type DeviceConfig struct {
	// Address is this device's address (required).
	Address DeviceAddress
	// Transport fetches bundles and carries envelopes: a Network's
	// DeviceTransport in one process. Nil with Config.Remote: the node's
	// remote carries them (Remote.AddDevice names where peers are).
	Transport DeviceTransport
	// Handler is called with every Delivery (new messages, redeliveries,
	// and on Open every message still pending), one at a time, in order.
	Handler func(ctx context.Context, m ReceivedMessage)
	// OnMessage is Handler for an application that wants the node with
	// each delivery (to commit it: Delivered.Commit) and its delivery
	// count. Set at most one of Handler and OnMessage.
	OnMessage func(ctx context.Context, d Delivered)
	// Buffer > 0 enables Node.Messages (used only without Handler).
	Buffer int
	// MaxPendingPerSender caps one sender's pending messages; past it new
	// ones are refused before their ratchet step (the sender keeps them
	// pending and retries). 0: no cap.
	MaxPendingPerSender int
	// MaxPending caps the pending messages of all senders together (beside
	// MaxPendingPerSender); past it new ones are refused before their
	// ratchet step (inbound.ErrBacklogFull; the sender retries). 0: no cap.
	MaxPending int
	// MaxQueued bounds the deliveries held in memory for Handler /
	// Messages; past it the device pages them from the store. 0:
	// device.DefaultMaxQueued.
	MaxQueued int
	// RedeliverAfter is how long after a message was handed to the
	// application a sender's copy of it may be handed again (sooner
	// copies are dropped: the application holds it). 0:
	// device.DefaultRedeliverAfter (30 s); < 0: every copy is handed.
	RedeliverAfter time.Duration
	// Retry is the resend schedule of pending sent messages. The zero
	// value is DefaultRetry: like a reliable-delivery broker (JetStream
	// redelivers unacknowledged messages by default), a message the
	// transport could not carry, or whose envelope or ACK was lost, is
	// sent again without the application's help. A negative
	// Retry.Interval turns the schedule off (the spec's behaviour: only
	// Resend sends again).
	Retry RetryPolicy
	// OnRetryExhausted is told about each pending sent message that
	// reached Retry.MaxAttempts.
	OnRetryExhausted func(SentMessage)
	// Prune is the opt-in prune schedule (nothing prunes otherwise).
	Prune PruneSchedule
	// Session tunes the session layer (ratchet limits, prekey schedule);
	// nil: its defaults.
	Session *SessionConfig
	// StaleAfter is how long a message may stay pending (received and not
	// committed or discarded, sent and not acknowledged) before it is
	// reported: a StalePendingMessage notice and
	// syncmesh_delivery_stale_pending_total{side, reason}; an unanswered
	// initiation of ours is re-initiated only under Retry. 0:
	// device.DefaultStaleAfter (1 h); < 0: never.
	StaleAfter time.Duration
	// StaleCheckInterval is how often pending messages are checked; 0:
	// StaleAfter / 4; < 0: only by CheckPending.
	StaleCheckInterval time.Duration
}

func (n *Node) openDevice(ctx context.Context) error {
	dc := n.cfg.Device
	if dc == nil {
		return nil
	}
	if err := dc.Address.Validate(); err != nil {
		return &ConfigError{"Device.Address", err.Error()}
	}
	transport := dc.Transport
	if transport == nil && n.remote != nil {
		transport = n.remote.DeviceTransport(dc.Address)
	}
	if transport == nil {
		return &ConfigError{"Device.Transport", "required unless Config.Remote is set"}
	}
	var store persistence.DeliveryStore
	if n.db != nil {
		store = n.db.Delivery()
	} else {
		store = memory.NewDelivery()
	}
	n.dstore = store
	store, deliveryRestored, err := n.openDeliveryMark(ctx, store) // deliverymark.go
	if err != nil {
		return err
	}
	timed := timedDelivery{DeliveryStore: store, update: n.txLatency.WithLabelValues("delivery", "update"), view: n.txLatency.WithLabelValues("delivery", "view")}
	handler := dc.Handler
	n.deliveries.opened, n.deliveries.ready = n.cfg.Wall(), make(chan struct{})
	if dc.OnMessage != nil {
		if handler != nil {
			return &ConfigError{"Device.OnMessage", "set together with Device.Handler"}
		}
		handler = n.onMessage(dc.OnMessage) // delivered.go
	}
	if err := n.registerConflictMetric(); err != nil {
		return err
	}
	retry := dc.Retry
	switch {
	case retry.Interval < 0:
		retry = RetryPolicy{}
	case retry == RetryPolicy{}:
		retry = DefaultRetry
	}
	// A store the restore check suspects (clock mark file above node.db's,
	// or missing; the delivery mark above the store's session writes) or
	// the operator declared restored may hold sessions behind their
	// peers': the device re-initiates before sending.
	n.restore.mu.Lock()
	restored := n.restore.status.Suspected || n.cfg.Restored || deliveryRestored
	n.restore.mu.Unlock()
	n.device, err = device.Open(ctx, n.system, device.Config{
		Restored: restored,
		Store:    timed, Transport: transport, Address: dc.Address, Now: n.cfg.Wall, Logger: n.log, Registerer: n.registerer,
		Session: sessionTuning(dc.Session), MaxPendingPerSender: dc.MaxPendingPerSender, MaxPending: dc.MaxPending, MaxQueued: dc.MaxQueued, RedeliverAfter: dc.RedeliverAfter, Handler: handler, Buffer: dc.Buffer,
		Retry: retry, OnRetryExhausted: dc.OnRetryExhausted, Prune: dc.Prune, Mailboxes: n.mailboxes,
		OnUndecryptable: func(from DeviceAddress, reason string, err error) {
			n.publish(messages.UndecryptableEnvelope{From: from, Reason: reason, Err: err.Error()})
		},
		OnDropped: func(x device.Dropped) {
			e := messages.EnvelopeDropped{Sent: x.Sent, Peer: x.Peer, ID: x.ID, Ack: x.Ack, Reason: x.Reason}
			if x.Err != nil {
				e.Err = x.Err.Error()
			}
			n.publish(e)
		},
		OnSessionRepair: func(peer DeviceAddress, step string, resent int, err error) {
			ev := messages.SessionRepaired{Peer: peer, Step: step, Resent: resent}
			if err != nil {
				ev.Err = err.Error()
			}
			n.publish(ev)
		},
		StaleAfter: dc.StaleAfter, StaleCheckInterval: dc.StaleCheckInterval,
		OnStale: func(st device.StalePending) {
			n.publish(messages.StalePendingMessage{Sent: st.Sent, Peer: st.Peer, ID: st.ID, Since: st.Since, Reason: st.Reason, Reinitiated: st.Reinitiated})
		},
	})
	if err != nil {
		return err // the store closes with the node's storage (closeStore)
	}
	n.restore.mu.Lock()
	n.restore.device = n.device
	evidentSince := n.restore.evident && !restored
	n.restore.mu.Unlock()
	if evidentSince {
		n.device.MarkRestored() // restore.go noteOwnEvents: evidence found while the device opened
	}
	close(n.deliveries.ready)
	return nil
}

// envelopeDropped reports an envelope from from that this node's
// transport dropped before the device saw it (its link queue was full):
// syncmesh_delivery_envelopes_dropped_total{side="received"} and an
// EnvelopeDropped notice.
func (n *Node) envelopeDropped(from DeviceAddress, err error) {
	if n.device == nil || n.isClosed() {
		return
	}
	n.device.Dropped(from, device.DropLinkQueueFull, err)
}

// CheckPending reports the messages pending longer than
// DeviceConfig.StaleAfter that it finds for the first time (each also
// published as a StalePendingMessage notice and counted), re-initiating
// unanswered initiations under DeviceConfig.Retry. The device runs it
// every StaleCheckInterval on its own.
func (n *Node) CheckPending(ctx context.Context) ([]StalePending, error) {
	d, err := n.dev()
	if err != nil {
		return nil, err
	}
	st, err := d.CheckPending(ctx)
	return convertSlice(st, func(s device.StalePending) StalePending { return StalePending(s) }), err
}

func (n *Node) dev() (*device.Device, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	if n.device == nil {
		return nil, ErrNoDevice
	}
	return n.device, nil
}

// DeviceAddress returns the node's device address (zero without a device).
func (n *Node) DeviceAddress() DeviceAddress {
	if n.cfg.Device == nil {
		return DeviceAddress{}
	}
	return n.cfg.Device.Address
}

// DeviceIdentity returns the device's public identity (what peers pin).
func (n *Node) DeviceIdentity() (ratchet.IdentityPublic, error) {
	d, err := n.dev()
	if err != nil {
		return ratchet.IdentityPublic{}, err
	}
	return d.Identity(), nil
}

// Bundle issues a prekey bundle of this device: what a transport serves
// to a peer starting a session.
func (n *Node) Bundle(ctx context.Context) (*messages.PrekeyBundle, error) {
	d, err := n.dev()
	if err != nil {
		return nil, err
	}
	return d.Bundle(ctx)
}

// NewMessageID returns a new logical message id for SendWithID: time
// ordered (a millisecond prefix), then random, so that the rows keyed by
// one sender's ids stay together in both devices' stores and a commit of
// many messages rewrites few pages (see device.NewLogicalMessageID).
func NewMessageID() (MessageID, error) { return device.NewLogicalMessageID() }

// Send sends body to the device to under a new logical id (NewMessageID). It is
// stored as pending (durably, before it is handed to the transport) and
// stays pending until to's application commits or discards it and its ACK
// arrives. When the error matches device.ErrNotHandedOff the message is
// pending but was not handed over: Resend it later.
func (n *Node) Send(ctx context.Context, to DeviceAddress, body []byte) (SentMessage, error) {
	d, err := n.dev()
	if err != nil {
		return SentMessage{}, err
	}
	return d.Send(ctx, to, body)
}

// SendWithID is Send under the caller's logical id (the id ties together
// the copies of one message: a retry with the same id and body is a
// duplicate at the receiver).
func (n *Node) SendWithID(ctx context.Context, to DeviceAddress, id MessageID, body []byte) (SentMessage, error) {
	d, err := n.dev()
	if err != nil {
		return SentMessage{}, err
	}
	return d.SendWithID(ctx, to, id, body)
}

// Resend re-encrypts a pending sent message under the current ratchet
// state (never a replay of old ciphertext) and hands it to the transport.
func (n *Node) Resend(ctx context.Context, to DeviceAddress, id MessageID) error {
	d, err := n.dev()
	if err != nil {
		return err
	}
	return d.Resend(ctx, to, id)
}

// Abandon gives up on a pending sent message and reports whether it was
// pending.
func (n *Node) Abandon(ctx context.Context, to DeviceAddress, id MessageID) (bool, error) {
	d, err := n.dev()
	if err != nil {
		return false, err
	}
	return d.Abandon(ctx, to, id)
}

// PendingSentMessages pages the sent messages still waiting for their
// ACK, in send order, after the cursor after (0: from the first).
//
// Deprecated: use PendingSent, which returns an iter.Seq2 like every
// listing.
func (n *Node) PendingSentMessages(ctx context.Context, after uint64, limit int, to *DeviceAddress) (SentPage, error) {
	d, err := n.dev()
	if err != nil {
		return SentPage{}, err
	}
	return d.PendingSentMessages(ctx, after, limit, to)
}

// ReceiveEnvelope handles one envelope from the device from: what a
// transport calls. The ratchet step and the pending row are written in
// one transaction; a Delivery is never acknowledged until the
// application commits or discards it.
func (n *Node) ReceiveEnvelope(ctx context.Context, from DeviceAddress, envelope []byte) (ReceiveResult, error) {
	d, err := n.dev()
	if err != nil {
		return ReceiveResult{}, err
	}
	r, err := d.Receive(ctx, from, envelope)
	return r, n.noteReceived(r, err)
}

// receiveEnvelopeAsync is ReceiveEnvelope for the transports, which
// pipeline a link: it queues the envelope on the sender's peer actor and
// returns; done is called once with the outcome (it must not block).
func (n *Node) receiveEnvelopeAsync(ctx context.Context, from DeviceAddress, envelope []byte, done func(error)) error {
	return n.ReceiveEnvelopeAsync(ctx, from, envelope, func(_ ReceiveResult, err error) { done(err) })
}

// ReceiveEnvelopeAsync is ReceiveEnvelope for a transport that pipelines
// a link, as the Network and the remote do: it queues the envelope on the
// sender's peer actor and returns; done is called once with the result,
// after its transaction is durable, from the node's goroutines (it must
// not block). Envelopes of one sender queued by one goroutine are decided
// in that order and share transactions.
func (n *Node) ReceiveEnvelopeAsync(ctx context.Context, from DeviceAddress, envelope []byte, done func(ReceiveResult, error)) error {
	d, err := n.dev()
	if err != nil {
		return err
	}
	return d.ReceiveAsync(ctx, from, envelope, func(r ReceiveResult, err error) { done(r, n.noteReceived(r, err)) })
}

// CommitReceivedMessage records that the application durably applied the
// message (sender, id), then sends the ACK (outside the transaction; an
// ACK failure never undoes the commit: AckSent=false).
func (n *Node) CommitReceivedMessage(ctx context.Context, sender DeviceAddress, id MessageID) (CommitResult, error) {
	d, err := n.dev()
	if err != nil {
		return CommitResult{}, err
	}
	defer n.deliveries.forget(sender, id)
	return d.CommitReceivedMessage(ctx, sender, id)
}

// CommitMessage commits a delivered message.
func (n *Node) CommitMessage(ctx context.Context, m ReceivedMessage) (CommitResult, error) {
	return n.CommitReceivedMessage(ctx, m.Sender, m.ID)
}

// DiscardReceivedMessage finalizes the message (sender, id) without
// applying it; reason is stored with the entry, never sent to the sender.
func (n *Node) DiscardReceivedMessage(ctx context.Context, sender DeviceAddress, id MessageID, reason DiscardReason) (CommitResult, error) {
	d, err := n.dev()
	if err != nil {
		return CommitResult{}, err
	}
	defer n.deliveries.forget(sender, id)
	return d.DiscardReceivedMessage(ctx, sender, id, reason)
}

// DiscardMessage discards a delivered message.
func (n *Node) DiscardMessage(ctx context.Context, m ReceivedMessage, reason DiscardReason) (CommitResult, error) {
	return n.DiscardReceivedMessage(ctx, m.Sender, m.ID, reason)
}

// PendingReceivedMessages pages the messages waiting for a commit or a
// discard, in receive sequence order after the cursor after (limit at
// most 100), only from sender when it is not nil.
//
// Deprecated: use PendingReceived, which returns an iter.Seq2 like every
// listing.
func (n *Node) PendingReceivedMessages(ctx context.Context, after uint64, limit int, sender *DeviceAddress) (PendingPage, error) {
	d, err := n.dev()
	if err != nil {
		return PendingPage{}, err
	}
	return d.PendingReceivedMessages(ctx, after, limit, sender)
}

// PendingReceivedMessageCount counts pending received messages (from
// sender only when it is not nil).
func (n *Node) PendingReceivedMessageCount(ctx context.Context, sender *DeviceAddress) (int, error) {
	d, err := n.dev()
	if err != nil {
		return 0, err
	}
	return d.PendingReceivedMessageCount(ctx, sender)
}

// ProcessedMessage returns the local record of a finalized message
// (committed or discarded, when, its digest, the discard reason).
func (n *Node) ProcessedMessage(ctx context.Context, sender DeviceAddress, id MessageID) (ProcessedMessage, bool, error) {
	d, err := n.dev()
	if err != nil {
		return ProcessedMessage{}, false, err
	}
	return d.ProcessedMessage(ctx, sender, id)
}

// PruneProcessedMessages removes processed entries finalized at or before
// now − policy.MaxAge. Nothing prunes implicitly.
func (n *Node) PruneProcessedMessages(ctx context.Context, policy RetentionPolicy) (int, error) {
	d, err := n.dev()
	if err != nil {
		return 0, err
	}
	return d.PruneProcessedMessages(ctx, policy)
}

// Messages returns the channel of deliveries (DeviceConfig.Buffer > 0 and
// no Handler). It is closed by Close. It is never nil: without a device,
// with a Handler or without Buffer it is a closed channel, so a range
// over it ends instead of blocking forever.
func (n *Node) Messages() <-chan ReceivedMessage {
	if n.device == nil {
		return closedMessages
	}
	if c := n.device.Messages(); c != nil {
		return c
	}
	return closedMessages
}

// AcceptIdentity pins identity for the peer device (the application
// accepted a changed identity, e.g. after comparing safety numbers). A
// stored session with another identity is deleted, so the next send
// fetches a new bundle and the next initiation from identity is accepted.
// ErrNoDevice without a device.
func (n *Node) AcceptIdentity(ctx context.Context, peer DeviceAddress, identity ratchet.IdentityPublic) error {
	d, err := n.dev()
	if err != nil {
		return err
	}
	return d.Sessions().AcceptIdentity(ctx, peer, identity)
}

// ResetSession deletes the session with the peer device (its pinned
// identity is kept), so the next send starts a new session from a fresh
// bundle. ErrNoDevice without a device.
func (n *Node) ResetSession(ctx context.Context, peer DeviceAddress) error {
	d, err := n.dev()
	if err != nil {
		return err
	}
	return d.Sessions().ResetSession(ctx, peer)
}

// LiveSessions returns how many peers' session state is loaded (not
// passivated); 0 without a device.
func (n *Node) LiveSessions() int {
	if n.device == nil {
		return 0
	}
	return n.device.Sessions().LiveSessions()
}

// MaxAgeRetention is a RetentionPolicy keeping processed entries for d.
func MaxAgeRetention(d time.Duration) RetentionPolicy { return RetentionPolicy{MaxAge: d} }

// sessionTuning is the session layer's hook for c (nil: none).
func sessionTuning(c *SessionConfig) func(*session.Config) {
	if c == nil {
		return nil
	}
	return c.apply
}
