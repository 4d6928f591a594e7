package replicate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// recordWork is one applied push handed to the progress actor.
type recordWork struct {
	push   *messages.SyncPush
	sender senderInfo
	outs   []messages.Outcome
	reply  chan recordReply
}

type recordReply struct {
	res *messages.PushResult
	err error
}

type flushRecords struct{}

// senderInfo is what this node's configuration says about an
// authenticated sender.
type senderInfo struct {
	site  messages.SiteID
	bound bool
}

// progressActor is the receiver side of SSP/1 §14: it owns the per-sender
// progress and the applied watermarks. It drains its mailbox and records
// every push of the batch in one transaction, replying once it is durable.
// It keeps state only for configured senders (the service refuses others
// before they reach it).
type progressActor struct {
	s       *Service
	pending []*recordWork
	queued  bool
}

// progressMemory is the receiver's in-memory progress state, per
// configured sender: the last push seen (Inbound) and the pushes waiting
// for the one before them. It is changed only once the transaction that
// recorded a push is durable.
type progressMemory struct {
	mu      sync.Mutex
	senders map[string]InboundStatus
	ranges  map[string][]pendingRange
	// tx and txView are the ranges as pushes recorded earlier in the
	// write transaction not yet committed left them: a later push of the
	// same sender in that transaction starts from there (published only
	// once it commits). A store runs one write transaction at a time, so
	// one slot suffices, and a transaction whose pushes never reached
	// endTx (a caller gone before its commit) is dropped by the next.
	tx     persistence.SyncTx
	txView map[string][]pendingRange
}

func (m *progressMemory) txRanges(tx persistence.SyncTx, from string) []pendingRange {
	m.mu.Lock()
	rs, ok := m.txView[from]
	ok = ok && m.tx == tx
	m.mu.Unlock()
	if ok {
		return clonePending(rs)
	}
	return m.rangesOf(from)
}

func (m *progressMemory) setTxRanges(tx persistence.SyncTx, from string, rs []pendingRange) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tx != tx {
		m.tx, m.txView = tx, map[string][]pendingRange{}
	}
	m.txView[from] = clonePending(rs)
}

// endTx forgets a finished transaction's view (committed or not).
func (m *progressMemory) endTx(tx persistence.SyncTx) {
	if tx == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tx == tx {
		m.tx, m.txView = nil, nil
	}
}

func (m *progressMemory) rangesOf(from string) []pendingRange {
	m.mu.Lock()
	defer m.mu.Unlock()
	return clonePending(m.ranges[from])
}

// recordedPush updates the memory after push's record committed.
func (m *progressMemory) recordedPush(push *messages.SyncPush, r recorded) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ranges == nil {
		m.ranges, m.senders = map[string][]pendingRange{}, map[string]InboundStatus{}
	}
	m.ranges[push.From] = r.ranges
	st := m.senders[push.From]
	if push.Through >= st.Through || string(r.prog.Log) != string(push.Log) {
		st.Through, st.Tail = push.Through, push.Tail
	}
	m.senders[push.From] = InboundStatus{From: push.From, Through: st.Through, Tail: st.Tail,
		Applied: r.prog.Through, Gaps: len(r.prog.Gaps), At: time.Now()}
}

func (m *progressMemory) inbound() []InboundStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]InboundStatus, 0, len(m.senders))
	for _, st := range m.senders {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b InboundStatus) int { return strings.Compare(a.From, b.From) })
	return out
}

// InboundStatus is what this node last heard from one sender: how far
// into the sender's log its pushes reached (Through) and the sender's log
// tail then (a joining node's catch-up progress is Through/Tail).
type InboundStatus struct {
	From          string
	Through, Tail uint64
	// Applied is how far this node demonstrably applied that log.
	Applied uint64
	// Gaps counts offered events that did not apply yet (held, rejected).
	Gaps int
	At   time.Time
}

type inboundReq struct{ reply chan []InboundStatus }

func (p *progressActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *recordWork:
		p.pending = append(p.pending, m)
		if !p.queued {
			p.queued = true
			ctx.Send(ctx.Self(), flushRecords{})
		}
	case flushRecords:
		p.queued = false
		p.commit()
	case *inboundReq:
		m.reply <- p.s.mem.inbound()
	case *actor.Stopping:
		p.commit()
	}
}

