package replicate

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// pendingRange is a push recorded before the push covering the log just
// before it: its range and the gaps it left.
type pendingRange struct {
	after, through uint64
	gaps           []persistence.PeerGap
}

// maxPendingRanges bounds the out-of-order pushes remembered per sender.
const maxPendingRanges = 64

// maxGaps bounds the gaps remembered per sender. Past it the oldest are
// kept and the receive progress stops advancing (fail closed) until they
// fill: a sender cannot grow a receiver's state without bound.
const maxGaps = 4 * messages.MaxPushEvents

// recordWork is one applied push handed to the progress actor.
type recordWork struct {
	push  *messages.SyncPush
	outs  []messages.Outcome
	reply chan recordReply
}

type recordReply struct {
	res *messages.PushResult
	err error
}

type flushRecords struct{}

// progressActor is the receiver side of SSP/1 §14: it owns the per-sender
// progress and the applied watermarks. It drains its mailbox and records
// every push of the batch in one transaction, replying once it is durable.
type progressActor struct {
	deps    *Deps
	pending []*recordWork
	queued  bool
	senders map[string]InboundStatus  // last push seen per sender (memory only)
	ranges  map[string][]pendingRange // per sender, pushes waiting for the one before them
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
		out := make([]InboundStatus, 0, len(p.senders))
		for _, st := range p.senders {
			out = append(out, st)
		}
		slices.SortFunc(out, func(a, b InboundStatus) int { return strings.Compare(a.From, b.From) })
		m.reply <- out
	case *actor.Stopping:
		p.commit()
	}
}

func (p *progressActor) commit() {
	if len(p.pending) == 0 {
		return
	}
	works := p.pending
	p.pending = nil
	results := make([]*messages.PushResult, len(works))
	progress := make([]persistence.PeerProgress, len(works))
	ranges := map[string][]pendingRange{} // this transaction's view; kept only if it commits
	err := p.deps.Store.Update(context.Background(), func(tx persistence.SyncTx) error {
		clear(ranges)
		for i, w := range works {
			rs, ok := ranges[w.push.From]
			if !ok {
				rs = clonePending(p.ranges[w.push.From])
			}
			r, prog, rs, err := recordPush(tx, p.deps, w.push, w.outs, rs)
			if err != nil {
				return err
			}
			results[i], progress[i], ranges[w.push.From] = r, prog, rs
		}
		return nil
	})
	if err == nil {
		if p.ranges == nil {
			p.ranges = map[string][]pendingRange{}
		}
		for from, rs := range ranges {
			p.ranges[from] = rs
		}
	}
	if p.senders == nil {
		p.senders = map[string]InboundStatus{}
	}
	now := time.Now()
	for i, w := range works {
		if err == nil {
			st := p.senders[w.push.From]
			if w.push.Through >= st.Through || !bytes.Equal(progress[i].Log, w.push.Log) {
				st.Through, st.Tail = w.push.Through, w.push.Tail
			}
			p.senders[w.push.From] = InboundStatus{From: w.push.From, Through: st.Through, Tail: st.Tail,
				Applied: progress[i].Through, Gaps: len(progress[i].Gaps), At: now}
		}
		w.reply <- recordReply{res: results[i], err: err}
	}
}

func clonePending(rs []pendingRange) []pendingRange {
	out := make([]pendingRange, len(rs))
	for i, r := range rs {
		out[i] = pendingRange{after: r.after, through: r.through, gaps: slices.Clone(r.gaps)}
	}
	return out
}

func groupOf(o messages.Outcome) persistence.GroupKey {
	return persistence.GroupKey{Site: o.Site, Schema: o.Schema, Table: o.Table}
}

func wireGroup(g persistence.GroupKey) messages.Group {
	return messages.Group{Site: g.Site, Schema: g.Schema, Table: g.Table}
}

func storeGroup(g messages.Group) persistence.GroupKey {
	return persistence.GroupKey{Site: g.Site, Schema: g.Schema, Table: g.Table}
}

