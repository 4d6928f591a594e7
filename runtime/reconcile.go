package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"

	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Bounds of the state reconciliation keeps per peer.
const (
	// maxDroppedPerPeer bounds the keys remembered as dropped for good
	// per peer; past it the oldest are forgotten (they cost a re-fetch
	// and a drop next round, nothing else).
	maxDroppedPerPeer = 4096
	// maxReconcilePeers bounds the peers whose dropped keys are kept.
	maxReconcilePeers = 1024
	// maxFetchReplyBytes keeps a fetch reply under the events limit with
	// room for its framing.
	maxFetchReplyBytes = messages.MaxReconcileEventBytes - 64<<10
)

// Kinds of reconciliation requests on a transport.
const (
	reconcileKindRange byte = 1 // messages.Reconcile → messages.Reconcile
	reconcileKindFetch byte = 2 // messages.ReconcileFetch → messages.ReconcileEvents
)

// ReconcileReport describes one reconciliation with a peer.
type ReconcileReport struct {
	Peer string
	// Rounds are the range messages this node sent (one per round trip).
	Rounds int
	// BytesSent and BytesReceived count the encoded reconciliation
	// messages and fetch replies on the wire.
	BytesSent, BytesReceived int
	// Missing counts the events the peer holds that this node lacked.
	Missing int
	// PeerLacks counts the events this node holds that the peer lacks
	// (the peer fetches them when it reconciles).
	PeerLacks int
	// Fetched counts the events received; Outcomes counts their verdicts
	// at the apply chokepoint.
	Fetched  int
	Outcomes map[messages.OutcomeKind]int
	// Truncated: the session stopped at its bound of found keys; the next
	// reconciliation continues.
	Truncated bool
}

// reconcileTransport is implemented by transports that carry
// reconciliation requests: a request and its reply, attributed by the
// transport to the calling node. from is the caller's name as peer knows
// it; the transport vouches for it (the Network stamps its own, the
// Remote's stream guard checks it against the TLS client certificate).
type reconcileTransport interface {
	reconcileCall(ctx context.Context, from, peer string, kind byte, req []byte) ([]byte, error)
}

// reconcileHandler is the receiving end (a Node).
type reconcileHandler interface {
	handleReconcile(ctx context.Context, from string, kind byte, req []byte) ([]byte, error)
}

