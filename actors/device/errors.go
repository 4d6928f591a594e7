package device

import (
	"errors"

	"github.com/syncmesh/syncmesh/persistence"
)

// Errors of the facade; errors of the layers below are wrapped with %w
// (inbound.ErrLogicalMessageConflict, inbound.ErrReceivedMessageNotPending,
// inbound.ErrSenderBacklogFull, outbound.ErrNotPending, ratchet errors,
// messages.ErrMalformed, persistence.ErrCorrupt, ...).
var (
	// ErrNotHandedOff: Send stored the message as pending but could not
	// encrypt it or hand it to the transport; it stays pending (Resend).
	ErrNotHandedOff = errors.New("device: message stored as pending but not handed to the transport")
	// ErrInvalidConfig marks an unusable Config.
	ErrInvalidConfig = errors.New("device: invalid configuration")
	// ErrClosed is returned by calls on a closed Device (but Close). It
	// wraps persistence.ErrClosed.
	ErrClosed = persistence.NewClosedError("device: closed")
)
