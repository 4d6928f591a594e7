package outbound

import (
	"errors"

	"github.com/syncmesh/syncmesh/persistence"
)

// Errors of the package. Store errors are wrapped with %w.
var (
	// ErrNotPending: the message is not pending (acknowledged, abandoned
	// or never sent).
	ErrNotPending = errors.New("outbound: message not pending")
	// ErrAlreadyPending: Store of a (recipient, id) already pending.
	ErrAlreadyPending = errors.New("outbound: message already pending")
	// ErrInvalidLimit: a page limit outside 1..MaxPageSize.
	ErrInvalidLimit = errors.New("outbound: page limit out of range")
	// ErrInvalidConfig marks an unusable Config.
	ErrInvalidConfig = errors.New("outbound: invalid configuration")
	// ErrClosed is returned by every call on a closed Outbox (but Close).
	// It wraps persistence.ErrClosed.
	ErrClosed = persistence.NewClosedError("outbound: closed")
)