// reconcileCall carries a reconciliation request over the in-process
// network. The receiver learns the caller's name from the network, never
// from the message; bytes are copied both ways, as on a wire.
func (t *netTransport) reconcileCall(ctx context.Context, _, peer string, kind byte, req []byte) ([]byte, error) {
	t.n.mu.Lock()
	r, ok := t.n.nodes[peer]
	cut := t.n.cut[pair(t.from, peer)]
	t.n.mu.Unlock()
	switch {
	case !ok:
		return nil, fmt.Errorf("runtime: reconcile: %s is not on the network", peer)
	case cut:
		return nil, fmt.Errorf("runtime: reconcile: %s and %s are partitioned", t.from, peer)
	}
	h, ok := r.(reconcileHandler)
	if !ok {
		return nil, ErrReconcileUnsupported
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := h.handleReconcile(ctx, t.from, kind, bytes.Clone(req))
	return bytes.Clone(out), err
}

// droppedKey is one event dropped for good, as the peer's set names it.
type droppedKey struct {
	group reconcile.Group
	key   reconcile.Key
}

// droppedSet remembers, per peer, the keys of events fetched from it that
// the apply chokepoint dropped for good (SSP/1 §13.6), so the next
// reconciliation counts them as held instead of fetching them again. It
// is cleared when the keyring changes: a drop for an unknown kid may
// apply after Trust.
type droppedSet struct {
	order []droppedKey
	has   map[droppedKey]bool
}

func (d *droppedSet) add(k droppedKey) {
	if d.has[k] {
		return
	}
	if len(d.order) == maxDroppedPerPeer {
		delete(d.has, d.order[0])
		d.order = d.order[1:]
	}
	d.order = append(d.order, k)
	d.has[k] = true
}

// reconState is the node's reconciliation state: the peers' transports
// (from AddPeer), the peers it only accepts pushes from (AcceptPeer) and
// the transport that reaches them (the Network or Remote the node is
// attached to), the dropped keys per peer and the sessions running.
type reconState struct {
	mu      sync.Mutex
	peers   map[string]Transport
	dropped map[string]*droppedSet
	running map[string]bool          // responder sessions per caller
	turns   map[string]chan struct{} // one initiator session per peer at a time
	pending map[string]bool          // background runs wanted (true: one more after the current)
	scope   apply.Scope
	scoped  bool

	accepted map[string]bool // AcceptPeer'd: bounded by configuration
	via      Transport       // attached transport: reaches accepted peers (nil: none)

	last    map[string]reconcile.Status // per added peer: the last session this node started
	gen     uint64                      // keyring generation: bumped when drops are forgotten
	auto    bool                        // triggers and schedule on (Config.ReconcileInterval >= 0)
	stopped bool                        // Close began: no new background run (wg.Add never races wg.Wait)
	metrics *reconMetrics
	wg      sync.WaitGroup // background runs; Close waits for them
	tick    *time.Timer    // the schedule: a timer, not a goroutine per node (an idle hosted device holds none)

	// awaiting: added peers whose reconciliation waits for the new
	// sender to catch up; caught: senders that caught up before their
	// AddPeer got here (peerAdded). Both bounded by the added peers.
	awaiting, caught map[string]bool

	meters map[string]*reconMeter // per peer, as a responder (reconcile_limits.go)
	// now is the meters' clock; nil: time.Now. Tests fix it, so a
	// budget's refill is what they say, not what a loaded machine
	// makes of their loop.
	now func() time.Time
	// v2Only plays a build that speaks only versions 1 and 2 (tests);
	// older: peers that refused version 3, when.
	v2Only bool
	older  map[string]time.Time
	index  keyIndex // the groups' keys (reconcile_index.go)
}

// DefaultReconcileInterval is the schedule of background reconciliation
// with every peer when Config.ReconcileInterval is zero.
const DefaultReconcileInterval = 10 * time.Minute

// reconMetrics are the reconciliation metrics, per peer (peers are the
// ones added with AddPeer: the label is bounded by configuration).
type reconMetrics struct {
	runs    *prometheus.CounterVec // peer, result
	rounds  *prometheus.CounterVec // peer
	bytes   *prometheus.CounterVec // peer, direction
	missing *prometheus.CounterVec // peer
	faults  *prometheus.CounterVec // peer, kind
}

func newReconMetrics(reg prometheus.Registerer) (*reconMetrics, error) {
	m := &reconMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_reconcile_total",
			Help: "Reconciliations this node started, by peer and result (ok, error)."}, []string{"peer", "result"}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_reconcile_round_trips_total",
			Help: "Range-message round trips of reconciliations this node started, by peer."}, []string{"peer"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_reconcile_bytes_total",
			Help: "Encoded reconciliation bytes (range messages, fetches, fetched events), by peer and direction (sent, received)."}, []string{"peer", "direction"}),
		missing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_reconcile_events_missing_total",
			Help: "Events reconciliation found the peer holds and this node lacked, by peer."}, []string{"peer"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_reconcile_peer_faults_total",
			Help: "Reconciliation faults counted against a peer, by kind (fetch_mismatch: a fetched event that is not its key; limited: a request past the peer's budget; drops: a session cut at its dropped events)."}, []string{"peer", "kind"}),
	}
	var err error
	for _, c := range []**prometheus.CounterVec{&m.runs, &m.rounds, &m.bytes, &m.missing, &m.faults} {
		if *c, err = promreg.Register(reg, *c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *reconMetrics) record(rep ReconcileReport, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.runs.WithLabelValues(rep.Peer, result).Inc()
	m.rounds.WithLabelValues(rep.Peer).Add(float64(rep.Rounds))
	m.bytes.WithLabelValues(rep.Peer, "sent").Add(float64(rep.BytesSent))
	m.bytes.WithLabelValues(rep.Peer, "received").Add(float64(rep.BytesReceived))
	m.missing.WithLabelValues(rep.Peer).Add(float64(rep.Missing))
}

// startReconcile sets up metrics and, unless Config.ReconcileInterval is
// negative, the schedule (Open calls it).
func (n *Node) startReconcile() error {
	m, err := newReconMetrics(n.registerer)
	if err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	interval := n.cfg.ReconcileInterval
	if interval == 0 {
		interval = DefaultReconcileInterval
	}
	n.recon.mu.Lock()
	n.recon.metrics, n.recon.auto = m, interval > 0
	n.recon.mu.Unlock()
	if interval <= 0 {
		return nil
	}
	run := func() {
		r := &n.recon
		r.mu.Lock()
		if r.stopped || n.isClosed() {
			r.mu.Unlock()
			return
		}
		r.wg.Add(1) // before stopped is set, so before Close's Wait
		r.mu.Unlock()
		defer r.wg.Done()
		n.reconcileAllInBackground()
		r.mu.Lock()
		if !r.stopped {
			r.tick.Reset(interval)
		}
		r.mu.Unlock()
	}
	n.recon.mu.Lock()
	n.recon.tick = time.AfterFunc(interval, run)
	n.recon.mu.Unlock()
	return nil
}

// stopReconcile waits for background reconciliations (Close calls it
// after marking the node closed, before the actors stop).
func (n *Node) stopReconcile() {
	n.recon.mu.Lock()
	n.recon.stopped = true
	if n.recon.tick != nil {
		n.recon.tick.Stop()
	}
	n.recon.mu.Unlock()
	n.recon.wg.Wait()
}

// reconcileAllInBackground reconciles with every peer this node can
// receive from: the added ones and the accepted ones it can reach (a
// receive-only link repairs by pulling, SSP/1 §14.1: reconciliation is
// independent of who pushes to whom).
func (n *Node) reconcileAllInBackground() {
	for _, p := range n.recon.reachable() {
		n.reconcileInBackground(p)
	}
}

// reachable lists the peers a reconciliation can run with: the added
// peers, and the accepted ones when a transport reaches them.
func (r *reconState) reachable() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	peers := make([]string, 0, len(r.peers)+len(r.accepted))
	for p := range r.peers {
		peers = append(peers, p)
	}
	if r.via != nil {
		rt, _ := r.via.(interface{ reaches(string) bool })
		for p := range r.accepted {
			if _, added := r.peers[p]; !added && (rt == nil || rt.reaches(p)) {
				peers = append(peers, p)
			}
		}
	}
	return peers
}