// recordPush updates what this node applied from the push's sender and
// its watermarks, and builds the push result (SSP/1 §13.6, §14.2).
//
// The sender's progress is "everything it offered at or below Through
// applied, except Gaps". An event that did not apply (held, rejected)
// becomes a gap of its group; a later offer that applies fills it. A claim
// "every event of G at or below h is in the sender's log at or below seq"
// raises the watermark of G to h only when this node demonstrably applied
// all of that: Through ≥ seq and no gap of G at or below seq. Nothing else
// moves a watermark, so it fails closed.
func recordPush(tx persistence.SyncTx, d *Deps, push *messages.SyncPush, outs []messages.Outcome, ranges []pendingRange) (res *messages.PushResult, prog persistence.PeerProgress, _ []pendingRange, err error) {
	prog, _, err = tx.PeerProgress(push.From)
	if err != nil {
		return nil, prog, ranges, err
	}
	if !bytes.Equal(prog.Log, push.Log) {
		// A new log at the sender: nothing known about it yet.
		prog = persistence.PeerProgress{Log: push.Log}
		ranges = nil
	}
	res = &messages.PushResult{V: messages.SyncVersion}
	touched := map[persistence.GroupKey]bool{}
	held := map[persistence.GroupKey]bool{}
	extends := push.After <= prog.Through
	newThrough := prog.Through
	if extends && push.Through > newThrough {
		newThrough = push.Through
	}
	gaps := prog.Gaps
	var later []persistence.PeerGap // gaps of a push that does not extend the progress (yet)
	for i, ev := range push.Events {
		o := outs[i]
		if o.Kind == messages.Dropped && o.Site == (messages.SiteID{}) {
			// Not authenticated: no group to account it to. Dropped events
			// are final and never re-offered (SSP/1 §13.6).
			res.Applied++
			continue
		}
		g := groupOf(o)
		touched[g] = true
		filled := func(x persistence.PeerGap) bool { return x.Seq == ev.Seq }
		gaps = slices.DeleteFunc(gaps, filled)
		for j := range ranges {
			ranges[j].gaps = slices.DeleteFunc(ranges[j].gaps, filled)
		}
		if o.AdvancesWatermark() {
			res.Applied++
			continue
		}
		res.Retry = append(res.Retry, ev.Seq)
		switch o.Kind {
		case messages.Rejected:
			res.Rejected++
		case messages.Held:
			held[g] = true
		}
		gap := persistence.PeerGap{Seq: ev.Seq, Group: g}
		switch {
		case ev.Seq > newThrough:
			later = append(later, gap)
		case len(gaps) < maxGaps:
			gaps = append(gaps, gap)
		default:
			// Too many gaps: do not claim progress past this one.
			newThrough = ev.Seq - 1
		}
	}
	if !extends && push.Through > newThrough {
		// A push that arrived before the one covering (Through, After]
		// (several pushes are in flight while a peer catches up): kept in
		// memory until that range is recorded. Lost on a restart, which
		// only fails closed: the sender offers from its cursor again.
		ranges = append(ranges, pendingRange{after: push.After, through: push.Through, gaps: later})
		if len(ranges) > maxPendingRanges {
			ranges = ranges[len(ranges)-maxPendingRanges:]
		}
	}
	for merged := true; merged; {
		merged = false
		for j := 0; j < len(ranges); j++ {
			r := ranges[j]
			if r.through <= newThrough {
				ranges = slices.Delete(ranges, j, j+1)
				j--
				continue
			}
			if r.after <= newThrough && len(gaps)+len(r.gaps) <= maxGaps {
				gaps = append(gaps, r.gaps...)
				newThrough = r.through
				ranges = slices.Delete(ranges, j, j+1)
				merged = true
				break
			}
		}
	}
	slices.SortFunc(gaps, func(a, b persistence.PeerGap) int { return cmp.Compare(a.Seq, b.Seq) })
	prog.Through, prog.Gaps = newThrough, gaps
	if err := tx.PutPeerProgress(push.From, prog); err != nil {
		return nil, prog, ranges, err
	}
	tail, err := tx.LastSeq()
	if err != nil {
		return nil, prog, ranges, err
	}
	for _, c := range push.Claims {
		g := storeGroup(c.Group)
		touched[g] = true
		if g.Site == d.Self || !d.InScope(g.Schema, g.Table) || prog.Through < c.Seq {
			continue
		}
		if slices.ContainsFunc(prog.Gaps, func(x persistence.PeerGap) bool { return x.Group == g && x.Seq <= c.Seq }) {
			continue
		}
		cur, ok, err := tx.Watermark(g)
		if err != nil {
			return nil, prog, ranges, err
		}
		if ok && cur.HLC >= c.HLC {
			continue
		}
		// Every event of g at or below c.HLC applied here is in this
		// node's log at or below its tail, so the node can state the
		// same to its own peers.
		if err := tx.PutWatermark(g, persistence.Watermark{HLC: c.HLC, Seq: tail}); err != nil {
			return nil, prog, ranges, err
		}
	}
	for g := range held {
		res.Held = append(res.Held, wireGroup(g))
	}
	slices.SortFunc(res.Held, compareGroups)
	// Report every watermark (the groups are few: sites × tables), so a
	// sender learns what this node applied through any path.
	if err := tx.Watermarks(func(g persistence.GroupKey, w persistence.Watermark) (bool, error) {
		if g.Site != d.Self {
			res.Watermarks = append(res.Watermarks, messages.GroupWatermark{Group: wireGroup(g), HLC: w.HLC})
		}
		return len(res.Watermarks) < messages.MaxPushEvents/2, nil
	}); err != nil {
		return nil, prog, ranges, err
	}
	for g := range touched {
		if g.Site != d.Self {
			continue
		}
		if h, ok := d.Own.Safe(g); ok {
			res.Watermarks = append(res.Watermarks, messages.GroupWatermark{Group: wireGroup(g), HLC: h})
		}
	}
	slices.SortFunc(res.Watermarks, func(a, b messages.GroupWatermark) int { return compareGroups(a.Group, b.Group) })
	return res, prog, ranges, nil
}

func compareGroups(a, b messages.Group) int {
	return cmp.Or(bytes.Compare(a.Site[:], b.Site[:]), strings.Compare(a.Schema, b.Schema), strings.Compare(a.Table, b.Table))
}

// handlePush applies a push through the node's apply path (signature
// checks run in parallel, outside any actor) and records it.
func (s *Service) handlePush(ctx context.Context, push *messages.SyncPush) (*messages.PushResult, error) {
	if err := push.Validate(); err != nil {
		return nil, err
	}
	raws := make([][]byte, len(push.Events))
	for i, e := range push.Events {
		raws[i] = e.Raw
	}
	outs, err := s.deps.Apply(ctx, raws)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(raws) {
		return nil, fmt.Errorf("delivery: apply returned %d outcomes for %d events", len(outs), len(raws))
	}
	reply := make(chan recordReply, 1)
	s.system.Root.Send(s.progress, &recordWork{push: push, outs: outs, reply: reply})
	select {
	case r := <-reply:
		if r.err == nil {
			s.deps.Metrics.received(push.From, r.res)
		}
		return r.res, r.err
	case <-s.done:
		return nil, ErrStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