// recorded is one push's recording inside a transaction.
type recorded struct {
	res    *messages.PushResult
	prog   persistence.PeerProgress
	ranges []pendingRange
	// refused counts the claims refused, counted once committed (a
	// transaction may run again after a failure, committer.go).
	refused int
	// newLog: the sender's log id changed from the one recorded (its
	// log was rotated: a restore).
	newLog bool
}

func (p *progressActor) commit() {
	if len(p.pending) == 0 {
		return
	}
	works := p.pending
	p.pending = nil
	results, err := p.record(works)
	if err != nil && len(works) > 1 {
		// One failing push never fails the others recorded with it: each
		// is recorded again in its own transaction.
		for _, w := range works {
			r, err := p.record([]*recordWork{w})
			p.finish(w, r[0], err)
		}
		return
	}
	for i, w := range works {
		p.finish(w, results[i], err)
	}
}

// record records works in one transaction. The ranges are this
// transaction's view, kept only once it committed (finish).
func (p *progressActor) record(works []*recordWork) ([]recorded, error) {
	results := make([]recorded, len(works))
	err := p.s.deps.Store.Update(context.Background(), func(tx persistence.SyncTx) error {
		ranges := map[string][]pendingRange{}
		for i, w := range works {
			rs, ok := ranges[w.push.From]
			if !ok {
				rs = p.s.mem.rangesOf(w.push.From)
			}
			r, err := recordPush(tx, p.s.deps, w.sender, w.push, w.outs, rs)
			if err != nil {
				return err
			}
			results[i] = r
			ranges[w.push.From] = r.ranges
		}
		return nil
	})
	return results, err
}

func (p *progressActor) finish(w *recordWork, r recorded, err error) {
	if err == nil {
		p.s.committed(w.push, r)
	}
	w.reply <- recordReply{res: r.res, err: err}
}

// committed publishes push's record once its transaction is durable.
func (s *Service) committed(push *messages.SyncPush, r recorded) {
	if r.refused > 0 {
		s.deps.Metrics.refusedClaims(r.refused)
	}
	s.mem.recordedPush(push, r)
	if r.newLog {
		s.rewindToward(push.From)
	}
}

// recordPush is decideProgress's shell: it reads the inputs from tx,
// decides, writes the effects and adds the watermark report (SSP/1 §13.6,
// §14.2).
func recordPush(tx persistence.SyncTx, d *Deps, sender senderInfo, push *messages.SyncPush, outs []messages.Outcome, ranges []pendingRange) (recorded, error) {
	prog, _, err := tx.PeerProgress(push.From)
	if err != nil {
		return recorded{}, err
	}
	tail, err := tx.LastSeq()
	if err != nil {
		return recorded{}, err
	}
	in := progressInput{Prog: prog, Ranges: ranges, Push: push, Outs: outs, Site: sender.site, Bound: sender.bound,
		Current: map[persistence.GroupKey]messages.HLC{}, Tail: tail, WallMS: d.WallMS(), ClockLast: d.ClockLast()}
	claimable := map[persistence.GroupKey]bool{}
	for _, c := range push.Claims {
		g := storeGroup(c.Group)
		if !sender.bound || g.Site != sender.site || g.Site == d.Self {
			continue
		}
		if _, seen := claimable[g]; seen {
			continue
		}
		ok := d.InScope(g.Schema, g.Table)
		if ok {
			if _, ok, err = tx.Table(persistence.TableKey{Schema: g.Schema, Table: g.Table}); err != nil {
				return recorded{}, err
			}
		}
		claimable[g] = ok
		if ok {
			w, has, err := tx.Watermark(g)
			if err != nil {
				return recorded{}, err
			}
			if has {
				in.Current[g] = w.HLC
			}
		}
	}
	in.Claimable = func(g persistence.GroupKey) bool { return claimable[g] }
	out := decideProgress(in)
	if err := tx.PutPeerProgress(push.From, out.Prog); err != nil {
		return recorded{}, err
	}
	for g, w := range out.Raise {
		if err := tx.PutWatermark(g, w); err != nil && !errors.Is(err, persistence.ErrWatermarkRegression) {
			return recorded{}, err
		}
	}
	if d.Failpoint != nil {
		if err := d.Failpoint(FailpointRecordPush + ":" + push.From); err != nil {
			return recorded{}, fmt.Errorf("replicate: failpoint %s: %w", FailpointRecordPush, err)
		}
	}
	res := out.Result
	// Report every watermark (bounded: configured sites × defined tables),
	// so a sender learns what this node applied through any path.
	if err := tx.Watermarks(func(g persistence.GroupKey, w persistence.Watermark) (bool, error) {
		if g.Site != d.Self {
			res.Watermarks = append(res.Watermarks, messages.GroupWatermark{Group: wireGroup(g), HLC: w.HLC})
		}
		return len(res.Watermarks) < messages.MaxPushEvents/2, nil
	}); err != nil {
		return recorded{}, err
	}
	for g := range out.Touched {
		if g.Site != d.Self {
			continue
		}
		if h, ok := d.Own.Safe(g); ok {
			res.Watermarks = append(res.Watermarks, messages.GroupWatermark{Group: wireGroup(g), HLC: h})
		}
	}
	slices.SortFunc(res.Watermarks, func(a, b messages.GroupWatermark) int { return compareGroups(a.Group, b.Group) })
	newLog := len(prog.Log) > 0 && !bytes.Equal(prog.Log, push.Log)
	return recorded{res: res, prog: out.Prog, ranges: out.Ranges, refused: out.RefusedClaims, newLog: newLog}, nil
}

