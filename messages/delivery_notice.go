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
