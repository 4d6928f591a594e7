package reconcile

import "errors"

// Sentinel errors of the core. A peer's message that breaks the protocol
// fails the session with ErrProtocol; nothing else is affected.
var (
	// ErrProtocol marks a peer's message the protocol does not allow.
	ErrProtocol = errors.New("reconcile: protocol violation")
	// ErrTooManyRounds marks a session that did not finish in MaxRounds.
	ErrTooManyRounds = errors.New("reconcile: too many rounds")
)