// handlePush applies a push from an authenticated, configured sender
// through the node's apply path (signature checks run in parallel,
// outside any actor) and records it.
func (s *Service) handlePush(ctx context.Context, push *messages.SyncPush) (*messages.PushResult, error) {
	if err := push.Validate(); err != nil {
		return nil, err
	}
	sender, ok := s.senderInfo(push.From)
	if !ok {
		// Nothing is kept for a sender this node did not configure: no
		// progress, no inbound entry, no metric series of its name.
		s.deps.Metrics.refusedPush("unknown_sender")
		return nil, fmt.Errorf("%w: %q", ErrUnknownSender, truncate(push.From))
	}
	if len(push.Offer) > 0 {
		return s.handleProbe(ctx, push)
	}
	raws := make([][]byte, len(push.Events))
	for i, e := range push.Events {
		raws[i] = e.Raw
	}
	if s.deps.ApplyWith != nil {
		// One transaction per received push: its events and its record.
		// The callback runs on the committer's goroutine; ApplyWith may
		// return first (ctx done) while the committer still runs it, so
		// what it leaves for this goroutine is guarded (and a view this
		// goroutine cannot end is dropped by the next transaction).
		var mu sync.Mutex
		var rec recorded
		var used persistence.SyncTx
		outs, err := s.deps.ApplyWith(ctx, raws, func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error) {
			mu.Lock()
			used = tx
			mu.Unlock()
			r, err := recordPush(tx, s.deps, sender, push, outs, s.mem.txRanges(tx, push.From))
			if err != nil {
				return nil, err
			}
			s.mem.setTxRanges(tx, push.From, r.ranges)
			mu.Lock()
			rec = r
			mu.Unlock()
			return func() { s.committed(push, r) }, nil
		})
		mu.Lock()
		usedTx, res := used, rec.res
		mu.Unlock()
		s.mem.endTx(usedTx)
		if err != nil {
			return nil, err
		}
		s.pushLeases(push, outs, res)
		s.deps.Metrics.received(push.From, res, outs)
		return res, nil
	}
	outs, err := s.deps.Apply(ctx, raws)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(raws) {
		return nil, fmt.Errorf("replicate: apply returned %d outcomes for %d events", len(outs), len(raws))
	}
	reply := make(chan recordReply, 1)
	s.system.Root.Send(s.progress, &recordWork{push: push, sender: sender, outs: outs, reply: reply})
	select {
	case r := <-reply:
		if r.err == nil {
			s.pushLeases(push, outs, r.res)
			s.deps.Metrics.received(push.From, r.res, outs)
		}
		return r.res, r.err
	case <-s.done:
		return nil, ErrStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
