// Package replicate moves SSP/1 events between nodes (SSP/1 §14): one
// sender actor per peer and transport path keeps a durable cursor over the
// local log and pushes what lies beyond it; one progress actor records
// what each sender's pushes applied here and owns the applied watermarks.
//
// Delivery is at least once. Correctness rests on the receiver's
// idempotent apply, never on the sender knowing what the peer has: a
// cursor moves only after a push succeeded and never from anything the
// peer says (§14.1); the peer's watermarks only let the sender skip events
// the peer demonstrably applied (§14.2).
package replicate

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// PeerOptions configure a peer beyond its name.
type PeerOptions struct {
	// Site is the peer's own site id. With BindSite, the peer's watermark
	// claims about that site's groups are accepted (docs/replication.md:
	// only an origin speaks for its own events); without it, none are.
	Site     messages.SiteID
	BindSite bool
}

// Deps are what the delivery actors need from the node.
type Deps struct {
	Store persistence.SyncStore
	// Self is this node's site id; Name is how peers know it (the From of
	// its pushes); LogID identifies its log (16 bytes).
	Self  messages.SiteID
	Name  string
	LogID []byte
	// CursorEpoch, when set, is appended to the stored keys of the
	// senders' cursors: a log whose id was rotated (a restore) starts
	// every peer's cursor at genesis again, since what the old cursors
	// say was pushed is about the log peers knew under the old id.
	CursorEpoch string
	// Apply runs signed events through the node's apply chokepoint.
	Apply func(ctx context.Context, raws [][]byte) ([]messages.Outcome, error)
	// ApplyWith, when set, runs a received push's events through the
	// chokepoint and the receiver's record of the push in one storage
	// transaction (one commit per received push); without it the record
	// takes a second transaction of the progress actor.
	ApplyWith func(ctx context.Context, raws [][]byte, record func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error)) ([]messages.Outcome, error)
	// InScope reports whether the node syncs a table (SSP/1 §12 step 3).
	InScope func(schema, table string) bool
	// Own tracks local writes in flight.
	Own *OwnWrites
	// WallMS is the node's wall clock in Unix ms and ClockLast its HLC's
	// last value (claims are checked against both). Nil: 0 (every claim
	// beyond the skew bound of the epoch is refused).
	WallMS    func() uint64
	ClockLast func() messages.HLC
	Logger    *slog.Logger
	Metrics   *Metrics
	// Mailboxes measures the senders' and the progress actor's mailboxes.
	Mailboxes *mailbox.Depths
	// Failpoint, when set, is called at the named failpoints of the
	// receiver (FailpointRecordPush); an error is injected there.
	Failpoint func(name string) error
	// CaughtUp, when set, is called once per sender (on its goroutine:
	// it must not block) when its cursor toward peer first reached the
	// tail of the log its push read: everything the log held then was
	// offered, and the peer answered.
	CaughtUp func(peer string)
}

// FailpointRecordPush is run inside the transaction recording a received
// push, after the push's events and progress are written, as
// FailpointRecordPush+":"+the push's From. An error there fails that
// transaction like a storage error caused by this push would.
const FailpointRecordPush = "replicate.record_push"

// Config tunes the senders.
type Config struct {
	// Interval is the sync cycle: each sender pushes at least this often.
	// The retry unit is the next cycle (SSP/1 §14.1). Zero or negative:
	// no timer; cycles run only through SyncNow.
	Interval time.Duration
	// Batch is the most events one push carries (default 1000, at most
	// messages.MaxPushEvents).
	Batch int
	// Timeout bounds one push (default 30 s).
	Timeout time.Duration
	// Window is how many pushes to one peer may be in flight while it
	// catches up on timer-driven cycles (default 4, at most MaxWindow;
	// SyncNow pushes one at a time): the receiver verifies one batch
	// while it commits another.
	Window int
	// IgnorePeerWatermarks: offer everything past the cursor, never
	// skipping what the peer reported applied (watermarks are an
	// optimization, SSP/1 §14.2; this shows it).
	IgnorePeerWatermarks bool
	// LeaseTTL is how long a joiner's lease of an origin site to one
	// sender lasts without delivery (default DefaultLeaseTTL; lease.go).
	LeaseTTL time.Duration
}

// Service runs a node's delivery actors.
type Service struct {
	system   *actor.ActorSystem
	deps     *Deps
	cfg      Config
	progress *actor.PID

	mu       sync.Mutex
	peers    map[string]*actor.PID // by cursor key
	accepted map[string]senderInfo // configured senders, by name
	mem      progressMemory
	leases   leaseTable
	stopped  bool
	done     chan struct{} // closed once the progress actor stopped
}

