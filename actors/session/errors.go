package session

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Sentinel errors of the package. Errors of the ratchet are wrapped with
// %w, so errors.Is(err, ratchet.ErrReplay), ratchet.ErrTampered,
// ratchet.ErrUnknownPrekey, ratchet.ErrUnknownSession,
// ratchet.ErrBadPrekeySignature, messages.ErrMalformed and
// persistence.ErrCorrupt work on everything this package returns.
var (
	// ErrClosed is returned by every call on a closed Manager (but Close).
	// It wraps persistence.ErrClosed.
	ErrClosed = persistence.NewClosedError("session: manager closed")
	// ErrTooManyUnpinned: an envelope from an address with no pin or
	// session arrived while Config.MaxUnpinnedPeers such addresses were
	// being served; it was refused before anything was read or kept.
	ErrTooManyUnpinned = errors.New("session: too many addresses without a pin")
	// ErrInvalidPeer marks a DeviceAddress that fails Validate.
	ErrInvalidPeer = errors.New("session: invalid peer address")
	// ErrStaleState marks an operation decided on top of an earlier one
	// of the same peer whose writes failed: nothing of it was written (the
	// peer's actor reloads its state from the store); the caller may retry.
	ErrStaleState = errors.New("session: decided on a state whose writes failed")
	// ErrNoIdentity marks a store that holds prekeys but no identity, or
	// the reverse: the local device state is incomplete.
	ErrNoIdentity = errors.New("session: local identity or prekeys missing")
	// ErrUnknownPeer is returned by the in-process transport for an
	// address with no registered manager.
	ErrUnknownPeer = errors.New("session: unknown peer")
	// ErrInvalidConfig marks an unusable Config.
	ErrInvalidConfig = errors.New("session: invalid configuration")
	// ErrLogicalIDReused: a Send under a logical id this device retired
	// (abandoned, or cleared by an ACK; persistence.RetiredOutbound) with
	// another body. The receiver may still finalize the abandoned body, or
	// ACK a retry of the acknowledged one, and the ACK frame names only
	// the id, so it would clear the new body (docs/protocol.md,
	// commit boundary, "Same logical ID, other body": a correct sender
	// never reuses an id for another body). Nothing was stored; send the
	// new body under a new id.
	ErrLogicalIDReused = errors.New("session: logical id reused for another body")
)

// IdentityChangedError reports that peer presented an identity other than
// the one pinned for it (a bundle, or a received initiation). Nothing
// changed. The application may accept the new identity with
// Manager.AcceptIdentity. It unwraps to the *ratchet.IdentityChangedError.
type IdentityChangedError struct {
	Peer   messages.DeviceAddress
	Pinned ratchet.IdentityPublic
	Seen   ratchet.IdentityPublic
}

// Error implements the error interface.
func (e *IdentityChangedError) Error() string {
	return fmt.Sprintf("session: identity of %s changed: pinned %s, seen %s", e.Peer, e.Pinned, e.Seen)
}

// Unwrap returns the ratchet's error for the same change.
func (e *IdentityChangedError) Unwrap() error {
	return &ratchet.IdentityChangedError{Pinned: e.Pinned, Seen: e.Seen}
}

// wrapPeer annotates err with the peer, turning a ratchet identity change
// into an *IdentityChangedError.
func wrapPeer(op string, peer messages.DeviceAddress, err error) error {
	if err == nil {
		return nil
	}
	var ic *ratchet.IdentityChangedError
	if errors.As(err, &ic) {
		var own *IdentityChangedError
		if !errors.As(err, &own) {
			return &IdentityChangedError{Peer: peer, Pinned: ic.Pinned, Seen: ic.Seen}
		}
	}
	return fmt.Errorf("session: %s %s: %w", op, peer, err)
}

// checkPin compares seen with the pinned identity of peer.
func checkPin(peer messages.DeviceAddress, pinned, seen ratchet.IdentityPublic) error {
	if err := ratchet.CheckPin(pinned, seen); err != nil {
		return &IdentityChangedError{Peer: peer, Pinned: pinned, Seen: seen}
	}
	return nil
}

// ErrDecryptBudget: the sender's failed decrypt attempts used up its
// budget (Config.FailedDecryptBurst, refilled at FailedDecryptRate); the
// envelope was refused before any cryptography and nothing changed.
var ErrDecryptBudget = errors.New("session: sender's decrypt budget exhausted")
