package runtime

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	inboundstore "github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
)

// registerConflictMetric registers syncmesh_delivery_message_conflicts_total
// (one series: its count is bounded whatever the senders send).
func (n *Node) registerConflictMetric() error {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "syncmesh_delivery_message_conflicts_total",
		Help: "Received messages that reused a logical id with another body: refused, not acknowledged (the sender retries them); each also a LogicalMessageConflict notice and a WARN log line."})
	c, err := promreg.Register(n.registerer, c)
	if err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	n.conflicts = c
	l := prometheus.NewCounter(prometheus.CounterOpts{Name: "syncmesh_delivery_lost_sends_acknowledged_total",
		Help: "ACKs of messages this node's store did not know it sent (lost when node.db was rolled back to an older copy; delivered all the same): each also a SentMessageLost notice and a WARN log line."})
	if l, err = promreg.Register(n.registerer, l); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	n.lostAcked = l
	return nil
}

// noteReceived surfaces an ACK of a message the store does not know it
// sent (device.ReceiveResult.UnknownAck): a send a rolled-back store lost,
// which the application must hear of rather than have forgotten.
func (n *Node) noteReceived(r ReceiveResult, err error) error {
	if err == nil && r.UnknownAck {
		if n.lostAcked != nil {
			n.lostAcked.Inc()
		}
		n.log.Warn("delivery: the peer acknowledged a message this store does not hold (lost by a rollback of node.db; it was delivered)",
			"peer", r.Sender.String(), "id", r.ID.String())
		n.publish(messages.SentMessageLost{Peer: r.Sender, ID: r.ID})
	}
	return n.noteReceiveError(err)
}

// noteReceiveError surfaces, at the receiver, a received message that
// reused a logical id with another body: the sender sees only a missing
// ACK and retries for ever, so without this the receiver's operator saw
// nothing at all. Other errors pass through unchanged.
func (n *Node) noteReceiveError(err error) error {
	var ce *inboundstore.ConflictError
	if err == nil || !errors.As(err, &ce) {
		return err
	}
	if n.conflicts != nil {
		n.conflicts.Inc()
	}
	n.log.Warn("delivery: a received message reused a logical id with another body; refused, not acknowledged",
		"from", ce.Sender.String(), "id", ce.ID.String(), "stored_finalized", ce.Finalized)
	n.publish(messages.LogicalMessageConflict{From: ce.Sender, ID: ce.ID, Finalized: ce.Finalized})
	return err
}
