package ratchet

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// Sentinel errors of the package. Decode errors of envelopes, bundles and
// stored state match messages.ErrMalformed instead.
var (
	// ErrReplay marks an envelope whose message key was already used (or
	// deleted: evicted from the skipped-key store, or its chain retired),
	// and a prekey envelope for a session already retired from the record.
	ErrReplay = errors.New("ratchet: replayed or already processed message")
	// ErrDuplicateMessage is ErrReplay under its other common name.
	ErrDuplicateMessage = ErrReplay
	// ErrTampered marks an authentication failure: the AEAD did not open,
	// a DH output was degenerate, or the envelope's session id does not
	// match its initiation. State is never changed by it.
	ErrTampered = errors.New("ratchet: message authentication failed")
	// ErrTooManySkipped marks an envelope that would skip more than
	// Config.MaxForwardJump message keys in one chain (DR §3.5 MAX_SKIP).
	ErrTooManySkipped = errors.New("ratchet: too many skipped messages")
	// ErrBadPrekeySignature marks a bundle whose signed prekey or KEM
	// prekey signature does not verify under its identity key.
	ErrBadPrekeySignature = errors.New("ratchet: bad prekey signature")
	// ErrUnknownPrekey marks an initiation naming a prekey this device does
	// not hold: never issued, expired after its grace period, or a one-time
	// prekey already consumed.
	ErrUnknownPrekey = errors.New("ratchet: unknown or already used prekey")
	// ErrUnknownSession marks a non-initiating envelope for a session the
	// record does not hold, and Encrypt on a record without a session.
	ErrUnknownSession = errors.New("ratchet: unknown session")
	// ErrChainExhausted marks a sending chain that reached 2^32-1 messages.
	ErrChainExhausted = errors.New("ratchet: sending chain exhausted")
	// ErrInvalidConfig marks a Config or PrekeyConfig with a non-positive limit.
	ErrInvalidConfig = errors.New("ratchet: invalid configuration")
	// ErrWrongAddress marks an initiation whose device addresses are not
	// the route it arrived on: its From is not the sender the transport
	// authenticated, or its To is not this device.
	ErrWrongAddress = errors.New("ratchet: initiation names other device addresses")
	// ErrInitiationLimit marks a last-resort initiation (one without a
	// one-time prekey) refused because the set of accepted initiation ids
	// is full, or because it names a signed prekey closed to last-resort
	// initiations when that set last filled up (PrekeyConfig.MaxAcceptedInitiations).
	ErrInitiationLimit = errors.New("ratchet: last-resort initiations refused until the signed prekey rotates")
)

// IdentityChangedError reports that a peer presented an identity other
// than the pinned one. Match it with errors.As.
type IdentityChangedError struct {
	Pinned IdentityPublic
	Seen   IdentityPublic
}

// Error implements the error interface.
func (e *IdentityChangedError) Error() string {
	return fmt.Sprintf("ratchet: identity changed: pinned %s, seen %s", e.Pinned, e.Seen)
}

// decodeError wraps a state decoding failure so it matches messages.ErrMalformed.
func decodeError(what string, err error) error {
	return &messages.DecodeError{What: what, Kind: messages.ErrMalformed, Err: err}
}
