package runtime

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
)

type metrics struct {
	outcomes    *prometheus.CounterVec
	ignored     prometheus.Counter
	resurrected prometheus.Counter
	partial     prometheus.Counter
	released    prometheus.Counter
	deadLetters prometheus.Counter
	// SSP/1 §13.5 and §12: HLC reuse by a site, events of retired keys.
	equivocations prometheus.Counter
	retiredKey    prometheus.Counter
	mistyped      prometheus.Counter
	noticesMissed prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "events_total",
			Help: "Events through the apply chokepoint, by outcome and reason.",
		}, []string{"outcome", "reason"}),
		ignored: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "ignored_column_events_total",
			Help: "Upserts whose payload named columns the table does not have (SSP/1 §13.6: transient during a schema rollout, a fault if it persists).",
		}),
		resurrected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "resurrections_total",
			Help: "Tombstoned rows brought back by a later upsert.",
		}),
		partial: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "partial_rebuilds_total",
			Help: "Resurrection rebuilds truncated by the eviction horizon.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "held_events_released_total",
			Help: "Held events materialized after their table was defined.",
		}),
		equivocations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "equivocations_total",
			Help: "Events whose (site, HLC) another retained event already carries: the site reused an HLC (resolved by event id).",
		}),
		retiredKey: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "retired_key_events_total",
			Help: "Events of a retired key first received after its retirement (valid at or below the cutoff; possibly a stolen key backdating).",
		}),
		mistyped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "type_mismatch_events_total",
			Help: "Received events with values not of the column type this node declares (kept as received; reads of those cells fail with a type error).",
		}),
		noticesMissed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "sync", Name: "notices_missed_total",
			Help: "Notices not delivered to a Subscribe callback that had fallen NoticeQueue notices behind (it received a NoticesMissed with their count).",
		}),
		deadLetters: newDeadLetters(),
	}
	// Nodes sharing one Registerer share the collectors.
	var err error
	if m.outcomes, err = promreg.Register(reg, m.outcomes); err != nil {
		return nil, err
	}
	for _, c := range []*prometheus.Counter{&m.ignored, &m.resurrected, &m.partial, &m.released, &m.deadLetters, &m.equivocations, &m.retiredKey, &m.mistyped, &m.noticesMissed} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) count(o messages.Outcome) {
	m.outcomes.WithLabelValues(o.Kind.String(), o.Reason.String()).Inc()
}

func (m *metrics) notice(n messages.Notice) {
	switch x := n.(type) {
	case messages.ColumnsIgnored:
		m.ignored.Inc()
	case messages.Resurrection:
		m.resurrected.Inc()
	case messages.PartialRebuild:
		m.partial.Inc()
	case messages.GroupReleased:
		m.released.Add(float64(x.Events))
	case messages.Equivocation:
		m.equivocations.Inc()
	case messages.RetiredKeyEvent:
		m.retiredKey.Inc()
	case messages.TypeMismatch:
		m.mistyped.Inc()
	}
}

func subscribeDeadLetters(sys *actor.ActorSystem, c prometheus.Counter) *eventstream.Subscription {
	return sys.EventStream.SubscribeWithPredicate(func(any) { c.Inc() }, func(evt any) bool {
		_, isDL := evt.(*actor.DeadLetterEvent)
		return isDL
	})
}

// CountDeadLetters counts sys's dead letters in syncmesh_actor_dead_letters_total
// on reg, once per actor system: for a host running many nodes on one
// system it owns (Config.System), where the nodes do not count them. The
// returned stop ends the counting.
func CountDeadLetters(sys *actor.ActorSystem, reg prometheus.Registerer) (stop func(), err error) {
	// Only the dead-letter counter: the node families are registered by the
	// nodes, possibly with a node label this registerer does not carry.
	c, err := promreg.Register(reg, newDeadLetters())
	if err != nil {
		return nil, err
	}
	sub := subscribeDeadLetters(sys, c)
	return func() { sys.EventStream.Unsubscribe(sub) }, nil
}

func newDeadLetters() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "syncmesh", Subsystem: "actor", Name: "dead_letters_total",
		Help: "Messages protoactor could not deliver.",
	})
}
