package persistence

import "errors"

// Sentinel errors every Store implementation returns (wrapped with %w).
var (
	// ErrClosed is returned by every call on a closed store.
	ErrClosed = errors.New("persistence: store closed")
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
	// ErrInjected is the error returned at a failpoint armed by a test.
	ErrInjected = errors.New("persistence: injected failure")
)
