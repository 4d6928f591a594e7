package replicate

import (
	"errors"

	"github.com/syncmesh/syncmesh/persistence"
)

// ErrUnreachable is returned (wrapped) by transports when the peer cannot
// be reached: unknown peer, partition, connection refused, timeout.
var ErrUnreachable = errors.New("replicate: peer unreachable")

// Errors of the delivery service (match with errors.Is).
var (
	// ErrUnknownPeer: no peer of that name and path was added.
	ErrUnknownPeer = errors.New("replicate: unknown peer")
	// ErrPeerExists: AddPeer of a name and path already added.
	ErrPeerExists = errors.New("replicate: peer already added")
	// ErrStopped: the service is closed. It wraps persistence.ErrClosed.
	ErrStopped = persistence.NewClosedError("replicate: stopped")
	// ErrUnknownSender: a push from a sender this node did not configure
	// (AddPeer, AcceptPeer). Nothing of it is kept.
	ErrUnknownSender = errors.New("replicate: push from an unknown sender")
	// ErrSenderMismatch: a push whose From is not the peer the transport
	// authenticated. Transports refuse it before it reaches the service.
	ErrSenderMismatch = errors.New("replicate: push names a sender other than the authenticated peer")
)