// NewService starts the progress actor. Senders start with AddPeer.
func NewService(system *actor.ActorSystem, deps Deps, cfg Config) (*Service, error) {
	if deps.Store == nil || deps.Apply == nil || deps.InScope == nil || deps.Own == nil {
		return nil, fmt.Errorf("replicate: incomplete Deps")
	}
	if len(deps.LogID) != 16 || deps.Name == "" {
		return nil, fmt.Errorf("replicate: Deps need a 16-byte LogID and a Name")
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 1000
	}
	if cfg.Batch > messages.MaxPushEvents {
		cfg.Batch = messages.MaxPushEvents
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Window <= 0 {
		cfg.Window = 4
	}
	cfg.Window = min(cfg.Window, MaxWindow)
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Metrics == nil {
		deps.Metrics = noMetrics()
	}
	if deps.WallMS == nil {
		deps.WallMS = func() uint64 { return 0 }
	}
	if deps.ClockLast == nil {
		deps.ClockLast = func() messages.HLC { return 0 }
	}
	s := &Service{system: system, deps: &deps, cfg: cfg, peers: map[string]*actor.PID{}, accepted: map[string]senderInfo{}, done: make(chan struct{}),
		leases: leaseTable{leaseState: newLeaseState()}}
	s.progress = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &progressActor{s: s} }, deps.Mailboxes.Option("sync_progress")))
	return s, nil
}

// HandlePush applies a push from a peer and answers with its result
// (the Receiver side of every transport).
func (s *Service) HandlePush(ctx context.Context, push *messages.SyncPush) (*messages.PushResult, error) {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return nil, ErrStopped
	}
	return s.handlePush(ctx, push)
}

// Stats returns the receiver's refusal counters.
func (s *Service) Stats() ReceiveStats { return s.deps.Metrics.Stats() }

// CursorKey names the cursor of peer over transport path.
func CursorKey(peer, path string) string { return peer + "@" + path }

// AddPeer starts a sender toward peer over transport t, and accepts
// pushes from peer (AcceptPeer). path names the transport path: a peer
// reachable over two paths has one cursor on each.
func (s *Service) AddPeer(peer, path string, t Transport, opts PeerOptions) error {
	if peer == "" || path == "" || t == nil {
		return fmt.Errorf("replicate: AddPeer needs a peer name, a path and a transport")
	}
	key := CursorKey(peer, path)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	if _, ok := s.peers[key]; ok {
		return fmt.Errorf("%w: %s", ErrPeerExists, key)
	}
	s.acceptLocked(peer, opts)
	sa := &senderActor{s: s, peer: peer, path: path, key: key, t: t, peerW: map[persistence.GroupKey]messages.HLC{}}
	s.peers[key] = s.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sa }, s.deps.Mailboxes.Option("sync_sender")))
	return nil
}

// AcceptPeer makes this node accept pushes from peer (a name the
// transports authenticate). Progress, pending ranges, inbound status and
// metric series exist only for accepted peers; a push from any other name
// is refused with ErrUnknownSender and leaves nothing behind. Accepting
// again replaces the options (a site once bound stays bound: rebinding a
// name to another site would let it speak for that site's past).
func (s *Service) AcceptPeer(peer string, opts PeerOptions) error {
	if peer == "" || len(peer) > 256 {
		return fmt.Errorf("replicate: AcceptPeer needs a peer name of 1 to 256 bytes")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return ErrStopped
	}
	s.acceptLocked(peer, opts)
	return nil
}

func (s *Service) acceptLocked(peer string, opts PeerOptions) {
	cur, ok := s.accepted[peer]
	if ok && cur.bound && !opts.BindSite {
		return
	}
	s.accepted[peer] = senderInfo{site: opts.Site, bound: opts.BindSite}
}

func (s *Service) senderInfo(peer string) (senderInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	si, ok := s.accepted[peer]
	return si, ok
}

// Accepts reports whether pushes from peer are accepted.
func (s *Service) Accepts(peer string) bool {
	_, ok := s.senderInfo(peer)
	return ok
}

// RemovePeer stops the sender toward peer over path (its cursor stays).
func (s *Service) RemovePeer(peer, path string) error {
	key := CursorKey(peer, path)
	s.mu.Lock()
	pid, ok := s.peers[key]
	delete(s.peers, key)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownPeer, key)
	}
	return s.system.Root.PoisonFuture(pid).Wait()
}

func (s *Service) sender(peer, path string) (*actor.PID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, ErrStopped
	}
	pid, ok := s.peers[CursorKey(peer, path)]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPeer, CursorKey(peer, path))
	}
	return pid, nil
}

// rewindToward rewinds every sender toward peer (each of its paths).
func (s *Service) rewindToward(peer string) {
	s.mu.Lock()
	var pids []*actor.PID
	for key, pid := range s.peers {
		if p, _ := splitKey(key); p == peer {
			pids = append(pids, pid)
		}
	}
	s.mu.Unlock()
	for _, pid := range pids {
		s.system.Root.Send(pid, rewind{})
	}
}

// CycleReport describes one completed push cycle toward a peer.
type CycleReport struct {
	// Offered is how many events the push carried (re-offers included).
	Offered int
	// Skipped is how many the peer's watermarks, or its answer to a probe
	// ("have"), let the sender leave out.
	Skipped int
	// Deferred is how many events of the batch were left to another
	// sender holding their site's lease at the peer (the push stopped
	// before the first of them; they are offered again).
	Deferred int
	// Probed reports that the cycle probed the peer first.
	Probed bool
	// After and Through are the log range the push covered; Tail was the
	// local log's last sequence when it was read.
	After, Through, Tail uint64
	// Retry is how many events wait to be offered again (held or rejected).
	Retry int
	// Result is the peer's answer; nil when the push failed.
	Result *messages.PushResult
	// Err is the push failure, nil on success.
	Err error
}

