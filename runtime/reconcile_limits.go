package runtime

import (
	"fmt"
	"time"

	"golang.org/x/time/rate"

	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/messages"
)

// Limits of what one peer can make this node do through reconciliation.
// Work is counted in keys: a key read from the store, fingerprinted,
// listed or compared for the peer. The budget is relative to what the
// node holds, not to what the peer names: per peer and minute,
// responderWorkPerKey passes over the largest group the peer's requests
// reached, plus responderWorkBase. An honest session costs the responder
// at most a few passes over the ranges that differ (a d = 0 session, one
// range sum: no key), so it fits many times over; a peer that names a new
// bound or a fingerprint that never agrees in every request spends it in
// a few requests and is then refused (ErrReconcileLimited) until it
// refills.
const (
	responderWorkPerKey = 16
	responderWorkBase   = 1 << 16
	// responderWorkWindow is how long the full budget takes to refill.
	responderWorkWindow = time.Minute
	// fetchBytesBurst is how many bytes of events one peer may fetch
	// from this node at once: one full fetch reply.
	fetchBytesBurst = messages.MaxReconcileEventBytes
	// fetchBytesPerSec refills it. Fetching the same known keys again
	// and again costs this node at most that rate toward the peer, and
	// each key fetched is also a key of work.
	fetchBytesPerSec = 4 << 20

	// maxSessionFetchBytes bounds the event bytes one session of this
	// node downloads: a responder that names keys of garbage it serves
	// costs at most this much per session (the rest is fetched by the
	// next session, as after Truncated).
	maxSessionFetchBytes = 2 * messages.MaxReconcileEventBytes
	// maxSessionDrops bounds the fetched events one session may see
	// dropped for good (and notified): past it the session fetches no
	// more from that peer. It equals the keys remembered as dropped per
	// peer: beyond them the next session would fetch the same again.
	maxSessionDrops = maxDroppedPerPeer
)

// reconMeter is one peer's budget on this node as a responder.
type reconMeter struct {
	work  *rate.Limiter
	bytes *rate.Limiter
}

// meter returns peer's budget, creating it (bounded: maxReconcilePeers;
// past it an arbitrary peer's is reset, which only gives it a fresh
// burst).
func (r *reconState) meter(peer string) *reconMeter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.meters[peer]; m != nil {
		return m
	}
	if r.meters == nil {
		r.meters = map[string]*reconMeter{}
	}
	if len(r.meters) >= maxReconcilePeers {
		for p := range r.meters {
			delete(r.meters, p)
			break
		}
	}
	m := &reconMeter{
		work:  rate.NewLimiter(workRate(responderWorkBase), responderWorkBase),
		bytes: rate.NewLimiter(rate.Limit(fetchBytesPerSec), fetchBytesBurst),
	}
	r.meters[peer] = m
	return m
}

func workRate(burst int) rate.Limit {
	return rate.Limit(float64(burst) / responderWorkWindow.Seconds())
}

// observe raises the peer's work budget to what a group of n keys
// allows. It only grows (a group that shrinks by eviction keeps the
// larger budget until the peer's meter is forgotten).
func (m *reconMeter) observe(n uint64) {
	b := responderWorkPerKey*int(min(n, 1<<32)) + responderWorkBase
	if b > m.work.Burst() {
		m.work.SetBurst(b)
		m.work.SetLimit(workRate(b))
	}
}

// Ceiling is the highest reconciliation bound this node accepts: its
// clock plus the skew bound (SSP/1 §12). It holds no event above it.
func (s *nodeSource) Ceiling() messages.HLC {
	phys := max(s.n.clock.WallMS(), s.n.clock.Last().Physical()) + apply.MaxSkewMS
	h, err := messages.NewHLC(phys, ^uint16(0))
	if err != nil {
		return messages.HLC(^uint64(0))
	}
	return h
}

// Charge meters n keys of work for the peer of a responder session
// (ErrReconcileLimited past its budget). The initiator's own sessions are
// bounded by the core's per-session budget instead.
func (s *nodeSource) Charge(n int) error {
	if !s.responder {
		return nil
	}
	m := s.n.recon.meter(s.peer)
	if n > m.work.Burst() {
		n = m.work.Burst() // one request's work is at most the whole budget
	}
	if !m.work.AllowN(time.Now(), n) {
		s.n.recon.fault(s.peer, "limited")
		return fmt.Errorf("%w: %s: %d keys of work", ErrReconcileLimited, s.peer, n)
	}
	return nil
}

// chargeBytes meters n bytes of fetched events served to peer.
func (r *reconState) chargeBytes(peer string, n int) bool {
	return r.meter(peer).bytes.AllowN(time.Now(), n)
}

// fault counts one thing a peer did wrong or over its budget.
func (r *reconState) fault(peer, kind string) {
	r.mu.Lock()
	m := r.metrics
	r.mu.Unlock()
	if m != nil {
		m.faults.WithLabelValues(peer, kind).Inc()
	}
}
