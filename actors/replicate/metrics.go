package replicate

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
)

// Metrics are the delivery service's Prometheus metrics.
type Metrics struct {
	pushes  *prometheus.CounterVec // peer, path, result
	offered *prometheus.CounterVec // peer, path
	skipped *prometheus.CounterVec // peer, path
	backlog *prometheus.GaugeVec   // peer, path
	retry   *prometheus.GaugeVec   // peer, path
	lag     *prometheus.GaugeVec   // peer, path
	recv    *prometheus.CounterVec // from, outcome
	refused *prometheus.CounterVec // what (push reason, or claim)
	probes  *prometheus.CounterVec // verdict

	pushRefusals, claimRefusals, quota atomic.Uint64
}

// NewMetrics registers the delivery metrics with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_pushes_total",
			Help: "Pushes sent to peers, by peer name, path and result (ok, error)."}, []string{"peer", "path", "result"}),
		offered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_offered_total",
			Help: "Events offered to peers in pushes that succeeded."}, []string{"peer", "path"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_skipped_total",
			Help: "Events left out of pushes because the peer's watermark showed it applied them."}, []string{"peer", "path"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_backlog_events",
			Help: "Local log entries past the peer's cursor at the last cycle (how far behind the peer is)."}, []string{"peer", "path"}),
		retry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_retry_events",
			Help: "Events the peer held or rejected, waiting to be offered again."}, []string{"peer", "path"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncmesh_sync_peer_watermark_lag_seconds",
			Help: "How far the peer's reported watermarks trail this node's, worst group both report (SSP/1 §14.2), at the last push; absent while no group is reported by both."}, []string{"peer", "path"}),
		recv: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_events_received_total",
			Help: "Events received in pushes, by sender and outcome (applied, duplicate, dropped: final, the watermark may pass them; retry: held or rejected, offered again; held_quota: rejected by the signer's held quota, also counted in retry). Only configured senders have series."}, []string{"from", "outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_refused_total",
			Help: "Pushes refused before anything was kept (unknown_sender, sender_mismatch) and watermark claims refused (claim: another site's group, an undefined or out-of-scope table, or beyond the skew bound). No sender label: a name a peer chooses never creates a series."}, []string{"what"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_sync_probe_verdicts_total",
			Help: "Ranges of senders' probes answered, by verdict (send: leased to that sender; have: held already; busy: leased to another sender)."}, []string{"verdict"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	for _, c := range []**prometheus.CounterVec{&m.pushes, &m.offered, &m.skipped, &m.recv, &m.refused, &m.probes} {
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

// splitKey splits a CursorKey into its peer name and path: two labels,
// not one label packing two dimensions (so queries can aggregate by either). The path is what
// follows the last "@" (a path never holds one; a name may).
func splitKey(key string) (peer, path string) {
	if i := strings.LastIndexByte(key, '@'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return key, ""
}

func (m *Metrics) pushed(key string, r CycleReport) {
	peer, path := splitKey(key)
	if r.Err != nil {
		m.pushes.WithLabelValues(peer, path, "error").Inc()
		return
	}
	m.pushes.WithLabelValues(peer, path, "ok").Inc()
	m.offered.WithLabelValues(peer, path).Add(float64(r.Offered))
	m.skipped.WithLabelValues(peer, path).Add(float64(r.Skipped))
	m.backlog.WithLabelValues(peer, path).Set(float64(r.Tail - r.Through))
	m.retry.WithLabelValues(peer, path).Set(float64(r.Retry))
}

func (m *Metrics) received(from string, r *messages.PushResult, outs []messages.Outcome) {
	// One count per outcome (one count for the three final outcomes would
	// hide which happened). applied + duplicate + dropped is r.Applied.
	var applied, duplicate, dropped, quota int
	for _, o := range outs {
		switch o.Kind {
		case messages.Applied:
			applied++
		case messages.Duplicate:
			duplicate++
		case messages.Dropped:
			dropped++
		case messages.Rejected:
			if o.Reason == messages.ReasonHeldQuota {
				quota++
			}
		}
	}
	m.recv.WithLabelValues(from, "applied").Add(float64(applied))
	m.recv.WithLabelValues(from, "duplicate").Add(float64(duplicate))
	m.recv.WithLabelValues(from, "dropped").Add(float64(dropped))
	m.recv.WithLabelValues(from, "retry").Add(float64(len(r.Retry)))
	if quota > 0 {
		m.recv.WithLabelValues(from, "held_quota").Add(float64(quota))
		m.quota.Add(uint64(quota))
	}
}

func (m *Metrics) probed(verdicts []uint64) {
	for _, v := range verdicts {
		switch v {
		case messages.VerdictSend:
			m.probes.WithLabelValues("send").Inc()
		case messages.VerdictHave:
			m.probes.WithLabelValues("have").Inc()
		case messages.VerdictBusy:
			m.probes.WithLabelValues("busy").Inc()
		}
	}
}

func (m *Metrics) refusedPush(reason string) {
	m.refused.WithLabelValues(reason).Inc()
	m.pushRefusals.Add(1)
}

func (m *Metrics) refusedClaims(n int) {
	m.refused.WithLabelValues("claim").Add(float64(n))
	m.claimRefusals.Add(uint64(n))
}

// RefusedPush counts a push a transport refused before it reached the
// service (for example ErrSenderMismatch).
func (m *Metrics) RefusedPush(reason string) { m.refusedPush(reason) }

// ReceiveStats are the receiver's refusal counters since the node opened.
type ReceiveStats struct {
	// RefusedPushes counts pushes refused before anything was kept
	// (unknown sender, a From the transport did not authenticate).
	RefusedPushes uint64
	// RefusedClaims counts watermark claims refused by the progress rule.
	RefusedClaims uint64
	// HeldQuotaRejections counts events rejected by a signer's held quota.
	HeldQuotaRejections uint64
}

// Stats returns the refusal counters.
func (m *Metrics) Stats() ReceiveStats {
	return ReceiveStats{RefusedPushes: m.pushRefusals.Load(), RefusedClaims: m.claimRefusals.Load(), HeldQuotaRejections: m.quota.Load()}
}

func (m *Metrics) peerLag(key string, seconds float64) {
	peer, path := splitKey(key)
	m.lag.WithLabelValues(peer, path).Set(seconds)
}

// peerLagUnknown removes the peer's lag series: the peer reported no
// watermark for any group this node has one for, so there is no lag to
// state (an absent series, not a number).
func (m *Metrics) peerLagUnknown(key string) {
	peer, path := splitKey(key)
	m.lag.DeleteLabelValues(peer, path)
}