// attachTransport is called by the Network (Register) and the Remote
// (Serve, Host) that deliver this node's pushes: the same transport
// reaches the peers it accepts pushes from, so a receive-only node can
// pull what it lacks from them by reconciliation.
func (n *Node) attachTransport(t Transport) {
	if _, ok := t.(reconcileTransport); !ok {
		return
	}
	n.recon.mu.Lock()
	n.recon.via = t
	n.recon.mu.Unlock()
}

// peerAccepted runs after AcceptPeer: the peer is reconciled with on the
// same triggers as an added one (Trust, DefineTable, the schedule), and
// at once when this node was opened from a restore.
func (n *Node) peerAccepted(peer string) {
	r := &n.recon
	r.mu.Lock()
	if r.accepted == nil {
		r.accepted = map[string]bool{}
	}
	r.accepted[peer] = true
	r.mu.Unlock()
	if n.restoring() {
		n.reconcileInBackground(peer)
	}
}

// reconcileInBackground runs a reconciliation with peer off the caller's
// goroutine; asked again while one runs, it runs once more after it (a
// Trust during a session must not be lost to that session's snapshot).
func (n *Node) reconcileInBackground(peer string) {
	r := &n.recon
	r.mu.Lock()
	if !r.auto || r.stopped {
		r.mu.Unlock()
		return
	}
	if r.pending == nil {
		r.pending = map[string]bool{}
	}
	if _, running := r.pending[peer]; running {
		r.pending[peer] = true
		r.mu.Unlock()
		return
	}
	r.pending[peer] = false
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-n.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		retry := reconRetryMin
		for {
			_, err := n.Reconcile(ctx, peer)
			if err != nil && !n.isClosed() {
				n.log.Info("reconciliation failed", "peer", peer, "err", err)
			}
			if retryReconcile(err) && !n.isClosed() {
				// A failed trigger (a peer not answering yet at Open, busy,
				// not yet configured for us) is tried again with backoff
				// until it succeeds, not left to the schedule: a restored
				// node's writes wait for it. One sleeping run per peer.
				d := retry/2 + rand.N(retry/2+1) // jitter: peers restarted together do not retry in step
				retry = min(2*retry, reconRetryMax)
				t := time.NewTimer(d)
				select {
				case <-t.C:
					continue
				case <-n.closed:
					t.Stop()
				}
			}
			r.mu.Lock()
			again := r.pending[peer] && !r.stopped
			if !again {
				delete(r.pending, peer)
			} else {
				r.pending[peer] = false
			}
			r.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// Backoff of a failed background reconciliation (with jitter).
const (
	reconRetryMin = 500 * time.Millisecond
	reconRetryMax = 30 * time.Second
)

// retryReconcile reports whether a background reconciliation that failed
// with err is tried again: not when it succeeded, the node is closing, the
// peer is unknown or cannot reconcile, or the peer broke the protocol
// (that waits for the schedule: a hostile peer gets no faster loop).
func retryReconcile(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrClosed), errors.Is(err, ErrUnknownPeer),
		errors.Is(err, ErrReconcileUnsupported), errors.Is(err, ErrReconcilePeer):
		return false
	}
	return true
}

// trusted runs after Trust stored a key: drops remembered for an unknown
// kid may apply now, so they are forgotten, and a key that verifies more
// than before (new, or its retirement cutoff lifted or raised) starts a
// reconciliation with every peer this node receives from (events dropped
// before it come back, whichever way the link pushes).
func (n *Node) trusted(widened bool) {
	n.recon.forgetDrops()
	if widened {
		n.reconcileAllInBackground()
	}
}

