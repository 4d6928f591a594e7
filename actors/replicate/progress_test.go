package replicate

import (
	"context"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func decideInput(p *messages.SyncPush, outs ...messages.Outcome) progressInput {
	return progressInput{Push: p, Outs: outs, Site: siteA, Bound: true,
		Claimable: func(g persistence.GroupKey) bool { return g.Table != "undefined" },
		Current:   map[persistence.GroupKey]messages.HLC{}, WallMS: testWall, ClockLast: 1 << 60, Tail: 7}
}

// The progress rule, decided as a pure function: each refusal reason in
// turn, and the one claim that raises.
func TestDecideProgressAcceptsOnlyTheOriginsPlausibleAppliedClaims(t *testing.T) {
	other := persistence.GroupKey{Site: messages.SiteID{0xb}, Schema: "app", Table: "t"}
	undefined := persistence.GroupKey{Site: siteA, Schema: "app", Table: "undefined"}
	future, _ := messages.NewHLC(testWall+MaxSkewMS+1, 0)
	cases := []struct {
		name    string
		mod     func(*progressInput)
		claim   messages.WatermarkClaim
		refused int
		raise   bool
	}{
		{"own site, applied", nil, claim(gT, 50, 1), 0, true},
		{"another site's group", nil, claim(other, 50, 1), 1, false},
		{"sender bound to no site", func(in *progressInput) { in.Bound = false }, claim(gT, 50, 1), 1, false},
		{"undefined table", nil, claim(undefined, 50, 1), 1, false},
		{"beyond the skew bound", nil, claim(gT, future, 1), 1, false},
		{"beyond what was applied", nil, claim(gT, 50, 2), 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := decideInput(push(0, 2, []uint64{1}, c.claim), applied(gT))
			if c.mod != nil {
				c.mod(&in)
			}
			in.Push.Through, in.Push.Tail = 1, 1 // applied: sequence 1 only
			out := decideProgress(in)
			_, raised := out.Raise[storeGroup(c.claim.Group)]
			if out.RefusedClaims != c.refused || raised != c.raise {
				t.Fatalf("refused %d raised %v; want %d %v", out.RefusedClaims, raised, c.refused, c.raise)
			}
		})
	}
}

func TestDecideProgressCapsAtTheReceiversClockAndNeverLowers(t *testing.T) {
	in := decideInput(push(0, 1, []uint64{1}, claim(gT, 500, 1)), applied(gT))
	in.ClockLast = 300
	if out := decideProgress(in); out.Raise[gT].HLC != 300 {
		t.Fatalf("raise %v, want capped at 300", out.Raise[gT])
	}
	in.Current[gT] = 400
	if out := decideProgress(in); len(out.Raise) != 0 {
		t.Fatalf("a claim below the current watermark raised it: %v", out.Raise)
	}
}

// The decision does not touch its input (it is pure): the caller's
// ranges and progress stay as they were.
func TestDecideProgressLeavesItsInputAlone(t *testing.T) {
	in := decideInput(push(3, 6, []uint64{4, 5}), applied(gT), held(gU))
	in.Ranges = []pendingRange{{after: 6, through: 9, gaps: []persistence.PeerGap{{Seq: 5, Group: gU}}}}
	in.Prog = persistence.PeerProgress{Log: logA, Through: 3, Gaps: []persistence.PeerGap{{Seq: 2, Group: gT}}}
	decideProgress(in)
	if len(in.Ranges[0].gaps) != 1 || len(in.Prog.Gaps) != 1 || in.Prog.Through != 3 {
		t.Fatalf("input changed: %+v %+v", in.Ranges, in.Prog)
	}
}

func TestDecideProgressStopsAtTheGapLimit(t *testing.T) {
	in := decideInput(push(0, 2, []uint64{1, 2}), held(gU), held(gU))
	in.Prog = persistence.PeerProgress{Log: logA}
	for i := 0; i < maxGaps-1; i++ {
		in.Prog.Gaps = append(in.Prog.Gaps, persistence.PeerGap{Seq: 100 + uint64(i), Group: gU})
	}
	out := decideProgress(in)
	if len(out.Prog.Gaps) != maxGaps || out.Prog.Through != 1 {
		t.Fatalf("at the limit: %d gaps, through %d; want %d and 1", len(out.Prog.Gaps), out.Prog.Through, maxGaps)
	}
}

func TestNextCursorNeverForgetsPastTheRetryLimit(t *testing.T) {
	// One slot left in the re-offer set, two new re-offers asked for.
	var cur persistence.SenderCursor
	for i := 0; i < persistence.MaxRetry-1; i++ {
		cur.Retry = append(cur.Retry, uint64(i)+1)
	}
	cur.Seq = uint64(persistence.MaxRetry)
	asked := []uint64{cur.Seq + 5, cur.Seq + 9}
	next := nextCursor(cur, nil, asked, cur.Seq+20)
	if len(next.Retry) != persistence.MaxRetry || next.Seq != cur.Seq+8 {
		t.Fatalf("cursor %d with %d re-offers; want it to stop at %d with %d", next.Seq, len(next.Retry), cur.Seq+8, persistence.MaxRetry)
	}
	if n := nextCursor(persistence.SenderCursor{Seq: 3, Retry: []uint64{2}}, []uint64{2}, nil, 9); n.Seq != 9 || len(n.Retry) != 0 {
		t.Fatalf("consumed re-offer: %+v", n)
	}
}

// TestWindowAndPendingRangesShareOneBound: a sender never has more than
// MaxWindow pushes in flight (Config.Window is clamped there), and the
// receiver remembers MaxWindow out-of-order pushes: a full window whose
// first push is recorded last all counts once it is; one push more than
// the bound waiting is the oldest forgotten, and progress stops before
// it (fail closed: offered again from the sender's cursor).
func TestWindowAndPendingRangesShareOneBound(t *testing.T) {
	for _, w := range []int{MaxWindow, MaxWindow + 1} {
		d := *testDeps()
		d.Store, d.Name, d.LogID = newStore(t), "b", logA
		d.Apply = func(context.Context, [][]byte) ([]messages.Outcome, error) { return nil, nil }
		s, err := NewService(actor.NewActorSystem(), d, Config{Window: w})
		if err != nil {
			t.Fatal(err)
		}
		if s.cfg.Window != MaxWindow {
			t.Fatalf("Window %d configured as %d, want %d", w, s.cfg.Window, MaxWindow)
		}
		s.Close()
	}
	for _, waiting := range []int{MaxWindow - 1, MaxWindow, MaxWindow + 1} {
		st := newStore(t)
		var ranges []pendingRange
		// Pushes 2..waiting+1 (one event each) arrive before push 1.
		for k := 2; k <= waiting+1; k++ {
			recordWith(t, st, &ranges, push(uint64(k-1), uint64(k), []uint64{uint64(k)}), applied(gT))
		}
		if len(ranges) != min(waiting, maxPendingRanges) {
			t.Fatalf("%d waiting: %d remembered, bound %d", waiting, len(ranges), maxPendingRanges)
		}
		recordWith(t, st, &ranges, push(0, 1, []uint64{1}), applied(gT))
		var p persistence.PeerProgress
		_ = st.View(context.Background(), func(tx persistence.SyncReader) error { p, _, _ = tx.PeerProgress("a"); return nil })
		want := uint64(waiting + 1) // every push counted
		if waiting > maxPendingRanges {
			want = 1 // the push right after the first was forgotten: nothing past the first counts
		}
		if p.Through != want {
			t.Fatalf("%d waiting: progress through %d, want %d", waiting, p.Through, want)
		}
	}
}
