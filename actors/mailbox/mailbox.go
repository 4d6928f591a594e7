// Package mailbox measures actor mailboxes: a protoactor mailbox
// middleware that keeps a Prometheus gauge of the messages posted to the
// actors of one kind and not yet processed. A growing depth is the first
// sign of an actor that cannot keep up (a slow disk under a committer, a
// flood of pushes under a receiver).
package mailbox

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
)

// Depths is the syncmesh_actor_mailbox_depth_messages gauge, by actor kind. A nil
// *Depths measures nothing.
type Depths struct{ vec *prometheus.GaugeVec }

// NewDepths registers the gauge with reg (nodes sharing a registry share
// it: the depth is then the sum over their actors of each kind).
func NewDepths(reg prometheus.Registerer) (*Depths, error) {
	vec, err := promreg.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "syncmesh", Subsystem: "actor", Name: "mailbox_depth_messages",
		Help: "Messages posted to the actors of a kind and not yet processed.",
	}, []string{"kind"}))
	if err != nil {
		return nil, err
	}
	return &Depths{vec: vec}, nil
}

// Option returns the props option giving an actor of this kind a
// measured unbounded mailbox (no option for a nil *Depths).
func (d *Depths) Option(kind string) actor.PropsOption {
	if d == nil {
		return func(*actor.Props) {}
	}
	return actor.WithMailbox(actor.Unbounded(&depth{g: d.vec.WithLabelValues(kind)}))
}

// depth counts one mailbox's messages into the kind's gauge.
type depth struct{ g prometheus.Gauge }

func (d *depth) MailboxStarted()     {}
func (d *depth) MessagePosted(any)   { d.g.Inc() }
func (d *depth) MessageReceived(any) { d.g.Dec() }
func (d *depth) MailboxEmpty()       {}