// turn waits for peer's initiator turn (one session per peer at a time).
func (r *reconState) turn(ctx context.Context, peer string) (release func(), err error) {
	r.mu.Lock()
	if r.turns == nil {
		r.turns = map[string]chan struct{}{}
	}
	c := r.turns[peer]
	if c == nil {
		c = make(chan struct{}, 1)
		r.turns[peer] = c
	}
	r.mu.Unlock()
	select {
	case c <- struct{}{}:
		return func() { <-c }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *reconState) addPeer(peer string, t Transport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.peers == nil {
		r.peers = map[string]Transport{}
	}
	r.peers[peer] = t
}

// peerAdded runs after AddPeer: reconcile with the new peer once the new
// sender first offered it the whole log (senderCaughtUp), or at once when
// senders run only through SyncNow or this node was opened from a restore
// (its log rotated or its clock held: what the copy lost comes back from
// the peers before its log is pushed again). While a peer catches up, the
// two sets differ by the log still being pushed: the session would load
// every key of it to learn what the pushes deliver anyway (catching up
// from genesis, one key load of the whole log per added peer). Caught up,
// the range sums agree in one round unless the peer holds more. A sender
// that never catches up (the peer refuses or cannot be reached) leaves
// the peer to the schedule (Config.ReconcileInterval).
func (n *Node) peerAdded(peer string, t Transport) {
	n.recon.addPeer(peer, t)
	if n.cfg.SyncInterval < 0 || n.restoring() || n.recon.awaitCatchUp(peer) {
		n.reconcileInBackground(peer)
	}
}

// restoring reports an Open from a restore: the log was rotated, or the
// clock waits for a reconciliation (restore.go).
func (n *Node) restoring() bool {
	n.restore.mu.Lock()
	rotated := n.restore.status.LogRotated
	n.restore.mu.Unlock()
	select {
	case <-n.clock.Released():
		return rotated
	default:
		return true
	}
}

// awaitCatchUp makes peer's reconciliation wait for its sender to catch
// up; it reports true (reconcile now) when that happened already.
func (r *reconState) awaitCatchUp(peer string) (now bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.caught[peer] {
		delete(r.caught, peer)
		return true
	}
	if r.awaiting == nil {
		r.awaiting = map[string]bool{}
	}
	r.awaiting[peer] = true
	return false
}

// senderCaughtUp is replicate's Deps.CaughtUp: a sender toward peer
// offered it the whole log; the reconciliation its AddPeer deferred runs.
func (n *Node) senderCaughtUp(peer string) {
	r := &n.recon
	r.mu.Lock()
	wait := r.awaiting[peer]
	delete(r.awaiting, peer)
	if !wait {
		if r.caught == nil {
			r.caught = map[string]bool{}
		}
		r.caught[peer] = true
	}
	r.mu.Unlock()
	if wait {
		n.reconcileInBackground(peer)
	}
}

// transport returns the transport that reaches peer for reconciliation:
// AddPeer's, or for an accepted peer the attached one.
func (r *reconState) transport(peer string) (Transport, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.peers[peer]; ok {
		return t, true
	}
	if r.accepted[peer] && r.via != nil {
		if rt, ok := r.via.(interface{ reaches(string) bool }); ok && !rt.reaches(peer) {
			return nil, false // a Remote without the peer's address: nothing to retry
		}
		return r.via, true
	}
	return nil, false
}

// generation returns the keyring generation a session starts in.
func (r *reconState) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

// drop records k as dropped for good, unless the keyring changed since
// the session began (gen): a drop decided before a Trust must not hide the
// event from the reconciliation that Trust starts.
func (r *reconState) drop(peer string, gen uint64, k droppedKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen {
		return
	}
	if r.dropped == nil {
		r.dropped = map[string]*droppedSet{}
	}
	d := r.dropped[peer]
	if d == nil {
		if len(r.dropped) >= maxReconcilePeers {
			for p := range r.dropped { // forget an arbitrary peer's set
				delete(r.dropped, p)
				break
			}
		}
		d = &droppedSet{has: map[droppedKey]bool{}}
		r.dropped[peer] = d
	}
	d.add(k)
}

// droppedIn returns the peer's dropped keys of g at or above min.
func (r *reconState) droppedIn(peer string, g reconcile.Group, min messages.HLC) []reconcile.Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.dropped[peer]
	if d == nil {
		return nil
	}
	var out []reconcile.Key
	for _, k := range d.order {
		if k.group == g && k.key.HLC() >= min {
			out = append(out, k.key)
		}
	}
	return out
}

// forgetDrops clears every peer's dropped keys (the keyring changed).
func (r *reconState) forgetDrops() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped = nil
	r.gen++
}

// begin marks a session with peer running (one at a time per peer, in
// each role, so a peer cannot make the node load its sets concurrently).
func (r *reconState) begin(role, peer string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[string]bool{}
	}
	if r.running[role+"\x00"+peer] {
		return fmt.Errorf("%w: %s", ErrReconcileBusy, peer)
	}
	r.running[role+"\x00"+peer] = true
	return nil
}

func (r *reconState) end(role, peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running, role+"\x00"+peer)
}

func (n *Node) reconScope() apply.Scope {
	n.recon.mu.Lock()
	defer n.recon.mu.Unlock()
	if !n.recon.scoped {
		// Validated by Open; cannot fail here.
		n.recon.scope, _ = apply.ParseScope(n.cfg.Scope)
		n.recon.scoped = true
	}
	return n.recon.scope
}

// nodeSource is the node's side of a reconciliation with one peer: the
// tables it defines and syncs (a peer cannot make it enumerate any
// other), their horizons, and their retained event keys plus the keys
// dropped for good from that peer.
type nodeSource struct {
	ctx   context.Context
	n     *Node
	peer  string
	scope apply.Scope
	// responder: the peer's requests are metered (reconcile_limits.go).
	responder bool
}

func (s *nodeSource) Horizon(g reconcile.Group) (h messages.HLC, ok bool, err error) {
	if !s.scope.Contains(g.Schema, g.Table) {
		return 0, false, nil
	}
	err = s.n.store.View(s.ctx, func(tx persistence.SyncReader) error {
		t := persistence.TableKey{Schema: g.Schema, Table: g.Table}
		if _, ok, err = tx.Table(t); err != nil || !ok {
			return err
		}
		h, err = tx.Horizon(t)
		return err
	})
	return h, ok, err
}

