package syncgroup

import "github.com/syncmesh/syncmesh/persistence"

// ErrStopped is returned by ApplyWith once the router is stopped. It
// wraps persistence.ErrClosed.
var ErrStopped = persistence.NewClosedError("syncgroup: stopped")
