package inbound

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// Sentinel errors of the package (the commit boundary, docs/protocol.md, names them
// LogicalMessageConflict, ReceivedMessageNotPending). Store errors are
// wrapped with %w, so errors.Is(err, persistence.ErrCorrupt) (a damaged
// sealed record: the spec's StorageEncryptionException) and
// persistence.ErrClosed work on everything this package returns.
var (
	// ErrLogicalMessageConflict: a message reused a logical id with
	// another body. Nothing changed: the pending body is not overwritten,
	// nothing is processed or acknowledged, and the ratchet step of the
	// offending envelope rolls back. Returned as *ConflictError.
	ErrLogicalMessageConflict = errors.New("inbound: logical message conflict")
	// ErrReceivedMessageNotPending: a commit or discard of an id that is
	// neither pending nor finalized (never received, or its processed
	// entry was pruned). Nothing changed.
	ErrReceivedMessageNotPending = errors.New("inbound: received message not pending")
	// ErrSenderBacklogFull: the sender already has Config.MaxPendingPerSender
	// messages pending; a new one is refused before its ratchet step is
	// persisted (the sender keeps it pending and retries later). Returned
	// as *BacklogFullError.
	ErrSenderBacklogFull = errors.New("inbound: sender backlog full")
	// ErrBacklogFull: all senders together already have the global cap
	// (Config.MaxPending) of messages pending; a new one is refused
	// before its ratchet step is persisted, as for ErrSenderBacklogFull.
	// Returned as *BacklogFullError with Global set.
	ErrBacklogFull = errors.New("inbound: pending backlog full")
	// ErrInvalidDiscardReason: a discard reason outside the closed set.
	ErrInvalidDiscardReason = errors.New("inbound: invalid discard reason")
	// ErrInvalidRetention: a retention policy with maxAge ≤ 0.
	ErrInvalidRetention = errors.New("inbound: retention maxAge must be positive")
	// ErrInvalidLimit: a page limit outside 1..MaxPageSize.
	ErrInvalidLimit = errors.New("inbound: page limit out of range")
	// ErrNotApplicationMessage: Receive was given a frame that is not an
	// application message or an ack.
	ErrNotApplicationMessage = errors.New("inbound: not an application message or ack frame")
	// ErrInvalidConfig marks an unusable Config.
	ErrInvalidConfig = errors.New("inbound: invalid configuration")
)

// ConflictError reports a LogicalMessageConflict for (Sender, ID). It
// matches ErrLogicalMessageConflict. Committed tells whether the stored
// copy was already finalized (compared by digest) or still pending
// (compared byte for byte in constant time).
type ConflictError struct {
	Sender    messages.DeviceAddress
	ID        messages.LogicalMessageID
	Finalized bool
}

// Error implements error.
func (e *ConflictError) Error() string {
	state := "pending"
	if e.Finalized {
		state = "finalized"
	}
	return fmt.Sprintf("inbound: logical message conflict: %s/%s reused with another body (stored copy %s)", e.Sender, e.ID, state)
}

// Is matches ErrLogicalMessageConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrLogicalMessageConflict }

// BacklogFullError reports that Sender has Pending ≥ Limit pending
// messages. It matches ErrSenderBacklogFull.
// With Global, Pending and Limit are the counts of all senders together
// and it matches ErrBacklogFull instead.
type BacklogFullError struct {
	Sender         messages.DeviceAddress
	Pending, Limit int
	Global         bool
}

// Error implements error.
func (e *BacklogFullError) Error() string {
	if e.Global {
		return fmt.Sprintf("inbound: %d messages pending from all senders (limit %d): new message from %s refused", e.Pending, e.Limit, e.Sender)
	}
	return fmt.Sprintf("inbound: %s has %d pending messages (limit %d): new message refused", e.Sender, e.Pending, e.Limit)
}

// Is matches ErrSenderBacklogFull, or ErrBacklogFull when Global.
func (e *BacklogFullError) Is(target error) bool {
	if e.Global {
		return target == ErrBacklogFull
	}
	return target == ErrSenderBacklogFull
}

// NotPendingError reports ReceivedMessageNotPending for (Sender, ID). It
// matches ErrReceivedMessageNotPending.
type NotPendingError struct {
	Sender messages.DeviceAddress
	ID     messages.LogicalMessageID
}

// Error implements error.
func (e *NotPendingError) Error() string {
	return fmt.Sprintf("inbound: %s/%s is neither pending nor finalized", e.Sender, e.ID)
}

// Is matches ErrReceivedMessageNotPending.
func (e *NotPendingError) Is(target error) bool { return target == ErrReceivedMessageNotPending }
