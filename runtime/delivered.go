package runtime

import (
	"context"
	"sync"
	"time"
)

// Delivered is one delivery handed to DeviceConfig.OnMessage: the message,
// the node to commit or discard it with, and how it was delivered.
type Delivered struct {
	ReceivedMessage
	// Node is the receiving node; Commit and Discard call it.
	Node *Node
	// Deliveries counts the hand-offs of this message to the application,
	// across restarts: 1 the first time. It is persisted with the pending
	// message, in the receive's transaction for a new message or a
	// sender's retry and in one transaction per page for the messages
	// redelivered from the store when the node opens, so a message handed
	// over, left uncommitted and handed over again after a restart has 2.
	// It may count one more than the application saw (a crash between
	// that write and the hand-off), never fewer. A message stored before
	// the count existed counts as handed over once.
	Deliveries int
	// Redelivered is true when the message was received before this node
	// opened (it was pending across a restart, so an earlier process may
	// have handed it over already) or was handed over before by this one.
	Redelivered bool
}

// Commit commits the delivered message (Node.CommitMessage).
func (d Delivered) Commit(ctx context.Context) (CommitResult, error) {
	return d.Node.CommitMessage(ctx, d.ReceivedMessage)
}

// Discard discards the delivered message (Node.DiscardMessage).
func (d Delivered) Discard(ctx context.Context, reason DiscardReason) (CommitResult, error) {
	return d.Node.DiscardMessage(ctx, d.ReceivedMessage, reason)
}

// closedMessages is what Messages returns when no channel feeds the
// application: ranging over it ends at once instead of blocking forever.
var closedMessages = func() chan ReceivedMessage {
	c := make(chan ReceivedMessage)
	close(c)
	return c
}()

// deliveryCounts counts this process's hand-offs per pending message (a
// lower bound of the persisted count); an entry goes when
// the message is committed or discarded through the node, so it holds at
// most the pending messages (which the device bounds).
type deliveryCounts struct {
	mu     sync.Mutex
	n      map[deliveryKey]int
	opened time.Time
	ready  chan struct{} // closed once the node's device is set
}

type deliveryKey struct {
	sender DeviceAddress
	id     MessageID
}

func (c *deliveryCounts) next(m ReceivedMessage) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[deliveryKey]int{}
	}
	k := deliveryKey{m.Sender, m.ID}
	c.n[k]++
	return c.n[k]
}

func (c *deliveryCounts) forget(sender DeviceAddress, id MessageID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.n, deliveryKey{sender, id})
}

// onMessage adapts DeviceConfig.OnMessage to the device's Handler. The
// device may hand over pending messages while Open is still running: the
// adapter waits until the node's device is set, so the handler can commit.
func (n *Node) onMessage(h func(context.Context, Delivered)) func(context.Context, ReceivedMessage) {
	return func(ctx context.Context, m ReceivedMessage) {
		select {
		case <-n.deliveries.ready:
		case <-ctx.Done():
			return
		}
		// The persisted count, or this process's own if it is higher (a
		// hand-off repeated from the store after the delivery queue
		// overflowed writes no count).
		k := max(n.deliveries.next(m), m.Deliveries)
		h(ctx, Delivered{ReceivedMessage: m, Node: n, Deliveries: k,
			Redelivered: k > 1 || m.ReceivedAt.Before(n.deliveries.opened)})
	}
}
