package runtime

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Transport carries this node's pushes to its peers (SSP/1 §14): an
// in-process Network for tests and embedding, or a Remote over
// protoactor-go's gRPC remote.
type Transport interface {
	// Push offers p to peer and returns the peer's result. An error means
	// the push may or may not have been applied: the sender's cursor does
	// not move and the same batch is offered next cycle (SSP/1 §14.1).
	Push(ctx context.Context, peer string, p *messages.SyncPush) (*messages.PushResult, error)
}

// Receiver is a node's side of a transport: it applies a push and
// answers with the result (SSP/1 §14.1). A Node is one.
type Receiver interface {
	HandlePush(ctx context.Context, p *messages.SyncPush) (*messages.PushResult, error)
}

// Transport and Receiver are the replication layer's, method for method.
var (
	_ replicate.Transport = Transport(nil)
	_ Transport           = replicate.Transport(nil)
	_ replicate.Receiver  = Receiver(nil)
	_ Receiver            = replicate.Receiver(nil)
)

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
func (r CycleReport) Done() bool { return replicate.CycleReport(r).Done() }

// PeerStatus is a sender's view of one peer: cursor, backlog, re-offers
// and the peer's reported watermarks.
type PeerStatus struct {
	// Peer and Path name the peer and the transport path used.
	Peer, Path string
	// Cursor: every local log entry at or below it was pushed. Tail is the
	// local log's last sequence at the last cycle; Tail − Cursor is the
	// backlog still to offer.
	Cursor, Tail uint64
	// Retry counts events waiting to be offered again.
	Retry int
	// Watermarks are the peer's applied watermarks as it last reported
	// them (SSP/1 §14.2): how far behind it is, per group.
	Watermarks map[GroupKey]messages.HLC
	// LastPush is when the last push completed; LastErr its failure.
	LastPush time.Time
	LastErr  error
	// LastReconcile is the last reconciliation this node started with
	// the peer (zero At: none yet).
	LastReconcile ReconcileStatus
}

// ReconcileStatus summarizes the last reconciliation a node started with
// one peer (PeerStatus.LastReconcile). A zero At means none has run yet.
type ReconcileStatus struct {
	// At is when it finished; Took how long it ran.
	At   time.Time
	Took time.Duration
	// Rounds are the range-message round trips; BytesSent and
	// BytesReceived the encoded messages and fetch replies on the wire.
	Rounds                   int
	BytesSent, BytesReceived int
	// Missing counts the events found held by the peer and lacking here;
	// Fetched the events received for them (every one went through the
	// apply chokepoint).
	Missing, Fetched int
	// Err is why it failed; nil on success.
	Err error
}

// OK reports whether a reconciliation ran and succeeded.
func (s ReconcileStatus) OK() bool { return reconcile.Status(s).OK() }

// toPeerStatus converts the replication layer's view of a peer (its last
// reconciliation is filled in by withLastReconcile).
func toPeerStatus(p replicate.PeerStatus) PeerStatus {
	return PeerStatus{Peer: p.Peer, Path: p.Path, Cursor: p.Cursor, Tail: p.Tail, Retry: p.Retry,
		Watermarks: p.Watermarks, LastPush: p.LastPush, LastErr: p.LastErr, LastReconcile: ReconcileStatus(p.LastReconcile)}
}

// GroupWatermark is one applied watermark: everything from Group.Site for
// the table at or below HLC has been applied here (SSP/1 §14.2).
type GroupWatermark struct {
	// Group is the sync group (site, schema, table).
	Group GroupKey
	// HLC is the watermark itself.
	HLC messages.HLC
}

// InboundStatus is what this node last heard from one sender: how far its
// pushes reached into the sender's log (Through of Tail: a joining node's
// catch-up progress) and how far this node demonstrably applied it.
type InboundStatus struct {
	// From is the sender's name.
	From string
	// Through is the last sequence of the sender's log its pushes
	// covered; Tail that log's last sequence when it pushed.
	Through, Tail uint64
	// Applied is how far this node demonstrably applied that log.
	Applied uint64
	// Gaps counts offered events that did not apply yet (held, rejected).
	Gaps int
	// At is when this node last heard from the sender.
	At time.Time
}

// The runtime's status types are the replication layer's, field for
// field: the conversions below are plain type conversions, and a field
// added there without its twin here fails to compile.
var (
	_ = CycleReport(replicate.CycleReport{})
	_ = GroupWatermark(replicate.GroupWatermark{})
	_ = InboundStatus(replicate.InboundStatus{})
	_ = ReconcileStatus(reconcile.Status{})
)

// GroupKey names a sync group: (site_id, schema, table).
type GroupKey = persistence.GroupKey

// DefaultPath is the transport path name AddPeer uses when given none.
const DefaultPath = "default"

const metaLogID = "log_id"

// Name is how this node's peers know it (Config.Name, or its site id).
func (n *Node) Name() string { return n.name }

// loadLogID reads the log id, creating it for a node that has none: a
// fresh id tells receivers that this log's sequences are new to them.
func (n *Node) loadLogID(ctx context.Context) ([]byte, error) {
	var id []byte
	read := func(tx persistence.SyncReader) error {
		v, ok, err := tx.Meta(metaLogID)
		switch {
		case err != nil:
			return err
		case ok && len(v) != 16:
			return fmt.Errorf("%w: log id of %d bytes", persistence.ErrCorrupt, len(v))
		}
		id = v
		return nil
	}
	// Read first: a write transaction (an fsync) only for a new node.
	if err := n.store.View(ctx, read); err != nil || id != nil {
		return id, err
	}
	err := n.store.Update(ctx, func(tx persistence.SyncTx) error {
		if err := read(tx); err != nil || id != nil {
			return err
		}
		id = make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return err
		}
		return tx.PutMeta(metaLogID, id)
	})
	return id, err
}

