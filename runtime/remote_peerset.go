package runtime

import "fmt"

// The receiving node's own peer set. A remote authenticates a caller for
// the remote (its certificate is one of the remote's configured peers),
// but a remote may serve several nodes (Host): each responder also
// checks that the caller is a peer of the node it reaches. Pushes and
// probes do so in the node (HandlePush: ErrUnknownSender); reconciliation
// requests (rounds and fetches) here, before the node answers them.

// peerAccepter is a receiver that knows its own peers.
type peerAccepter interface {
	acceptsPeer(name string) bool
}

// acceptsPeer reports whether name is one of the node's peers (AddPeer,
// AcceptPeer).
func (n *Node) acceptsPeer(name string) bool { return n.sync.Accepts(name) }

// peerOfNode refuses a reconciliation request from a caller that is not
// a peer of the node h it is addressed to (SSP/1 §14: a node answers its
// own peers).
func (r *Remote) peerOfNode(h any, from string) error {
	a, ok := h.(peerAccepter)
	if !ok || a.acceptsPeer(from) {
		return nil
	}
	return fmt.Errorf("%w: %q is not a peer of the node addressed", ErrUnknownSender, truncateName(from))
}