// Keys returns a view of g's keys from min up: the in-memory index
// (reconcile_index.go), brought up to date from the log, plus the peer's
// dropped keys the store does not hold. A responder is charged the events
// read to bring the index up to date (none while it is current): what a
// request costs is the ranges it asks about, charged by the core.
func (s *nodeSource) Keys(g reconcile.Group, min messages.HLC) (reconcile.View, error) {
	var v reconcile.View
	dropped := s.n.recon.droppedIn(s.peer, g, min)
	err := s.n.store.View(s.ctx, func(tx persistence.SyncReader) error {
		t := persistence.TableKey{Schema: g.Schema, Table: g.Table}
		h, err := tx.Horizon(t)
		if err != nil {
			return err
		}
		all, err := tx.TableEventSum(t, h)
		if err != nil {
			return err
		}
		if s.responder {
			// The group's size (from the per-site records) sets the
			// peer's budget.
			s.n.recon.meter(s.peer).observe(all.Count)
		}
		var read uint64
		v, read, err = s.n.recon.index.view(tx, g, h, max(h, min), all.Count)
		if err != nil {
			return err
		}
		if s.responder && read > 0 {
			if err := s.Charge(int(read)); err != nil {
				return err
			}
		}
		var extra []reconcile.Key
		for _, k := range dropped {
			if _, held, err := tx.Event(k.Site(), k.HLC(), k.ID()); err != nil {
				return err
			} else if !held { // a set lists each key once
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			v = &withDropped{v: v, extra: reconcile.NewSet(extra).Keys()}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Sum returns the count and LtHash16 of the keys Keys lists. From the
// horizon it is the store's range sum (per-site records kept in the
// transactions that change the events, so no event is read) plus the
// peer's dropped keys the store does not hold; from a bound above the
// horizon, the index's range sum (O(sites · log n), charged as its
// expansions).
func (s *nodeSource) Sum(g reconcile.Group, min messages.HLC) (uint64, lthash.Sum, error) {
	var (
		total persistence.RangeSum
		above bool
	)
	dropped := s.n.recon.droppedIn(s.peer, g, min)
	err := s.n.store.View(s.ctx, func(tx persistence.SyncReader) error {
		t := persistence.TableKey{Schema: g.Schema, Table: g.Table}
		h, err := tx.Horizon(t)
		if err != nil {
			return err
		}
		if min > h {
			above = true
			return nil
		}
		if s.responder {
			all, err := tx.TableEventSum(t, h)
			if err != nil {
				return err
			}
			s.n.recon.meter(s.peer).observe(all.Count)
		}
		if total, err = tx.TableEventSum(t, min); err != nil {
			return err
		}
		for _, k := range dropped {
			_, held, err := tx.Event(k.Site(), k.HLC(), k.ID())
			if err != nil {
				return err
			}
			if !held { // a set lists each key once
				total.Add(persistence.EventKey{Site: k.Site(), HLC: k.HLC(), ID: k.ID()})
			}
		}
		return nil
	})
	if err != nil || !above {
		return total.Count, total.Sum, err
	}
	v, err := s.Keys(g, min)
	if err != nil {
		return 0, lthash.Sum{}, err
	}
	n, sum, cost := v.RangeSum(nil, nil)
	if s.responder {
		if err := s.Charge(reconcile.ExpandWeight * cost); err != nil {
			return 0, lthash.Sum{}, err
		}
	}
	return n, sum, nil
}

// syncedGroups lists the tables this node defines and syncs.
func (n *Node) syncedGroups(ctx context.Context) ([]reconcile.Group, error) {
	defs, err := n.Tables(ctx)
	if err != nil {
		return nil, err
	}
	scope := n.reconScope()
	var out []reconcile.Group
	for _, d := range defs {
		if scope.Contains(d.Schema, d.Table) {
			out = append(out, reconcile.Group{Schema: d.Schema, Table: d.Table})
		}
	}
	return out, nil
}

func peerErr(peer string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrReconcilePeer, peer, err)
}

// Reconcile finds, by range-based set reconciliation, the events peer
// holds that this node lacks in the tables both sync (from the higher of
// the two horizons up), fetches them and feeds them to the apply
// chokepoint like any push: signatures checked, drops final, held groups
// held (SSP/1 §12, §13.6). It never reads, initialises or advances a
// cursor or a watermark (§14.1). peer must have been added with AddPeer,
// or accepted with AcceptPeer on a node attached to a Network (Register)
// or a Remote (Serve, Host, Config.Remote): a receive-only node pulls
// over the transport that delivers its pushes. Events this node holds and
// peer lacks are counted, and peer fetches them when it reconciles.
func (n *Node) Reconcile(ctx context.Context, peer string) (ReconcileReport, error) {
	rep := ReconcileReport{Peer: peer, Outcomes: map[messages.OutcomeKind]int{}}
	if n.isClosed() {
		return rep, ErrClosed
	}
	t, ok := n.recon.transport(peer)
	if !ok {
		return rep, fmt.Errorf("%w: %s", ErrUnknownPeer, peer)
	}
	rt, ok := t.(reconcileTransport)
	if !ok {
		return rep, fmt.Errorf("%w: %s", ErrReconcileUnsupported, peer)
	}
	release, err := n.recon.turn(ctx, peer)
	if err != nil {
		return rep, err
	}
	defer release()
	n.recon.mu.Lock()
	m := n.recon.metrics
	n.recon.mu.Unlock()
	start := time.Now()
	var ev []groupEvidence
	rep, ev, err = n.reconcile(ctx, rt, peer, rep)
	m.record(rep, err)
	n.restoreReconciled(ctx, rep, ev, err) // restore.go: may release a held clock
	n.recon.setLast(peer, reconcile.Status{At: time.Now(), Took: time.Since(start), Rounds: rep.Rounds,
		BytesSent: rep.BytesSent, BytesReceived: rep.BytesReceived, Missing: rep.Missing, Fetched: rep.Fetched, Err: err})
	return rep, err
}

// setLast records the last session with peer (an added peer: bounded by
// configuration, like the metric labels).
func (r *reconState) setLast(peer string, st reconcile.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]reconcile.Status{}
	}
	r.last[peer] = st
}

// withLastReconcile fills in each status's last reconciliation with its
// peer (Peers calls it).
func (n *Node) withLastReconcile(ps []PeerStatus) []PeerStatus {
	n.recon.mu.Lock()
	defer n.recon.mu.Unlock()
	for i := range ps {
		ps[i].LastReconcile = ReconcileStatus(n.recon.last[ps[i].Peer])
	}
	return ps
}

// groupEvidence is what one session learned of a group from the peer: it
// answered the group (it syncs the table: silence is not agreement), and
// how many events the peer holds in it from the bound up.
type groupEvidence struct {
	group     reconcile.Group
	peerCount uint64
}

func (n *Node) reconcile(ctx context.Context, rt reconcileTransport, peer string, rep ReconcileReport) (ReconcileReport, []groupEvidence, error) {
	gen := n.recon.generation() // before anything is fetched
	groups, err := n.syncedGroups(ctx)
	if err != nil {
		return rep, nil, err
	}
	src := &nodeSource{ctx: ctx, n: n, peer: peer, scope: n.reconScope()}
	answered := map[reconcile.Group]bool{}
	sess, err := n.reconcileRounds(ctx, rt, peer, src, groups, &rep, func(g messages.ReconcileGroup) {
		answered[reconcile.Group{Schema: g.Schema, Table: g.Table}] = true
	})
	if err != nil {
		return rep, nil, err
	}
	rep.Truncated = sess.Truncated()
	var fs fetchSession
	found := map[reconcile.Group]reconcile.Found{}
	for _, f := range sess.Found() {
		found[f.Group] = f
		rep.Missing += len(f.Need)
		rep.PeerLacks += len(f.Have)
		for len(f.Need) > 0 {
			if fs.bytes >= maxSessionFetchBytes || fs.drops >= maxSessionDrops {
				// Bounded download per session: the rest waits for
				// the next one.
				if fs.drops >= maxSessionDrops {
					n.recon.fault(peer, "drops")
				}
				rep.Truncated = true
				break
			}
			chunk := f.Need[:min(len(f.Need), messages.MaxReconcileKeys)]
			f.Need = f.Need[len(chunk):]
			if err := n.fetchMissing(ctx, rt, peer, gen, f.Group, chunk, &rep, &fs); err != nil {
				return rep, nil, err
			}
		}
	}
	var ev []groupEvidence
	for g := range answered {
		bound, ok := sess.Bound(g)
		if !ok {
			continue
		}
		// The peer's count from ours and the differences (the range sum
		// reads no event): it held what we hold, less what it lacks, plus
		// what we lacked.
		ours, _, err := src.Sum(g, bound)
		if err != nil {
			return rep, nil, err
		}
		f := found[g]
		held := ours + uint64(len(f.Need))
		held -= min(held, uint64(len(f.Have)))
		ev = append(ev, groupEvidence{group: g, peerCount: held})
	}
	n.log.Debug("reconciled", "peer", peer, "rounds", rep.Rounds, "missing", rep.Missing, "fetched", rep.Fetched)
	return rep, ev, nil
}

// fetchSession is what one session fetched so far (its bounds:
// maxSessionFetchBytes, maxSessionDrops).
type fetchSession struct{ bytes, drops int }

// fetchMissing asks peer for the events of keys (one group, sorted) and
// applies what comes back. Every event must be the one its key names: its
// id hashes to a key asked for (at most once), and its site, HLC and table
// are the key's and the group's. A reply with anything else is the peer's
// ErrReconcileFetchMismatch, counted against it, and nothing of it applies
// (an event the node holds, offered under another key, would otherwise be
// fetched and verified again every session).
func (n *Node) fetchMissing(ctx context.Context, rt reconcileTransport, peer string, gen uint64, g reconcile.Group, keys []reconcile.Key, rep *ReconcileReport, fs *fetchSession) error {
	keys = reconcile.NewSet(keys).Keys()
	req, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: g.Schema, Table: g.Table, Keys: keys}}})
	if err != nil {
		return err
	}
	rep.BytesSent += len(req)
	raw, err := rt.reconcileCall(ctx, n.name, peer, reconcileKindFetch, req)
	if err != nil {
		return err
	}
	rep.BytesReceived += len(raw)
	fs.bytes += len(raw)
	evs, err := messages.DecodeReconcileEvents(raw)
	if err != nil {
		return peerErr(peer, err)
	}
	got, err := matchFetched(g, keys, evs.Events)
	if err != nil {
		n.recon.fault(peer, "fetch_mismatch")
		return fmt.Errorf("%w: %s: %w", ErrReconcileFetchMismatch, peer, err)
	}
	if len(evs.Events) == 0 {
		return nil
	}
	outs, err := n.applyReceived(ctx, evs.Events) // restore.go: own events the store lost are evidence of a restore
	if err != nil {
		return err
	}
	rep.Fetched += len(outs)
	for i, o := range outs {
		rep.Outcomes[o.Kind]++
		if o.Kind == messages.Dropped {
			fs.drops++
			n.recon.drop(peer, gen, droppedKey{group: g, key: got[i]})
		}
	}
	return nil
}

