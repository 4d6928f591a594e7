package messages

import "time"

// UndecryptableEnvelope: an envelope from From could not be decrypted
// (issue 13, item 10), with Reason from a closed set ("malformed",
// "decrypt", "identity_changed", "budget"). From is what the transport
// authenticated; nothing of the envelope was kept.
type UndecryptableEnvelope struct {
	From   DeviceAddress
	Reason string
	Err    string
}

func (UndecryptableEnvelope) notice() {}

// StalePendingMessage: a message stayed pending longer than the device's
// StaleAfter (issue 13, item 10), told once per process. Sent: a sent
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
