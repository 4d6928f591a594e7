package replicate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

type (
	tick      struct{}
	syncNow   struct{ reply chan CycleReport }
	statusReq struct{ reply chan PeerStatus }
	// rewind: the peer's own log was rotated (a restore): its record of
	// this node's log may have gone back with it, so the cursor starts at
	// genesis again (re-offering is always safe, SSP/1 §14.1).
	rewind struct{}
	// pushDone carries a finished push back into the sender's mailbox.
	pushDone struct {
		f      *flight
		result *messages.PushResult
		err    error
	}
)

// batch is one prepared push and what the sender needs to finish it.
type batch struct {
	push    *messages.SyncPush
	skipped int
	// retried are the re-offer sequences this push consumed (carried, or
	// left out because the peer's watermark covers them, or reclaimed);
	// the others stay in the retry set.
	retried []uint64
	// offer describes the events past After per origin site (a probe's
	// Offer); site maps their sequences to their sites.
	offer []messages.OfferRange
	site  map[uint64]messages.SiteID
	// deferred counts the events narrow left to another sender's lease;
	// nopush is set when nothing was left to push after the probe.
	deferred int
	nopush   bool
}

// flight is one push handed to the transport and not yet finished.
type flight struct {
	b *batch
	// probe: the push is preceded by a probe, whose answer is probeRes.
	probe    bool
	probeRes *messages.PushResult
	done     bool
	result   *messages.PushResult
	err      error
}

// senderActor pushes the local log to one peer over one transport path
// (SSP/1 §14.1). It owns the peer's cursor: loaded once, changed only
// after a push succeeded and the new value is durable.
type senderActor struct {
	s          *Service
	peer, path string
	key        string
	t          Transport

	cursor persistence.SenderCursor
	loaded bool
	peerW  map[persistence.GroupKey]messages.HLC // the peer's reported watermarks

	// Pushes in flight, oldest first. While catching up several are in
	// flight (Config.Window): push k+1 covers the log after push k. The
	// cursor moves in order, push by push, only past pushes that
	// succeeded with every earlier one; after a failure the rest of the
	// window is discarded and the next cycle starts at the cursor again.
	flights  []*flight
	next     uint64 // the log position the next push starts after
	broken   bool   // a push of the current window failed
	ctx      context.Context
	cancel   context.CancelFunc // cancels the pushes in flight when the actor stops
	waiters  []chan CycleReport // answered when the window drains
	queued   []chan CycleReport // SyncNow calls that arrived meanwhile
	timer    *time.Timer
	stopping bool
	last     CycleReport

	// probing: the peer asked this sender to probe before each push
	// (another sender holds a lease there); probed: a probe of the
	// current catch-up found no need (cleared when the cursor reaches the
	// tail, so the next catch-up starts with a probe again).
	probing, probed bool
	// leased: the origin sites this catch-up's probes were answered
	// "send" for (leased to this sender). A batch naming another site is
	// probed first: a mesh whose every node writes its own rows holds
	// each site's events in a stretch of its log, and an unprobed batch
	// of a site another sender delivers would be a second copy.
	leased map[messages.SiteID]bool
	// rewinding: a rewind waits for the pushes in flight.
	rewinding bool

	tail     uint64
	lastPush time.Time
	lastErr  error
	// caught: a push of this sender reached the tail of the log it read
	// (Deps.CaughtUp was called).
	caught bool
}

func (a *senderActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.ctx, a.cancel = context.WithCancel(context.Background())
		a.schedule(ctx, a.s.cfg.Interval)
	case tick:
		if len(a.flights) == 0 {
			a.fill(ctx, a.window())
		}
	case *syncNow:
		if len(a.flights) > 0 {
			a.queued = append(a.queued, m.reply)
		} else {
			a.waiters = append(a.waiters, m.reply)
			a.fill(ctx, 1)
		}
	case *pushDone:
		m.f.done, m.f.result, m.f.err = true, m.result, m.err
		a.drain(ctx)
	case *statusReq:
		m.reply <- a.status()
	case rewind:
		a.rewinding = true
		if len(a.flights) == 0 {
			a.rewindNow()
		}
	case *actor.Stopping:
		a.stopping = true
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.cancel != nil {
			a.cancel()
		}
		for _, w := range append(a.waiters, a.queued...) {
			w <- CycleReport{Err: ErrStopped}
		}
		a.waiters, a.queued = nil, nil
	}
}

