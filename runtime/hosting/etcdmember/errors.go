package etcdmember

import "errors"

// Errors of the package.
var (
	// ErrInvalidConfig: the Config is incomplete or wrong.
	ErrInvalidConfig = errors.New("etcdmember: invalid config")
	// ErrLeaseLost: the member's registration is gone (lease expired or
	// revoked, key deleted, or not renewed in time).
	ErrLeaseLost = errors.New("etcdmember: registration lost")
	// ErrNotStarted: no registration is active.
	ErrNotStarted = errors.New("etcdmember: not registered")
)
