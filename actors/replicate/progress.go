package replicate

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxSkewMS is SSP/1 §12's clock-skew bound, applied to watermark claims
// as to events: a claim more than this far in the receiver's future is
// refused.
const MaxSkewMS = 300_000

// pendingRange is a push recorded before the push covering the log just
// before it: its range and the gaps it left.
type pendingRange struct {
	after, through uint64
	gaps           []persistence.PeerGap
}

// MaxWindow is the most pushes one sender may have in flight toward a
// peer (Config.Window), and the most out-of-order pushes a receiver
// remembers per sender (maxPendingRanges): one bound for writer and
// reader, so a full window recorded in any order is never forgotten (a
// window of MaxWindow leaves at most MaxWindow-1 pushes waiting for the
// first).
const MaxWindow = 64

// maxPendingRanges bounds the out-of-order pushes remembered per sender.
const maxPendingRanges = MaxWindow

// maxGaps bounds the gaps remembered per sender: the store's limit, so
// whatever the receiver keeps can be written and read back. Past it the
// oldest are kept and the receive progress stops advancing (fail closed)
// until they fill.
const maxGaps = persistence.MaxPeerGaps

// progressInput is everything the receiver's progress decision reads:
// the sender's stored progress and pending ranges, the push and the
// outcomes its events had, who the transport authenticated, and the
// little of this node's state the claims are checked against.
type progressInput struct {
	Prog   persistence.PeerProgress
	Ranges []pendingRange
	Push   *messages.SyncPush
	Outs   []messages.Outcome
	// Site is the sender's own site, when its peer configuration binds
	// one (Bound): the only site its claims may name.
	Site  messages.SiteID
	Bound bool
	// Claimable reports whether a group of Site is in scope and defined
	// here; Current holds the stored watermarks of those groups.
	Claimable func(persistence.GroupKey) bool
	Current   map[persistence.GroupKey]messages.HLC
	// WallMS is the receiver's wall clock; ClockLast its HLC (every HLC
	// it applied is at or below it); Tail its log's last sequence.
	WallMS    uint64
	ClockLast messages.HLC
	Tail      uint64
}

// progressOutput is what the decision changes: the sender's progress
// and pending ranges, the watermarks to raise, and the push result
// (without the watermark report, which the shell reads from the store).
type progressOutput struct {
	Prog          persistence.PeerProgress
	Ranges        []pendingRange
	Raise         map[persistence.GroupKey]persistence.Watermark
	Result        *messages.PushResult
	Touched       map[persistence.GroupKey]bool
	RefusedClaims int
}

// decideProgress is the receiver's side of SSP/1 §14 as a pure function.
//
// The sender's progress is "everything it offered at or below Through
// applied, except Gaps". An event that did not apply (held, rejected)
// becomes a gap of its group; a later offer that applies fills it.
//
// A claim "every event of G at or below h is in the sender's log at or
// below seq" raises the watermark of G only when (the progress rule, see
// docs/replication.md):
//   - G belongs to the sender's own site, as its peer configuration binds
//     it (the transport authenticated the sender): nobody can speak for
//     another site, so no relay can make a node skip a site's events;
//   - G is in scope and defined here (the watermarks a node keeps are
//     bounded by its configured peers × its tables);
//   - h is within the skew bound of the receiver's wall clock (else the
//     claim is refused), and the raise is capped at the receiver's HLC;
//   - this node demonstrably applied all of it: Through ≥ seq and no gap
//     of G at or below seq.
//
// Nothing else moves a watermark, so it fails closed, and it never moves
// back (§14.2).
func decideProgress(in progressInput) progressOutput {
	prog := in.Prog
	ranges := clonePending(in.Ranges)
	push := in.Push
	if !bytes.Equal(prog.Log, push.Log) {
		// A new log at the sender: nothing known about it yet.
		prog = persistence.PeerProgress{Log: push.Log}
		ranges = nil
	}
	out := progressOutput{Result: &messages.PushResult{V: messages.SyncVersion}, Touched: map[persistence.GroupKey]bool{}, Raise: map[persistence.GroupKey]persistence.Watermark{}}
	res := out.Result
	held := map[persistence.GroupKey]bool{}
	extends := push.After <= prog.Through
	newThrough := prog.Through
	if extends && push.Through > newThrough {
		newThrough = push.Through
	}
	gaps := slices.Clone(prog.Gaps)
	var later []persistence.PeerGap // gaps of a push that does not extend the progress (yet)
	for i, ev := range push.Events {
		o := in.Outs[i]
		if o.Kind == messages.Dropped && o.Site == (messages.SiteID{}) {
			// Not authenticated: no group to account it to. Dropped events
			// are final and never re-offered (SSP/1 §13.6).
			res.Applied++
			continue
		}
		g := groupOf(o)
		out.Touched[g] = true
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
			newThrough = min(newThrough, ev.Seq-1)
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
	out.Prog, out.Ranges = prog, ranges

	// The receiver's HLC bounds a raise; this push's own events count too
	// (they are observed into the clock only once their transaction is
	// durable, and the record shares that transaction).
	limit := in.ClockLast
	for _, o := range in.Outs {
		if o.Kind != messages.Dropped && o.Kind != messages.Rejected && o.HLC > limit {
			limit = o.HLC
		}
	}
	for _, c := range push.Claims {
		g := storeGroup(c.Group)
		if !in.Bound || g.Site != in.Site || !in.Claimable(g) || c.HLC.Physical() > in.WallMS+MaxSkewMS {
			out.RefusedClaims++
			continue
		}
		out.Touched[g] = true
		if prog.Through < c.Seq || slices.ContainsFunc(prog.Gaps, func(x persistence.PeerGap) bool { return x.Group == g && x.Seq <= c.Seq }) {
			continue // not demonstrably applied (yet): not a lie, not a raise
		}
		h := min(c.HLC, limit)
		cur, ok := in.Current[g]
		if r, raised := out.Raise[g]; raised {
			cur, ok = r.HLC, true
		}
		if ok && cur >= h {
			continue
		}
		// Every event of g at or below h applied here is in this node's
		// log at or below its tail.
		out.Raise[g] = persistence.Watermark{HLC: h, Seq: in.Tail}
	}
	for g := range held {
		res.Held = append(res.Held, wireGroup(g))
	}
	slices.SortFunc(res.Held, compareGroups)
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

func compareGroups(a, b messages.Group) int {
	return cmp.Or(bytes.Compare(a.Site[:], b.Site[:]), cmp.Compare(a.Schema, b.Schema), cmp.Compare(a.Table, b.Table))
}

func clonePending(rs []pendingRange) []pendingRange {
	out := make([]pendingRange, len(rs))
	for i, r := range rs {
		out[i] = pendingRange{after: r.after, through: r.through, gaps: slices.Clone(r.gaps)}
	}
	return out
}