// matchFetched returns the key each fetched event answers, checking that
// the event is the one the key names: its id is a key's (each key at most
// once), and its site and HLC, read from its payload (unauthenticated
// here; the chokepoint verifies the signature over the same payload), are
// that key's, and its table is g. An event whose payload does not parse
// cannot be matched: an honest peer stores only verified events.
func matchFetched(g reconcile.Group, keys []reconcile.Key, events [][]byte) ([]reconcile.Key, error) {
	asked := make(map[messages.EventID]reconcile.Key, len(keys))
	for _, k := range keys {
		asked[k.ID()] = k
	}
	got := make([]reconcile.Key, len(events))
	for i, e := range events {
		id := eventid.Of(e)
		k, ok := asked[id]
		if !ok {
			return nil, fmt.Errorf("event %v not asked for (or twice)", id)
		}
		delete(asked, id)
		ev, err := sign.ParseVerified(e)
		if err != nil {
			return nil, fmt.Errorf("event %v: %w", id, err)
		}
		if ev.Site != k.Site() || ev.HLC != k.HLC() || ev.Schema != g.Schema || ev.Table != g.Table {
			return nil, fmt.Errorf("event %v is (%v, %v, %s.%s), asked as (%v, %v, %v)", id, ev.Site, ev.HLC, ev.Schema, ev.Table, k.Site(), k.HLC(), g)
		}
		got[i] = k
	}
	return got, nil
}

