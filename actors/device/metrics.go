package device

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
)

// metrics are the delivery plane's Prometheus metrics. Devices sharing
// one Registerer share the collectors: counters and the pending gauges
// add up over the devices; the oldest-pending timestamp shows the last
// device that reported.
type metrics struct {
	pendingIn  *share
	pendingOut *share
	oldestOut  prometheus.Gauge
	commits    prometheus.Counter
	discards   prometheus.Counter
	pruned     prometheus.Counter
	acksSent   prometheus.Counter
	acksFailed prometheus.Counter
	// undecryptable is labelled by reason only (a closed set): spoofed
	// addresses cannot grow its series.
	undecryptable *prometheus.CounterVec
	// stale counts messages found pending past StaleAfter, by side and
	// reason only (closed sets).
	stale *prometheus.CounterVec
	// skipped is the skipped message keys stored (all peers); evicted
	// counts those the device-wide cap evicted (no peer label).
	skipped *share
	evicted prometheus.Counter
	// dropped counts envelopes a transport could not carry, by side and
	// reason only (closed sets).
	dropped *prometheus.CounterVec
	// repairs counts session repairs by step (a closed set:
	// RepairStarted, RepairFailed, RepairSuppressed, RepairReplaced).
	repairs *prometheus.CounterVec
	// heldSent counts held receipts handed over (receiver side);
	// heldReceipts the ones received, by verdict (a closed set: held,
	// stale, mismatch).
	heldSent     prometheus.Counter
	heldReceipts *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pendingIn: &share{g: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "pending_inbound_messages", Help: "Received messages pending application commit or discard (summed over the devices sharing the registry)."})},
		pendingOut: &share{g: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "pending_outbound_messages", Help: "Sent messages pending the recipient's ACK (summed over the devices sharing the registry)."})},
		oldestOut: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "oldest_pending_outbound_created_timestamp_seconds",
			Help: "When the oldest sent message still waiting for its ACK was sent (Unix seconds; its age is time() minus this); 0 when none waits."}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "commits_total", Help: "Received messages committed by the application (COMMITTED)."}),
		discards: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "discards_total", Help: "Received messages discarded by the application (DISCARDED)."}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "processed_pruned_total", Help: "Processed-ID entries removed by PruneProcessedMessages."}),
		acksSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "acks_sent_total", Help: "ACKs encrypted and handed to the transport."}),
		skipped: &share{g: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "skipped_messages", Help: "Messages skipped in their ratchet chain whose keys are stored, awaiting their late arrival, for all peers (summed over the devices sharing the registry)."})},
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "skipped_messages_evicted_total", Help: "Keys of skipped messages evicted by the device-wide cap (MaxSkippedKeysPerDevice), from the peers holding the most."}),
		acksFailed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "acks_failed_total", Help: "ACKs that could not be encrypted or handed off (the commit stands; ackSent=false)."}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "stale_pending_total", Help: "Messages found pending past StaleAfter, each once per process, by side (received, sent) and reason (uncommitted, unacknowledged, unanswered_initiation, peer_identity_changed)."}, []string{"side", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "envelopes_dropped_total", Help: "Envelopes a transport could not carry, by side (sent: refused at this device's hand-off, the message stays pending for the retry schedule; received: dropped by this node's link queue before the device saw it) and reason (handoff, link_queue_full)."}, []string{"side", "reason"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "session_repairs_total", Help: "Session repairs by step: started (envelopes from a pinned peer on a session this device does not hold, or replays in a row: a fresh initiation was sent), failed, suppressed (rate limit), replaced (a peer's fresh initiation replaced the session here and the pending messages were sent again)."}, []string{"step"}),
		heldSent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "held_receipts_sent_total", Help: "Held receipts sent: a sender's copy of a message still pending this device's application commit was answered with an authenticated receipt, so the sender stops resending it on its short schedule."}),
		heldReceipts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "held_receipts_total", Help: "Held receipts received from recipients, by verdict: held (a pending sent message is now resent only after Retry.HeldInterval), stale (nothing pending under the id), mismatch (the digest names another body: ignored)."}, []string{"verdict"}),
		undecryptable: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "syncmesh", Subsystem: "delivery",
			Name: "undecryptable_envelopes_total", Help: "Received envelopes that could not be decrypted, by reason (malformed, decrypt, identity_changed, budget, unpinned_limit)."}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	for _, g := range []*prometheus.Gauge{&m.pendingIn.g, &m.pendingOut.g, &m.oldestOut, &m.skipped.g} {
		if *g, err = promreg.Register(reg, *g); err != nil {
			return nil, err
		}
	}
	if m.undecryptable, err = promreg.Register(reg, m.undecryptable); err != nil {
		return nil, err
	}
	if m.stale, err = promreg.Register(reg, m.stale); err != nil {
		return nil, err
	}
	if m.dropped, err = promreg.Register(reg, m.dropped); err != nil {
		return nil, err
	}
	if m.repairs, err = promreg.Register(reg, m.repairs); err != nil {
		return nil, err
	}
	if m.heldReceipts, err = promreg.Register(reg, m.heldReceipts); err != nil {
		return nil, err
	}
	for _, c := range []*prometheus.Counter{&m.commits, &m.discards, &m.pruned, &m.acksSent, &m.acksFailed, &m.evicted, &m.heldSent} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// share is one device's part of a gauge shared by the devices on one
// registry: Set moves the gauge by the change of this device's value, so
// the gauge is the sum over the devices.
type share struct {
	g  prometheus.Gauge
	mu sync.Mutex
	v  float64
}

// Set sets this device's value.
func (s *share) Set(v float64) {
	s.mu.Lock()
	d := v - s.v
	s.v = v
	s.mu.Unlock()
	s.g.Add(d)
}