// Done reports whether the cycle reached the tail with nothing left to
// re-offer: the peer has been offered everything this node holds.
func (r CycleReport) Done() bool { return r.Err == nil && r.Through == r.Tail && r.Retry == 0 }

// SyncNow runs one push cycle toward peer over path now (after the one in
// flight, if any) and returns its report. The push failing is reported in
// CycleReport.Err, not as the error.
func (s *Service) SyncNow(ctx context.Context, peer, path string) (CycleReport, error) {
	pid, err := s.sender(peer, path)
	if err != nil {
		return CycleReport{}, err
	}
	reply := make(chan CycleReport, 1)
	s.system.Root.Send(pid, &syncNow{reply: reply})
	select {
	case r := <-reply:
		return r, nil
	case <-ctx.Done():
		return CycleReport{}, ctx.Err()
	}
}

// PeerStatus is a sender's view of one peer.
type PeerStatus struct {
	Peer, Path string
	// Cursor: every local log entry at or below it was pushed. Tail is the
	// local log's last sequence at the last cycle; Tail − Cursor is the
	// backlog still to offer.
	Cursor, Tail uint64
	// Retry counts events waiting to be offered again.
	Retry int
	// Watermarks are the peer's applied watermarks as it last reported
	// them (SSP/1 §14.2): how far behind it is, per group.
	Watermarks map[persistence.GroupKey]messages.HLC
	// LastPush is when the last push completed; LastErr its failure.
	LastPush time.Time
	LastErr  error
	// LastReconcile is the last reconciliation this node started with
	// the peer (filled in by the runtime; zero At: none yet).
	LastReconcile reconcile.Status
}

// Peers returns the status of every sender, sorted by peer and path.
func (s *Service) Peers(ctx context.Context) ([]PeerStatus, error) {
	s.mu.Lock()
	pids := make([]*actor.PID, 0, len(s.peers))
	for _, pid := range s.peers {
		pids = append(pids, pid)
	}
	s.mu.Unlock()
	out := make([]PeerStatus, 0, len(pids))
	for _, pid := range pids {
		reply := make(chan PeerStatus, 1)
		s.system.Root.Send(pid, &statusReq{reply: reply})
		select {
		case st := <-reply:
			out = append(out, st)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(s.cfg.Timeout):
			// A stopped sender does not answer; leave it out.
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Peer != out[j].Peer {
			return out[i].Peer < out[j].Peer
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

// Inbound returns what this node last heard from each sender since it
// started: how far their pushes reached into their logs, and how far it
// demonstrably applied them.
func (s *Service) Inbound(ctx context.Context) ([]InboundStatus, error) {
	reply := make(chan []InboundStatus, 1)
	s.system.Root.Send(s.progress, &inboundReq{reply: reply})
	select {
	case r := <-reply:
		return r, nil
	case <-s.done:
		return nil, ErrStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// GroupWatermark is one applied watermark of this node.
type GroupWatermark struct {
	Group persistence.GroupKey
	HLC   messages.HLC
}

// Watermarks returns this node's applied watermarks: the stored ones, and
// its own groups' computed from its local writes (tables lists the tables
// to compute them for).
func (s *Service) Watermarks(ctx context.Context) ([]GroupWatermark, error) {
	var out []GroupWatermark
	err := s.deps.Store.View(ctx, func(tx persistence.SyncReader) error {
		defs, err := tx.Tables()
		if err != nil {
			return err
		}
		for _, d := range defs {
			g := persistence.GroupKey{Site: s.deps.Self, Schema: d.Schema, Table: d.Table}
			if h, ok := s.deps.Own.Safe(g); ok {
				out = append(out, GroupWatermark{Group: g, HLC: h})
			}
		}
		return tx.Watermarks(func(g persistence.GroupKey, w persistence.Watermark) (bool, error) {
			if g.Site != s.deps.Self {
				out = append(out, GroupWatermark{Group: g, HLC: w.HLC})
			}
			return true, nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return compareGroups(wireGroup(out[i].Group), wireGroup(out[j].Group)) < 0 })
	return out, err
}

// Close stops every sender (a push in flight is abandoned: its cursor
// does not move) and then the progress actor, which finishes recording
// what it was handed.
func (s *Service) Close() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	pids := make([]*actor.PID, 0, len(s.peers))
	for _, pid := range s.peers {
		pids = append(pids, pid)
	}
	s.peers = map[string]*actor.PID{}
	s.mu.Unlock()
	for _, pid := range pids {
		_ = s.system.Root.PoisonFuture(pid).Wait()
	}
	_ = s.system.Root.PoisonFuture(s.progress).Wait()
	close(s.done)
}
