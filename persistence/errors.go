package persistence

import "errors"

// Sentinel errors every Store implementation returns (wrapped with %w).
var (
	// ErrClosed is the one base of every "closed" error in syncmesh. A
	// store returns it (wrapped) from every call after Close, and the
	// closed sentinel of every component above (apply, session, outbound,
	// device, replicate, syncgroup, the runtime's node and remote,
	// hosting) wraps it, so errors.Is(err, persistence.ErrClosed) —
	// re-exported as runtime.ErrClosed — tells, for any error, that the
	// call met a component that was closed or closing: nothing is known
	// to have been done, and another instance may serve it.
	//
	// The Close rule, the same for every type with a Close method in
	// syncmesh: Close is idempotent. The first call does the work and
	// returns its error; every later call does nothing and returns nil.
	// Every other call on a closed instance returns an error matching
	// ErrClosed.
	ErrClosed = errors.New("syncmesh: closed")
	// ErrDuplicate is returned when a unique record is stored twice.
	ErrDuplicate = errors.New("persistence: duplicate record")
	// ErrNotFound is returned by lookups that require the record to exist.
	ErrNotFound = errors.New("persistence: not found")
	// ErrCorrupt marks a stored record that fails to decode or to open
	// (a damaged sealed record is this error, never "missing").
	ErrCorrupt = errors.New("persistence: corrupt record")
	// ErrLayoutVersion is returned by Open for a file whose layout version
	// is newer than this build knows.
	ErrLayoutVersion = errors.New("persistence: unsupported layout version")
	// ErrLocked is returned (wrapped) by a store's Open when another
	// process holds the file's lock past the configured timeout.
	ErrLocked = errors.New("persistence: store locked by another process")
	// ErrInjected is the error returned at a failpoint armed by a test.
	ErrInjected = errors.New("persistence: injected failure")
)

// ErrLimit is returned (wrapped) by a write that would store more than a
// documented limit; nothing of the write is kept.
var ErrLimit = errors.New("persistence: limit exceeded")

// ErrWatermarkRegression is returned by PutWatermark for an HLC below the
// stored one.
var ErrWatermarkRegression = errors.New("persistence: watermark would move backwards")

// ErrInvalidRecord marks a commit-boundary record a store refuses to write
// (an unknown finalization or discard reason, an invalid address).
var ErrInvalidRecord = errors.New("persistence: invalid record")

// NewClosedError returns a component's own "closed" sentinel: an error
// whose message is msg and which wraps ErrClosed, so it matches both
// itself (errors.Is by identity) and the base.
func NewClosedError(msg string) error { return &closedError{msg: msg} }

type closedError struct{ msg string }

func (e *closedError) Error() string { return e.msg }
func (e *closedError) Unwrap() error { return ErrClosed }