// reconcileRounds runs the range rounds of one session with peer over
// groups and returns the finished session; answered is called with each
// group of each answer. It speaks version 3 (fingerprints of large ranges
// from range sums) unless peer refused it lately: a peer that answers the
// first version-3 round with an unsupported version (a build that speaks
// only versions 1 and 2) gets the session again in version 2, and
// version 2 for an hour after.
func (n *Node) reconcileRounds(ctx context.Context, rt reconcileTransport, peer string, src *nodeSource, groups []reconcile.Group, rep *ReconcileReport, answered func(messages.ReconcileGroup)) (*reconcile.Session, error) {
	version := n.recon.peerVersion(peer)
	sess, msg, err := reconcile.NewSessionVersion(src, slices.Clone(groups), version)
	if err != nil {
		return nil, err
	}
	for msg != nil {
		req, err := messages.EncodeReconcile(msg)
		if err != nil {
			return nil, err
		}
		rep.Rounds++
		rep.BytesSent += len(req)
		raw, err := rt.reconcileCall(ctx, n.name, peer, reconcileKindRange, req)
		if err != nil && sess.Rounds() == 1 && version >= messages.ReconcileRangeSumVersion && versionRefused(err) {
			n.log.Info("reconcile: peer does not speak version 3, falling back to 2", "peer", peer)
			n.recon.olderPeer(peer)
			version = messages.ReconcileSumVersion
			if sess, msg, err = reconcile.NewSessionVersion(src, slices.Clone(groups), version); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		rep.BytesReceived += len(raw)
		in, err := messages.DecodeReconcile(raw)
		if err != nil {
			return nil, peerErr(peer, err)
		}
		for _, g := range in.Groups {
			answered(g)
		}
		if msg, err = sess.Step(in); err != nil {
			if errors.Is(err, reconcile.ErrProtocol) || errors.Is(err, reconcile.ErrTooManyRounds) {
				return nil, peerErr(peer, err)
			}
			return nil, err
		}
	}
	return sess, nil
}

// versionRefused reports whether a peer refused a request for its
// version: in process the decoder's typed error; over the remote an
// invalid request, whose reason is the peer's error text.
func versionRefused(err error) bool {
	return errors.Is(err, messages.ErrUnsupportedVersion) ||
		(errors.Is(err, ErrReconcileRefused) && strings.Contains(err.Error(), messages.ErrUnsupportedVersion.Error()))
}

// olderVersionFor is how long a peer that refused version 3 is spoken to
// in version 2 before version 3 is tried again (it may have been
// upgraded).
const olderVersionFor = time.Hour

// peerVersion returns the reconciliation version to speak to peer.
func (r *reconState) peerVersion(peer string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.older[peer]; ok && time.Since(at) < olderVersionFor {
		return messages.ReconcileSumVersion
	}
	if r.v2Only {
		return messages.ReconcileSumVersion
	}
	return messages.ReconcileRangeSumVersion
}

// playsV2 reports the v2Only test knob.
func (r *reconState) playsV2() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.v2Only
}

// olderPeer records that peer refused version 3 (an added or accepted
// peer: bounded by configuration).
func (r *reconState) olderPeer(peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.older == nil {
		r.older = map[string]time.Time{}
	}
	r.older[peer] = time.Now()
}

