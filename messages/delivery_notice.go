package messages

import "time"

// UndecryptableEnvelope: an envelope from From could not be decrypted
// (so a failure is never silent), with Reason from a closed set ("malformed",
// "decrypt", "identity_changed", "budget"). From is what the transport
// authenticated; nothing of the envelope was kept.
type UndecryptableEnvelope struct {
	From   DeviceAddress
	Reason string
	Err    string
}

func (UndecryptableEnvelope) notice() {}

// StalePendingMessage: a message stayed pending longer than the device's
// StaleAfter, told once per process. Sent: a sent
// message not acknowledged by Peer, its recipient; else a received one
// from Peer (its authenticated sender) the application neither committed
// nor discarded. Reason is from a closed set ("uncommitted",
// "unacknowledged", "unanswered_initiation", "peer_identity_changed");
// Reinitiated: the device reset the session and resent (Retry on).
type StalePendingMessage struct {
	Sent        bool
	Peer        DeviceAddress
	ID          LogicalMessageID
	Since       time.Time
	Reason      string
	Reinitiated bool
}

func (StalePendingMessage) notice() {}

// EnvelopeDropped: a transport could not carry an envelope, so it never
// reached its device. Sent: this device's envelope to Peer was refused at
// the hand-off (ID its message's logical id; Ack: it was the ACK of a
// message Peer sent, whose finalization stands); else an envelope from
// Peer was dropped before this device saw it (its id is still sealed: ID
// is zero). Reason is from a closed set ("handoff": the sender's
// transport refused it; "link_queue_full": the receiving node's queue for
// that link was at its bound). The message itself is not lost: it stays
// pending at its sender, whose retry schedule sends it again (for an ACK:
// the sender's retry of the message is answered with a new ACK).
type EnvelopeDropped struct {
	Sent   bool
	Peer   DeviceAddress
	ID     LogicalMessageID
	Ack    bool
	Reason string
	Err    string
}

func (EnvelopeDropped) notice() {}

// SessionRepaired: the delivery plane took one step of a session repair
// with Peer on its own (docs/delivery.md, "Restore, reset and repair").
// Step is from a closed set: "started" (envelopes from Peer's pinned
// identity named a session this device does not hold, or failed as
// replays several times in a row; a fresh initiation was sent), "failed"
// (it could not be sent: Err), "suppressed" (rate limit), "replaced"
// (Peer's fresh initiation replaced the session here; Resent pending
// messages were sent again on it). Nothing is asked of the application.
type SessionRepaired struct {
	Peer   DeviceAddress
	Step   string
	Resent int
	Err    string
}

func (SessionRepaired) notice() {}

// LogicalMessageConflict: a received message reused the logical id ID of
// sender From with another body (application delivery's idempotence
// rule: one id, one body). Nothing changed: the stored copy is kept and
// the envelope is not acknowledged, so the sender keeps retrying it;
// Finalized tells whether the stored copy was already committed or
// discarded. Told on every such envelope.
type LogicalMessageConflict struct {
	From      DeviceAddress
	ID        LogicalMessageID
	Finalized bool
}

func (LogicalMessageConflict) notice() {}

// SentMessageLost: Peer acknowledged ID, a message this device neither
// holds pending nor remembers sending: its store lost the message when
// it was rolled back to an older copy (a backup, a VM snapshot). The ACK
// means Peer's application finalized it (committed or discarded), so it
// was delivered and must not be sent again; only this device's record
// of it is gone. Told once per id (the id is remembered from then on and
// is not accepted for a new body).
type SentMessageLost struct {
	Peer DeviceAddress
	ID   LogicalMessageID
}

func (SentMessageLost) notice() {}
