package replicate

import (
	"bytes"
	"context"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var (
	self  = messages.SiteID{0xee}
	siteA = messages.SiteID{0xa}
	gT    = persistence.GroupKey{Site: siteA, Schema: "app", Table: "t"}
	gU    = persistence.GroupKey{Site: siteA, Schema: "app", Table: "u"}
	logA  = bytes.Repeat([]byte{1}, 16)
)

// testWall is the receivers' wall clock in these tests (Unix ms); every
// test HLC lies far below it.
const testWall = 1 << 40

func testDeps() *Deps {
	return &Deps{Self: self, Own: NewOwnWrites(0), InScope: func(schema, table string) bool { return table != "hidden" },
		WallMS: func() uint64 { return testWall }, ClockLast: func() messages.HLC { return messages.HLC(1) << 60 }, Metrics: noMetrics()}
}

// fromA is sender "a", bound to siteA (the origin of gT and gU).
var fromA = senderInfo{site: siteA, bound: true}

// newStore returns a memory store with app.t, app.u and app.hidden
// defined (claims are only accepted for defined tables).
func newStore(t *testing.T) persistence.SyncStore {
	t.Helper()
	st := memory.New()
	if err := st.Update(context.Background(), func(tx persistence.SyncTx) error {
		for _, tb := range []string{"t", "u", "hidden"} {
			if err := tx.PutTable(persistence.TableDef{Schema: "app", Table: tb, KeyColumns: []string{"id"}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

func applied(g persistence.GroupKey) messages.Outcome {
	return messages.Outcome{Kind: messages.Applied, Site: g.Site, Schema: g.Schema, Table: g.Table}
}

func held(g persistence.GroupKey) messages.Outcome {
	o := applied(g)
	o.Kind = messages.Held
	return o
}

func claim(g persistence.GroupKey, h messages.HLC, seq uint64) messages.WatermarkClaim {
	return messages.WatermarkClaim{Group: wireGroup(g), HLC: h, Seq: seq}
}

func push(after, through uint64, seqs []uint64, claims ...messages.WatermarkClaim) *messages.SyncPush {
	p := &messages.SyncPush{V: messages.SyncVersion, From: "a", Log: logA, After: after, Through: through, Tail: through, Claims: claims}
	for _, s := range seqs {
		p.Events = append(p.Events, messages.PushedEvent{Seq: s, Raw: []byte{1}})
	}
	return p
}

// record runs recordPush in one transaction and returns the result and
// the watermarks afterwards.
func record(t *testing.T, st persistence.SyncStore, p *messages.SyncPush, outs ...messages.Outcome) (*messages.PushResult, map[persistence.GroupKey]messages.HLC) {
	t.Helper()
	return recordWith(t, st, nil, p, outs...)
}

// recordWith is record threading the receiver's pending out-of-order
// ranges through *ranges (nil: none kept).
func recordWith(t *testing.T, st persistence.SyncStore, ranges *[]pendingRange, p *messages.SyncPush, outs ...messages.Outcome) (*messages.PushResult, map[persistence.GroupKey]messages.HLC) {
	t.Helper()
	var res *messages.PushResult
	if err := st.Update(context.Background(), func(tx persistence.SyncTx) error {
		var in []pendingRange
		if ranges != nil {
			in = *ranges
		}
		r, err := recordPush(tx, testDeps(), fromA, p, outs, in)
		if err == nil && ranges != nil {
			*ranges = r.ranges
		}
		res = r.res
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wm := map[persistence.GroupKey]messages.HLC{}
	_ = st.View(context.Background(), func(tx persistence.SyncReader) error {
		return tx.Watermarks(func(g persistence.GroupKey, w persistence.Watermark) (bool, error) { wm[g] = w.HLC; return true, nil })
	})
	return res, wm
}

func TestClaimRaisesWatermarkOnlyWhenDemonstrablyApplied(t *testing.T) {
	st := newStore(t)
	// The claim reaches past what was pushed: not accepted.
	_, wm := record(t, st, push(0, 3, []uint64{1, 2, 3}, claim(gT, 50, 4)), applied(gT), applied(gT), applied(gT))
	if _, ok := wm[gT]; ok {
		t.Fatal("claim beyond the pushed range raised the watermark")
	}
	// Everything up to 5 applied: accepted.
	res, wm := record(t, st, push(3, 5, []uint64{4, 5}, claim(gT, 50, 5)), applied(gT), applied(gT))
	if wm[gT] != 50 || res.Applied != 2 {
		t.Fatalf("watermark %v, result %+v", wm[gT], res)
	}
	// A lower claim never lowers it.
	if _, wm = record(t, st, push(5, 5, nil, claim(gT, 40, 5))); wm[gT] != 50 {
		t.Fatalf("watermark went back to %v", wm[gT])
	}
}

func TestHeldEventIsAGapUntilReofferedAndApplied(t *testing.T) {
	st := newStore(t)
	res, wm := record(t, st, push(0, 4, []uint64{1, 2, 3, 4}, claim(gT, 60, 4), claim(gU, 70, 4)),
		applied(gT), held(gU), applied(gT), applied(gU))
	if len(res.Retry) != 1 || res.Retry[0] != 2 || len(res.Held) != 1 || res.Held[0] != wireGroup(gU) {
		t.Fatalf("result %+v", res)
	}
	if wm[gT] != 60 {
		t.Fatalf("gap in another group blocked t's watermark: %v", wm)
	}
	if _, ok := wm[gU]; ok {
		t.Fatal("u's watermark moved past its held event")
	}
	// The re-offer applies; the claim is accepted now.
	res, wm = record(t, st, push(4, 4, []uint64{2}, claim(gU, 70, 4)), applied(gU))
	if len(res.Retry) != 0 || wm[gU] != 70 {
		t.Fatalf("after the re-offer applied: %+v, watermarks %v", res, wm)
	}
}

func TestRejectedForSkewIsRetriedAndCounted(t *testing.T) {
	st := newStore(t)
	o := applied(gT)
	o.Kind, o.Reason = messages.Rejected, messages.ReasonClockSkew
	res, wm := record(t, st, push(0, 2, []uint64{1, 2}, claim(gT, 9, 2)), applied(gT), o)
	if res.Rejected != 1 || len(res.Retry) != 1 || res.Retry[0] != 2 {
		t.Fatalf("result %+v", res)
	}
	if _, ok := wm[gT]; ok {
		t.Fatal("watermark moved past a rejected event")
	}
}

func TestCoverageHoleNeverAdvancesProgress(t *testing.T) {
	st := newStore(t)
	record(t, st, push(0, 2, []uint64{1, 2}), applied(gT), applied(gT))
	// A push starting past what this node saw (its sequences 3..5 never
	// arrived): nothing about them can be demonstrated.
	_, wm := record(t, st, push(5, 8, []uint64{6, 7, 8}, claim(gT, 80, 8)), applied(gT), applied(gT), applied(gT))
	if _, ok := wm[gT]; ok {
		t.Fatal("watermark advanced over a hole in the sender's log coverage")
	}
	var p persistence.PeerProgress
	_ = st.View(context.Background(), func(tx persistence.SyncReader) error { p, _, _ = tx.PeerProgress("a"); return nil })
	if p.Through != 2 {
		t.Fatalf("progress through %d, want 2", p.Through)
	}
}

func TestNewSenderLogResetsProgress(t *testing.T) {
	st := newStore(t)
	record(t, st, push(0, 9, []uint64{9}), applied(gT))
	p := push(9, 9, nil, claim(gT, 5, 9))
	p.Log = bytes.Repeat([]byte{2}, 16)
	if _, wm := record(t, st, p); len(wm) != 0 {
		t.Fatalf("a claim about a new log was accepted on the old log's progress: %v", wm)
	}
}

func TestClaimsOutsideScopeOrForOwnSiteAreIgnored(t *testing.T) {
	st := newStore(t)
	hidden := persistence.GroupKey{Site: siteA, Schema: "app", Table: "hidden"}
	mine := persistence.GroupKey{Site: self, Schema: "app", Table: "t"}
	_, wm := record(t, st, push(0, 1, []uint64{1}, claim(hidden, 5, 1), claim(mine, 5, 1)), applied(gT))
	if len(wm) != 0 {
		t.Fatalf("accepted %v", wm)
	}
}

func TestOwnWritesSafeStaysBelowInFlightAndNeverDecreases(t *testing.T) {
	o := NewOwnWrites(100)
	if h, ok := o.Safe(gT); !ok || h != 100 {
		t.Fatalf("floor: %v %v", h, ok)
	}
	next := messages.HLC(200)
	issue := func() (messages.HLC, error) { next += 10; return next, nil }
	h1, _ := o.Begin(gT, issue) // 210
	h2, _ := o.Begin(gT, issue) // 220
	if h, _ := o.Safe(gT); h != h1-1 {
		t.Fatalf("with %v in flight Safe = %v", h1, h)
	}
	if h, _ := o.Safe(gU); h != h2 {
		t.Fatalf("other group: %v", h)
	}
	o.End(gT, h2, true)
	if h, _ := o.Safe(gT); h != h1-1 {
		t.Fatalf("the later write finishing first moved Safe to %v", h)
	}
	o.End(gT, h1, false) // unknown outcome: stays in flight
	if h, _ := o.Safe(gT); h != h1-1 {
		t.Fatalf("after an unknown outcome Safe = %v", h)
	}
	o2 := NewOwnWrites(0)
	h3, _ := o2.Begin(gT, issue)
	o2.End(gT, h3, true)
	if h, ok := o2.Safe(gT); !ok || h != h3 {
		t.Fatalf("all durable: %v %v", h, ok)
	}
}

// Pushes in flight together may be recorded out of order: the later one
// waits (in memory) until the earlier one is recorded, then both count.
func TestOutOfOrderPushesMergeOnceContiguous(t *testing.T) {
	st := newStore(t)
	var ranges []pendingRange
	rec := func(p *messages.SyncPush, outs ...messages.Outcome) map[persistence.GroupKey]messages.HLC {
		t.Helper()
		_, wm := recordWith(t, st, &ranges, p, outs...)
		return wm
	}
	// The second push (4..6, with a held event at 5) arrives first.
	if wm := rec(push(3, 6, []uint64{4, 5, 6}, claim(gT, 90, 6)), applied(gT), held(gU), applied(gT)); len(wm) != 0 {
		t.Fatalf("claim accepted before the range before it: %v", wm)
	}
	wm := rec(push(0, 3, []uint64{1, 2, 3}, claim(gT, 40, 3)), applied(gT), applied(gT), applied(gT))
	if wm[gT] != 40 {
		t.Fatalf("after the first push: %v", wm)
	}
	var p persistence.PeerProgress
	_ = st.View(context.Background(), func(tx persistence.SyncReader) error { p, _, _ = tx.PeerProgress("a"); return nil })
	if p.Through != 6 || len(p.Gaps) != 1 || p.Gaps[0].Seq != 5 || len(ranges) != 0 {
		t.Fatalf("progress after merging: %+v, pending %v", p, ranges)
	}
	// The held event's gap blocks u, not t.
	if wm := rec(push(6, 6, nil, claim(gT, 90, 6), claim(gU, 95, 6))); wm[gT] != 90 || wm[gU] != 0 {
		t.Fatalf("after merging: %v", wm)
	}
}