// handleReconcile answers a peer's reconciliation request. from is the
// transport's attribution of the caller. A malformed or oversized request
// is a typed error for that caller only and changes nothing.
func (n *Node) handleReconcile(ctx context.Context, from string, kind byte, req []byte) ([]byte, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	if err := n.recon.begin("responder", from); err != nil {
		return nil, err
	}
	defer n.recon.end("responder", from)
	src := &nodeSource{ctx: ctx, n: n, peer: from, scope: n.reconScope(), responder: true}
	switch kind {
	case reconcileKindRange:
		in, err := messages.DecodeReconcile(req)
		if err == nil && in.SumRanges && n.recon.playsV2() {
			// Tests: a build that speaks only versions 1 and 2.
			in, err = nil, fmt.Errorf("%w: version %d", messages.ErrUnsupportedVersion, messages.ReconcileRangeSumVersion)
		}
		if err != nil {
			return nil, peerErr(from, err)
		}
		out, err := reconcile.Respond(src, in)
		if err != nil {
			if errors.Is(err, reconcile.ErrProtocol) {
				return nil, peerErr(from, err)
			}
			return nil, err
		}
		if out, err = answerAgreed(src, in, out); err != nil {
			return nil, err
		}
		return messages.EncodeReconcile(out)
	case reconcileKindFetch:
		f, err := messages.DecodeReconcileFetch(req)
		if err != nil {
			return nil, peerErr(from, err)
		}
		evs, err := n.serveFetch(ctx, src, f)
		if err != nil {
			return nil, err
		}
		return messages.EncodeReconcileEvents(evs)
	}
	return nil, peerErr(from, fmt.Errorf("request kind %d", kind))
}

// answerAgreed names, in the answer, every group of the request this node
// syncs and whose ranges all agreed, with one skip range over the whole
// group: the initiator takes it as finished, like a group left out, but
// can tell "compared and equal" from "not synced here" — silence, which a
// restored node must never take for agreement (restore.go). Groups stay
// in ascending order; there are no more of them than in the request, and
// the answer's budget keeps one range per group in reserve.
func answerAgreed(src *nodeSource, in, out *messages.Reconcile) (*messages.Reconcile, error) {
	present := make(map[reconcile.Group]bool, len(out.Groups))
	for _, g := range out.Groups {
		present[reconcile.Group{Schema: g.Schema, Table: g.Table}] = true
	}
	merged := make([]messages.ReconcileGroup, 0, len(in.Groups))
	i := 0
	for _, ig := range in.Groups {
		g := reconcile.Group{Schema: ig.Schema, Table: ig.Table}
		if present[g] {
			for i < len(out.Groups) && (out.Groups[i].Schema != ig.Schema || out.Groups[i].Table != ig.Table) {
				i++
			}
			if i < len(out.Groups) {
				merged = append(merged, out.Groups[i])
			}
			continue
		}
		if _, ok, err := src.Horizon(g); err != nil {
			return nil, err
		} else if !ok {
			continue // not synced here: left out
		}
		// Respond restarts a group at a higher own horizon, so an agreed
		// group's bound is the request's.
		merged = append(merged, messages.ReconcileGroup{Schema: ig.Schema, Table: ig.Table, Bound: ig.Bound,
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeSkip}}})
	}
	return &messages.Reconcile{Groups: merged, SumRanges: in.SumRanges}, nil
}

// serveFetch reads the signed events a fetch asks for, only from tables
// this node syncs and at or above their horizon: a key outside them, or
// naming an event of another table, is answered with nothing.
func (n *Node) serveFetch(ctx context.Context, src *nodeSource, f *messages.ReconcileFetch) (*messages.ReconcileEvents, error) {
	out := &messages.ReconcileEvents{}
	size := 0
	limited := false
	for _, fg := range f.Groups {
		g := reconcile.Group{Schema: fg.Schema, Table: fg.Table}
		h, ok, err := src.Horizon(g)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		// Each key costs a read: metered like range work, against a
		// budget set by the group's size.
		count, _, err := src.Sum(g, h)
		if err != nil {
			return nil, err
		}
		n.recon.meter(src.peer).observe(count)
		if err := src.Charge(len(fg.Keys)); err != nil {
			return nil, err
		}
		err = n.store.View(ctx, func(tx persistence.SyncReader) error {
			for _, k := range fg.Keys {
				if k.HLC() < h {
					continue
				}
				ev, ok, err := tx.Event(k.Site(), k.HLC(), k.ID())
				if err != nil {
					return err
				}
				if !ok || ev.Schema != g.Schema || ev.Table != g.Table {
					continue
				}
				if len(out.Events) == messages.MaxReconcileEvents || size+len(ev.Raw)+16 > maxFetchReplyBytes {
					return nil // the rest is fetched next reconciliation
				}
				if !n.recon.chargeBytes(src.peer, len(ev.Raw)) {
					// The peer fetched its budget's worth (the same
					// keys again, perhaps): the rest waits.
					limited = true
					return nil
				}
				out.Events = append(out.Events, ev.Raw)
				size += len(ev.Raw) + 16
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if limited {
			break
		}
	}
	if limited && len(out.Events) == 0 {
		n.recon.fault(src.peer, "limited")
		return nil, fmt.Errorf("%w: %s: fetched bytes", ErrReconcileLimited, src.peer)
	}
	return out, nil
}
