package replicate

import (
	"context"

	"github.com/syncmesh/syncmesh/messages"
)

// Transport carries pushes from this node to its peers (SSP/1 §14). A
// transport path is one Transport; a sender keeps one cursor per peer per
// path.
type Transport interface {
	// Push offers p to peer and returns the peer's result. An error means
	// the push may or may not have been applied: the sender's cursor does
	// not move and the same batch is offered next cycle (SSP/1 §14.1).
	Push(ctx context.Context, peer string, p *messages.SyncPush) (*messages.PushResult, error)
}

// Receiver is a node's side of a transport: it applies a push and answers
// with the result.
type Receiver interface {
	HandlePush(ctx context.Context, p *messages.SyncPush) (*messages.PushResult, error)
}
