package runtime

import (
	"context"
	"fmt"
	"sync"
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
	mu    sync.Mutex // guards work, replaced when the budget grows
	work  *rate.Limiter
	bytes *rate.Limiter
	now   func() time.Time
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
		now:   r.now,
	}
	if m.now == nil {
		m.now = time.Now
	}
	r.meters[peer] = m
	return m
}

func workRate(burst int) rate.Limit {
	return rate.Limit(float64(burst) / responderWorkWindow.Seconds())
}

// observe raises the peer's work budget to what a group of n keys
// allows, adding the raise to what is left of it. It only grows (a group
// that shrinks by eviction keeps the larger budget until the peer's meter
// is forgotten), so the peer gains tokens only as the node's data grows.
func (m *reconMeter) observe(n uint64) {
	b := responderWorkPerKey*int(min(n, 1<<32)) + responderWorkBase
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.work.Burst()
	if b <= old {
		return
	}
	now := m.now()
	tokens := m.work.TokensAt(now) + float64(b-old)
	w := rate.NewLimiter(workRate(b), b)
	if spent := b - int(tokens); spent > 0 {
		w.AllowN(now, spent)
	}
	m.work = w
}

// allowWork takes n keys of work from the peer's budget (at most the
// whole budget: one request's work is never refused for its size alone).
func (m *reconMeter) allowWork(n int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.work.AllowN(m.now(), min(n, m.work.Burst()))
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
	if !s.n.recon.meter(s.peer).allowWork(n) {
		s.n.recon.fault(s.peer, "limited")
		return fmt.Errorf("%w: %s: %d keys of work", ErrReconcileLimited, s.peer, n)
	}
	return nil
}

// chargeBytes meters n bytes of fetched events served to peer.
func (r *reconState) chargeBytes(peer string, n int) bool {
	m := r.meter(peer)
	return m.bytes.AllowN(m.now(), n)
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

// Kinds of reconciliation requests, for ReconcileRequester.
const (
	// ReconcileRangeRequest carries an encoded messages.Reconcile and is
	// answered with one.
	ReconcileRangeRequest = reconcileKindRange
	// ReconcileFetchRequest carries an encoded messages.ReconcileFetch
	// and is answered with an encoded messages.ReconcileEvents.
	ReconcileFetchRequest = reconcileKindFetch
)

// ReconcileCall sends one reconciliation request of a kind to a peer and
// returns its answer.
type ReconcileCall func(ctx context.Context, kind byte, body []byte) ([]byte, error)

// ReconcileRequester returns a function that sends raw reconciliation
// requests over t, as node from, to peer: for benchmarks and fault
// injection that play a peer (the answering node attributes them as the
// transport does any request). It fails for a transport that does not
// carry reconciliation.
func ReconcileRequester(t Transport, from, peer string) (ReconcileCall, error) {
	rt, ok := t.(reconcileTransport)
	if !ok {
		return nil, ErrReconcileUnsupported
	}
	return func(ctx context.Context, kind byte, body []byte) ([]byte, error) {
		return rt.reconcileCall(ctx, from, peer, kind, body)
	}, nil
}

// InterceptReconcile returns t with the reconciliation requests sent
// through it handed to fn, which may forward them (next), change them, or
// answer itself: for benchmarks and fault injection that play a hostile
// responder. Everything else goes to t unchanged.
func InterceptReconcile(t Transport, fn func(ctx context.Context, kind byte, body []byte, next ReconcileCall) ([]byte, error)) Transport {
	return &interceptedTransport{Transport: t, fn: fn}
}

type interceptedTransport struct {
	Transport
	fn func(ctx context.Context, kind byte, body []byte, next ReconcileCall) ([]byte, error)
}

func (i *interceptedTransport) reconcileCall(ctx context.Context, from, peer string, kind byte, req []byte) ([]byte, error) {
	next := func(ctx context.Context, kind byte, body []byte) ([]byte, error) {
		rt, ok := i.Transport.(reconcileTransport)
		if !ok {
			return nil, ErrReconcileUnsupported
		}
		return rt.reconcileCall(ctx, from, peer, kind, body)
	}
	return i.fn(ctx, kind, req, next)
}

// ServeReconcile answers one reconciliation request a peer (from, as the
// transport authenticated it) sent to this node.
type ServeReconcile func(ctx context.Context, from string, kind byte, body []byte) ([]byte, error)

// InterceptServedReconcile returns n as a push receiver (for Remote.Serve
// or Network.Register) whose answers to reconciliation requests are made
// by fn, which may let n answer (next), change the answer, or answer
// itself: for soaks and fault injection that play a hostile responder
// over a real transport. Pushes, the peer check of the stream guard and
// everything else stay n's own.
func InterceptServedReconcile(n *Node, fn func(ctx context.Context, from string, kind byte, body []byte, next ServeReconcile) ([]byte, error)) Receiver {
	return &interceptedNode{Node: n, fn: fn}
}

type interceptedNode struct {
	*Node
	fn func(ctx context.Context, from string, kind byte, body []byte, next ServeReconcile) ([]byte, error)
}

func (i *interceptedNode) handleReconcile(ctx context.Context, from string, kind byte, req []byte) ([]byte, error) {
	return i.fn(ctx, from, kind, req, i.Node.handleReconcile)
}
