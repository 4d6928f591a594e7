package replicate

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
)

// Metrics are the delivery service's Prometheus metrics.
type Metrics struct {
	pushes  *prometheus.CounterVec // peer, result
	offered *prometheus.CounterVec // peer
	skipped *prometheus.CounterVec // peer
	backlog *prometheus.GaugeVec   // peer
	retry   *prometheus.GaugeVec   // peer
	lag     *prometheus.GaugeVec   // peer
	recv    *prometheus.CounterVec // from, verdict
}

// NewMetrics registers the delivery metrics with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_pushes_total",
			Help: "Pushes sent to peers, by peer (name@path) and result (ok, error)."}, []string{"peer", "result"}),
		offered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_offered_total",
			Help: "Events offered to peers in pushes that succeeded."}, []string{"peer"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_skipped_total",
			Help: "Events left out of pushes because the peer's watermark showed it applied them."}, []string{"peer"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_backlog_events",
			Help: "Local log entries past the peer's cursor at the last cycle (how far behind the peer is)."}, []string{"peer"}),
		retry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_retry_events",
			Help: "Events the peer held or rejected, waiting to be offered again."}, []string{"peer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_watermark_lag_seconds",
			Help: "How far the peer's reported watermarks trail this node's, worst group (SSP/1 §14.2), at the last push."}, []string{"peer"}),
		recv: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_received_total",
			Help: "Events received in pushes, by sender and verdict (done: applied, duplicate or dropped; retry: held or rejected)."}, []string{"from", "verdict"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	for _, c := range []**prometheus.CounterVec{&m.pushes, &m.offered, &m.skipped, &m.recv} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	for _, g := range []**prometheus.GaugeVec{&m.backlog, &m.retry, &m.lag} {
		if *g, err = promreg.Register(reg, *g); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func noMetrics() *Metrics {
	m, _ := NewMetrics(nil)
	return m
}

func (m *Metrics) pushed(peer string, r CycleReport) {
	if r.Err != nil {
		m.pushes.WithLabelValues(peer, "error").Inc()
		return
	}
	m.pushes.WithLabelValues(peer, "ok").Inc()
	m.offered.WithLabelValues(peer).Add(float64(r.Offered))
	m.skipped.WithLabelValues(peer).Add(float64(r.Skipped))
	m.backlog.WithLabelValues(peer).Set(float64(r.Tail - r.Through))
	m.retry.WithLabelValues(peer).Set(float64(r.Retry))
}

func (m *Metrics) received(from string, r *messages.PushResult) {
	m.recv.WithLabelValues(from, "done").Add(float64(r.Applied))
	m.recv.WithLabelValues(from, "retry").Add(float64(len(r.Retry)))
}

func (m *Metrics) peerLag(peer string, seconds float64) { m.lag.WithLabelValues(peer).Set(seconds) }