// storeKey is where the cursor is stored: its key, in the log's cursor
// epoch (Deps.CursorEpoch).
func (a *senderActor) storeKey() string {
	if a.s.deps.CursorEpoch == "" {
		return a.key
	}
	return a.key + "#" + a.s.deps.CursorEpoch
}

// window is how many pushes may be in flight when cycles run on their own.
func (a *senderActor) window() int {
	if a.s.cfg.Interval <= 0 {
		return 1 // SyncNow-driven: one push per cycle, deterministic
	}
	return a.s.cfg.Window
}

// schedule sends the next tick after d (no timer when d ≤ 0).
func (a *senderActor) schedule(ctx actor.Context, d time.Duration) {
	if d <= 0 || a.stopping {
		return
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	self, sys := ctx.Self(), ctx.ActorSystem()
	a.timer = time.AfterFunc(d, func() { sys.Root.Send(self, tick{}) })
}

func (a *senderActor) status() PeerStatus {
	w := make(map[persistence.GroupKey]messages.HLC, len(a.peerW))
	for g, h := range a.peerW {
		w[g] = h
	}
	return PeerStatus{Peer: a.peer, Path: a.path, Cursor: a.cursor.Seq, Tail: a.tail, Retry: len(a.cursor.Retry),
		Watermarks: w, LastPush: a.lastPush, LastErr: a.lastErr}
}

// fill prepares pushes and hands them to the transport, off the actor's
// goroutine, until max are in flight or the log is exhausted; results come
// back as pushDone.
func (a *senderActor) fill(ctx actor.Context, max int) {
	if !a.loaded {
		err := a.s.deps.Store.View(context.Background(), func(tx persistence.SyncReader) error {
			c, _, err := tx.Cursor(a.storeKey())
			a.cursor = c
			return err
		})
		if err != nil {
			a.finishWindow(ctx, CycleReport{Err: err})
			return
		}
		a.loaded = true
	}
	for len(a.flights) < max && !a.broken && !a.stopping {
		if len(a.flights) == 0 {
			a.next = a.cursor.Seq
		} else if a.next >= a.tail {
			return // the window reached the end of the log
		}
		// Only a push that may probe describes its batch (offerOf: a
		// sort, a hash and a map per event).
		first := len(a.flights) == 0
		b, err := a.prepare(first, (first && (a.probing || !a.probed)) || a.leased != nil)
		if err != nil {
			if len(a.flights) == 0 {
				a.finishWindow(ctx, CycleReport{Err: err})
			}
			return
		}
		// A catch-up starts with a probe (the peer may be joining from
		// several senders at once: lease.go), and keeps probing while the
		// peer asks; a probing push is alone in its window, since what
		// it covers is known only once the peer answered.
		fresh := a.leased != nil && b.push.Through < b.push.Tail && namesOtherSites(b.offer, a.leased)
		if fresh && !first {
			return // probed as the first push of the next window
		}
		probe := first && b.offer != nil && (a.probing || fresh || (!a.probed && b.push.Through < b.push.Tail))
		f := &flight{b: b, probe: probe}
		a.flights = append(a.flights, f)
		a.next = b.push.Through
		last := probe || b.push.Through >= b.push.Tail
		pctx, cancel := context.WithTimeout(a.ctx, a.s.cfg.Timeout)
		self, sys, t, peer := ctx.Self(), ctx.ActorSystem(), a.t, a.peer
		go func() {
			defer cancel()
			if f.probe {
				res, err := probePeer(pctx, t, peer, f.b)
				f.probeRes = res
				if err != nil || f.b.nopush {
					sys.Root.Send(self, &pushDone{f: f, result: res, err: err})
					return
				}
			}
			res, err := t.Push(pctx, peer, f.b.push)
			if err == nil {
				err = checkResult(f.b.push, res)
			}
			sys.Root.Send(self, &pushDone{f: f, result: res, err: err})
		}()
		if last {
			return
		}
	}
}

// probePeer sends b's probe and narrows b to the peer's verdicts; when
// nothing is left to push it marks b nopush and returns the probe's
// answer.
func probePeer(ctx context.Context, t Transport, peer string, b *batch) (*messages.PushResult, error) {
	p := b.push
	probe := &messages.SyncPush{V: p.V, From: p.From, To: p.To, Log: p.Log, After: p.After, Through: p.After, Tail: p.Tail, Offer: b.offer}
	res, err := t.Push(ctx, peer, probe)
	if err != nil {
		return nil, err
	}
	if res == nil || res.Validate() != nil || len(res.Verdicts) != len(b.offer) {
		return nil, fmt.Errorf("%w: the answer to a probe of %d ranges is not %d verdicts", messages.ErrSyncInvalid, len(b.offer), len(b.offer))
	}
	b.narrow(res.Verdicts)
	b.nopush = len(b.push.Events) == 0 && b.push.Through == b.push.After && len(b.retried) == 0
	return res, nil
}

// narrow applies a probe's verdicts: the events of "have" sites are left
// out (the peer holds exactly those), and the push stops before the first
// event of a "busy" site, so the cursor never passes an event nobody
// delivered; the events of "send" sites before it are pushed. Re-offers
// (at or below After) are pushed as they are.
func (b *batch) narrow(verdicts []uint64) {
	v := make(map[messages.SiteID]uint64, len(verdicts))
	for i, o := range b.offer {
		v[o.Site] = verdicts[i]
	}
	p := b.push
	through := p.Through
	for _, e := range p.Events {
		if e.Seq > p.After && v[b.site[e.Seq]] == messages.VerdictBusy {
			through = e.Seq - 1
			break
		}
	}
	kept := p.Events[:0:0]
	for _, e := range p.Events {
		switch {
		case e.Seq <= p.After:
		case e.Seq > through:
			b.deferred++
			continue
		case v[b.site[e.Seq]] == messages.VerdictHave:
			b.skipped++
			continue
		}
		kept = append(kept, e)
	}
	p.Events = kept
	if through < p.Through {
		p.Through = through
		p.Claims = nil // claims ride only on a push that reaches the tail
	}
}

// checkResult refuses a result that does not answer the push.
func checkResult(p *messages.SyncPush, r *messages.PushResult) error {
	if r == nil {
		return fmt.Errorf("replicate: empty push result")
	}
	if err := r.Validate(); err != nil {
		return err
	}
	for _, seq := range r.Retry {
		if _, ok := slices.BinarySearchFunc(p.Events, seq, func(e messages.PushedEvent, s uint64) int { return cmp.Compare(e.Seq, s) }); !ok {
			return fmt.Errorf("%w: result asks to retry sequence %d the push did not carry", messages.ErrSyncInvalid, seq)
		}
	}
	return nil
}

// prepare reads the next batch from the log: the re-offers first, then
// the events past the cursor, leaving out what the peer's watermarks show
// it applied (SSP/1 §14.2). With describe it also describes the batch for
// a probe (batch.offer).
func (a *senderActor) prepare(withRetries, describe bool) (*batch, error) {
	d := a.s.deps
	limit := a.s.cfg.Batch
	b := &batch{push: &messages.SyncPush{V: messages.SyncVersion, From: d.Name, To: a.peer, Log: d.LogID}}
	// Own groups' safe HLCs are taken BEFORE the snapshot the push is read
	// from: every own event at or below them was durable before the
	// snapshot began, so it lies at or below the snapshot's tail. Taken
	// after, a write committing in between would be claimed but missing.
	var own map[persistence.GroupKey]messages.HLC
	err := d.Store.View(context.Background(), func(tx persistence.SyncReader) error {
		defs, err := tx.Tables()
		if err != nil {
			return err
		}
		own = make(map[persistence.GroupKey]messages.HLC, len(defs))
		for _, def := range defs {
			g := persistence.GroupKey{Site: d.Self, Schema: def.Schema, Table: def.Table}
			if h, ok := d.Own.Safe(g); ok {
				own[g] = h
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = d.Store.View(context.Background(), func(tx persistence.SyncReader) error {
		tail, err := tx.LastSeq()
		if err != nil {
			return err
		}
		a.tail = tail
		p := b.push
		p.After, p.Tail = a.next, tail
		// Room for what the log holds past the cursor, up to a batch
		// (grown once, not append by append).
		size := min(limit, len(a.cursor.Retry))
		if tail > a.next {
			size = min(limit, size+int(min(tail-a.next, uint64(limit))))
		}
		evs := make([]messages.PushedEvent, 0, size)
		reofferBytes := 0
		for _, seq := range a.cursor.Retry {
			// Re-offers are capped per push, in events and bytes (§14.1
			// has no backoff: the retry unit is the next cycle), so held
			// or rejected events cannot crowd out the log behind them.
			if !withRetries || len(evs) >= limit/2 || reofferBytes >= maxReofferBytes {
				break
			}
			b.retried = append(b.retried, seq)
			err := tx.EventsAfter(seq-1, 1, func(se persistence.StoredEvent) (bool, error) {
				if se.Seq != seq {
					return false, nil // reclaimed below a horizon: nothing to re-offer
				}
				if a.applied(se) {
					b.skipped++
					return false, nil
				}
				evs = append(evs, messages.PushedEvent{Seq: se.Seq, Raw: se.Raw})
				reofferBytes += len(se.Raw)
				return false, nil
			})
			if err != nil {
				return err
			}
		}
		room := limit - len(evs)
		visited := 0
		last := a.next
		var offers []offered
		err = tx.EventsAfter(a.next, room, func(se persistence.StoredEvent) (bool, error) {
			visited++
			last = se.Seq
			if a.applied(se) {
				b.skipped++
				return true, nil
			}
			evs = append(evs, messages.PushedEvent{Seq: se.Seq, Raw: se.Raw})
			if describe {
				offers = append(offers, offered{seq: se.Seq, site: se.Site, hlc: se.HLC, id: se.ID})
			}
			return true, nil
		})
		if b.offer = offerOf(offers); b.offer != nil {
			b.site = make(map[uint64]messages.SiteID, len(offers))
			for _, o := range offers {
				b.site[o.seq] = o.site
			}
		}
		if err != nil {
			return err
		}
		p.Through = tail
		if visited >= room {
			p.Through = last // the batch is full: more may follow
		}
		slices.SortFunc(evs, func(x, y messages.PushedEvent) int { return cmp.Compare(x.Seq, y.Seq) })
		p.Events = evs
		p.Claims, err = a.claims(tx, own, p.Through, tail)
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// applied reports whether the peer's watermark covers the event. A
// node never skips its own events because of what a peer reports: it is
// their origin, and the only one whose offer no relay can replace.
func (a *senderActor) applied(se persistence.StoredEvent) bool {
	if a.s.cfg.IgnorePeerWatermarks || se.Site == a.s.deps.Self {
		return false
	}
	h, ok := a.peerW[persistence.GroupKey{Site: se.Site, Schema: se.Schema, Table: se.Table}]
	return ok && se.HLC <= h
}

// claims lists the watermark claims the push can carry: this node's own
// groups only (the progress rule: nobody speaks for another site), when
// the push reaches the tail, and only those the peer does not already
// report as reached. own holds the own groups' safe HLCs taken before
// tx's snapshot: every own event at or below them is in the log at or
// below tail.
func (a *senderActor) claims(_ persistence.SyncReader, own map[persistence.GroupKey]messages.HLC, through, tail uint64) ([]messages.WatermarkClaim, error) {
	if through != tail {
		return nil, nil
	}
	var out []messages.WatermarkClaim
	for g, h := range own {
		if cur, ok := a.peerW[g]; ok && cur >= h {
			continue
		}
		out = append(out, messages.WatermarkClaim{Group: wireGroup(g), HLC: h, Seq: tail})
		if len(out) == messages.MaxPushEvents {
			break
		}
	}
	slices.SortFunc(out, func(x, y messages.WatermarkClaim) int { return compareGroups(x.Group, y.Group) })
	return out, nil
}

// drain handles the finished pushes at the head of the window, in order:
// a success (with every earlier push of the window successful) moves the
// cursor to its Through and updates the re-offer set, durably, before
// anything else happens (SSP/1 §14.1); a failure leaves the cursor and
// discards what the rest of the window achieved (offered again next
// cycle; the receiver's apply is idempotent).
func (a *senderActor) drain(ctx actor.Context) {
	for len(a.flights) > 0 && a.flights[0].done {
		f := a.flights[0]
		a.flights = a.flights[1:]
		p := f.b.push
		rep := CycleReport{Offered: len(p.Events), Skipped: f.b.skipped, Deferred: f.b.deferred, Probed: f.probe,
			After: p.After, Through: p.Through, Tail: p.Tail, Err: f.err}
		if f.b.nopush {
			rep.Offered = 0
		}
		a.noteProbe(f)
		switch {
		case f.err != nil:
			a.broken = true
		case f.b.nopush:
			// Nothing pushed: the cursor stays (no write).
			rep.Result = f.result
		case a.broken:
			rep.Err = errWindowBroken
		default:
			next := nextCursor(a.cursor, f.b.retried, f.result.Retry, p.Through)
			err := a.s.deps.Store.Update(context.Background(), func(tx persistence.SyncTx) error { return tx.PutCursor(a.storeKey(), next) })
			if err != nil {
				rep.Err = fmt.Errorf("replicate: store cursor: %w", err)
				a.broken = true
				break
			}
			a.cursor = next
			if !a.caught && next.Seq == p.Tail && a.s.deps.CaughtUp != nil {
				a.caught = true
				a.s.deps.CaughtUp(a.peer)
			}
			if next.Seq < p.Through {
				// The re-offer set is full: the rest of the window covers
				// the log past a cursor that stopped short; offer it again.
				a.broken = true
			}
			rep.Result = f.result
			for _, w := range f.result.Watermarks {
				g := storeGroup(w.Group)
				if w.HLC > a.peerW[g] {
					a.peerW[g] = w.HLC
				}
			}
		}
		rep.Retry = len(a.cursor.Retry)
		if rep.Err == nil {
			if lag, known := a.lagSeconds(); known {
				a.s.deps.Metrics.peerLag(a.key, lag)
			} else {
				a.s.deps.Metrics.peerLagUnknown(a.key)
			}
		}
		a.lastPush, a.lastErr = time.Now(), rep.Err
		a.s.deps.Metrics.pushed(a.key, rep)
		if f.err != nil {
			a.s.deps.Logger.Debug("replicate: push failed", "peer", a.key, "err", f.err)
		}
		a.last = rep
	}
	if len(a.flights) > 0 {
		if !a.broken && len(a.waiters) == 0 && !a.rewinding {
			a.fill(ctx, a.window()) // keep the window full while catching up
		}
		return
	}
	if a.rewinding {
		a.rewindNow()
	}
	a.finishWindow(ctx, a.last)
}

// rewindNow moves the cursor back to genesis, durably. The re-offers go
// too: everything is offered again.
func (a *senderActor) rewindNow() {
	err := a.s.deps.Store.Update(context.Background(), func(tx persistence.SyncTx) error {
		return tx.PutCursor(a.storeKey(), persistence.SenderCursor{})
	})
	if err != nil {
		a.s.deps.Logger.Warn("replicate: rewind the cursor", "peer", a.key, "err", err)
		return // tried again after the next push
	}
	a.rewinding, a.loaded, a.cursor, a.next = false, true, persistence.SenderCursor{}, 0
	a.s.deps.Logger.Info("replicate: the peer's log was rotated; offering it everything again", "peer", a.key)
}

// noteProbe decides from a finished flight whether the next pushes probe
// first: while the peer asks (Probe in a probe's or a push's answer), and
// at the start of each catch-up. A failed probe is not repeated in this
// catch-up (a peer that cannot answer probes still gets pushes) unless a
// later answer asks for it.
func (a *senderActor) noteProbe(f *flight) {
	switch {
	case f.probe && f.err != nil && f.probeRes == nil:
		a.probing, a.probed = false, true
	case f.err != nil:
	case f.probe:
		a.probing = f.result.Probe || f.probeRes.Probe
		a.probed = a.probed || !a.probing
		if a.leased == nil {
			a.leased = map[messages.SiteID]bool{}
		}
		for i, o := range f.b.offer {
			a.leased[o.Site] = f.probeRes.Verdicts[i] == messages.VerdictSend
		}
	case f.result.Probe:
		a.probing = true
	}
	if f.err == nil && f.b.push.Through == f.b.push.Tail {
		a.probed, a.leased = false, nil
	}
}

// namesOtherSites reports whether offer names a site not leased.
func namesOtherSites(offer []messages.OfferRange, leased map[messages.SiteID]bool) bool {
	for _, o := range offer {
		if !leased[o.Site] {
			return true
		}
	}
	return false
}

// errWindowBroken reports a push that succeeded after an earlier push of
// the same window failed: its range is offered again.
var errWindowBroken = errors.New("replicate: an earlier push in flight failed; offered again next cycle")

// finishWindow answers the waiters once nothing is in flight and decides
// when the next cycle runs: at once while the log has more past the
// cursor (catching up), otherwise after the interval.
func (a *senderActor) finishWindow(ctx actor.Context, rep CycleReport) {
	a.broken = false
	for _, w := range a.waiters {
		w <- rep
	}
	a.waiters = nil
	if a.stopping {
		return
	}
	if len(a.queued) > 0 {
		a.waiters, a.queued = a.queued, nil
		a.fill(ctx, 1)
		return
	}
	// A cycle that pushed nothing because the peer takes those events from
	// another sender waits for the interval; one that progressed goes on.
	stalled := rep.Deferred > 0 && rep.Through == rep.After
	if rep.Err == nil && rep.Through < rep.Tail && !stalled && a.s.cfg.Interval > 0 {
		ctx.Send(ctx.Self(), tick{})
		return
	}
	a.schedule(ctx, a.s.cfg.Interval)
}

// without returns s minus the values in drop.
func without(s, drop []uint64) []uint64 {
	if len(drop) == 0 {
		return s
	}
	out := make([]uint64, 0, len(s))
	for _, v := range s {
		if !slices.Contains(drop, v) {
			out = append(out, v)
		}
	}
	return out
}

func mergeRetry(a, b []uint64) []uint64 {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// maxReofferBytes caps the signed bytes of re-offers in one push.
const maxReofferBytes = 4 << 20

// nextCursor is the cursor after a successful push covering up to
// through: the re-offers it consumed leave the set, the ones the peer
// asked for join it. The set is bounded by persistence.MaxRetry (the
// store's limit): when more would be kept, the cursor stops short of the
// first re-offer that does not fit, so everything past it is offered
// again from the cursor instead of being forgotten (§14.1).
func nextCursor(cur persistence.SenderCursor, consumed, asked []uint64, through uint64) persistence.SenderCursor {
	retry := mergeRetry(without(cur.Retry, consumed), asked)
	if len(retry) <= persistence.MaxRetry {
		return persistence.SenderCursor{Seq: through, Retry: retry}
	}
	stop := retry[persistence.MaxRetry] - 1
	if stop < cur.Seq {
		// Even the old re-offers fill the set: do not move at all.
		return persistence.SenderCursor{Seq: cur.Seq, Retry: retry[:persistence.MaxRetry]}
	}
	return persistence.SenderCursor{Seq: min(through, stop), Retry: retry[:persistence.MaxRetry]}
}

// lagSeconds is how far the peer's reported watermarks trail this node's
// own (worst group); known is false when it cannot be stated.
func (a *senderActor) lagSeconds() (seconds float64, known bool) {
	ws, err := a.s.Watermarks(context.Background())
	if err != nil {
		return 0, false
	}
	return watermarkLag(ws, a.peerW)
}

// watermarkLag is the worst distance, in seconds, between this node's
// watermark of a group and the peer's, over the groups both report (SSP/1
// §14.2). A group the peer has not reported is unknown, not behind from
// time zero: counting it from zero read as decades of lag for a converged
// peer that had simply not been asked about that group yet. known is false
// when no group is reported by both.
func watermarkLag(ours []GroupWatermark, theirs map[persistence.GroupKey]messages.HLC) (seconds float64, known bool) {
	var worst uint64
	for _, w := range ours {
		t, ok := theirs[w.Group]
		if !ok || t == 0 {
			continue
		}
		known = true
		if o := w.HLC.Physical(); o > t.Physical() && o-t.Physical() > worst {
			worst = o - t.Physical()
		}
	}
	return float64(worst) / 1000, known
}