func (n *Node) startDelivery(ctx context.Context, scope apply.Scope) error {
	if err := n.rotateLogAfterRestore(ctx); err != nil { // restore.go
		return err
	}
	logID, err := n.loadLogID(ctx)
	if err != nil {
		return err
	}
	epoch, err := n.loadCursorEpoch(ctx)
	if err != nil {
		return err
	}
	m, err := replicate.NewMetrics(n.registerer)
	if err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	interval := n.cfg.SyncInterval
	switch {
	case interval == 0:
		interval = defaultSyncInterval
	case interval < 0:
		interval = 0
	}
	n.sync, err = replicate.NewService(n.system, replicate.Deps{
		Store: n.store, Self: n.signer.Site(), Name: n.name, LogID: logID, CursorEpoch: epoch,
		Apply:     n.applyReceived,
		ApplyWith: n.applyReceivedWith,
		InScope:   scope.Contains,
		Own:       n.own,
		WallMS:    n.clock.WallMS,
		ClockLast: n.clock.Last,
		Logger:    n.log,
		Metrics:   m,
		Mailboxes: n.mailboxes,
		Failpoint: n.cfg.Failpoint,
		CaughtUp:  n.senderCaughtUp, // reconcile.go
	}, replicate.Config{Interval: interval, Batch: n.cfg.PushBatch, Timeout: n.cfg.PushTimeout, Window: n.cfg.PushWindow, IgnorePeerWatermarks: n.cfg.IgnorePeerWatermarks})
	return err
}

// HandlePush applies a push from a peer and answers with its result. It
// is the receiving end of every transport: an in-process Network or a
// Remote calls it; an embedding application with its own transport does
// too. The caller vouches that p.From is the peer its transport
// authenticated (the Network stamps it, the Remote checks it against the
// TLS client certificate): a push is attributed to that name only, and a
// name this node did not configure (AddPeer, AcceptPeer) is refused with
// ErrUnknownSender, keeping nothing.
func (n *Node) HandlePush(ctx context.Context, p *messages.SyncPush) (*messages.PushResult, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	return n.sync.HandlePush(ctx, p)
}

// AddPeer starts pushing this node's log to peer over t: one durable
// cursor per peer per transport path, starting at genesis for a peer
// never pushed to (SSP/1 §14.1). path names the transport path (empty:
// DefaultPath). It also accepts pushes from peer (AcceptPeer, with the
// same options).
func (n *Node) AddPeer(peer string, t Transport, path string, opts ...PeerOption) error {
	if n.isClosed() {
		return ErrClosed
	}
	if path == "" {
		path = DefaultPath
	}
	if err := n.sync.AddPeer(peer, path, t, peerOptions(opts)); err != nil {
		return err
	}
	n.peerAdded(peer, t) // reconcile.go
	return nil
}

// RemovePeer stops pushing to peer over path (empty: DefaultPath). Its
// cursor is kept: adding the peer again resumes where it stopped.
func (n *Node) RemovePeer(peer, path string) error {
	if path == "" {
		path = DefaultPath
	}
	return n.sync.RemovePeer(peer, path)
}

// SyncNow runs one push cycle toward peer over path (empty: DefaultPath)
// and returns its report; a failed push is CycleReport.Err.
func (n *Node) SyncNow(ctx context.Context, peer, path string) (CycleReport, error) {
	if n.isClosed() {
		return CycleReport{}, ErrClosed
	}
	if path == "" {
		path = DefaultPath
	}
	rep, err := n.sync.SyncNow(ctx, peer, path)
	return CycleReport(rep), err
}

// Peers returns the status of every peer this node pushes to: cursor,
// backlog (Tail − Cursor), re-offers waiting, and the peer's applied
// watermarks as it last reported them — how far behind it is — and the
// last reconciliation with it (PeerStatus.LastReconcile).
func (n *Node) Peers(ctx context.Context) ([]PeerStatus, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	ps, err := n.sync.Peers(ctx)
	return n.withLastReconcile(convertSlice(ps, toPeerStatus)), err // reconcile.go
}

// Watermarks returns this node's applied watermarks (SSP/1 §14.2). They
// are monotonic and fail closed: a group without one has nothing
// demonstrably applied.
func (n *Node) Watermarks(ctx context.Context) ([]GroupWatermark, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	wms, err := n.sync.Watermarks(ctx)
	return convertSlice(wms, func(w replicate.GroupWatermark) GroupWatermark { return GroupWatermark(w) }), err
}

// Inbound returns, per sender that pushed to this node since it opened,
// how far into the sender's log the pushes reached and how far they
// demonstrably applied here.
func (n *Node) Inbound(ctx context.Context) ([]InboundStatus, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	in, err := n.sync.Inbound(ctx)
	return convertSlice(in, func(s replicate.InboundStatus) InboundStatus { return InboundStatus(s) }), err
}

// convertSlice maps a slice of the replication layer's values to the
// runtime's; nil stays nil.
func convertSlice[S, T any](in []S, conv func(S) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = conv(v)
	}
	return out
}

// LastSeq returns the local log's last sequence: how many events the node
// ever appended (reclaimed ones included).
func (n *Node) LastSeq(ctx context.Context) (uint64, error) {
	var seq uint64
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		seq, err = tx.LastSeq()
		return err
	})
	return seq, err
}

// Remote returns the node's remote transport (Config.Remote), nil when
// none was configured. Add peers with Remote().AddPeer(name, address)
// and AddPeer(name, n.Remote(), "remote").
func (n *Node) Remote() *Remote { return n.remote }
