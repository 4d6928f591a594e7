package apply

import "github.com/syncmesh/syncmesh/persistence"

// ErrClosed is returned once the node is closing. It wraps
// persistence.ErrClosed, the base of every closed error.
var ErrClosed = persistence.NewClosedError("syncmesh: node closed")
