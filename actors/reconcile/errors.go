package reconcile

import "errors"

// Sentinel errors of the core. A peer's message that breaks the protocol
// fails the session with ErrProtocol; nothing else is affected.
var (
	// ErrProtocol marks a peer's message the protocol does not allow.
	ErrProtocol = errors.New("reconcile: protocol violation")
	// ErrTooManyRounds marks a session that did not finish in MaxRounds.
	ErrTooManyRounds = errors.New("reconcile: too many rounds")
	// ErrOverBudget marks an initiator session whose peer made it do more
	// work than WorkPerKey passes over its sets (it also matches
	// ErrProtocol: an honest responder cannot cause it).
	ErrOverBudget = errors.New("reconcile: session work over its budget")
)
