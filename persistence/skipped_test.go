package persistence

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

func holder(user string, n int) SkippedHolder {
	return SkippedHolder{Peer: messages.DeviceAddress{User: user, Device: 1}, Count: n}
}

// TestPlanSkippedEvictionTable: the device-wide cap's plan at and past the
// cap, ties, and a cut to zero.
func TestPlanSkippedEvictionTable(t *testing.T) {
	for _, tc := range []struct {
		holders []SkippedHolder
		limit   int
		want    string
	}{
		{nil, 0, "[]"},
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 9, "[]"},
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 8, "[{a.1 1}]"},
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 7, "[{a.1 2}]"},
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 6, "[{a.1 3}]"}, // a tie at 3: the lower address
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 3, "[{a.1 4} {b.1 2}]"},
		{[]SkippedHolder{holder("a", 5), holder("b", 3), holder("c", 1)}, 0, "[{a.1 5} {b.1 3} {c.1 1}]"},
		{[]SkippedHolder{holder("c", 2), holder("b", 2), holder("a", 2)}, 4, "[{a.1 1} {b.1 1}]"},
		{[]SkippedHolder{holder("mallory", 2000), holder("alice", 9)}, 1000, "[{mallory.1 1009}]"},
	} {
		got := PlanSkippedEviction(tc.holders, tc.limit)
		s := "["
		for i, e := range got {
			if i > 0 {
				s += " "
			}
			s += fmt.Sprintf("{%s %d}", e.Peer, e.Count)
		}
		if s += "]"; s != tc.want {
			t.Errorf("PlanSkippedEviction(%v, %d) = %s, want %s", tc.holders, tc.limit, s, tc.want)
		}
	}
}

// TestPlanSkippedEvictionCutsTheLargestFirst: over random holders and
// limits, the plan removes exactly the excess, never more than a holder
// has, and leaves every peer that lost keys within one key of the largest
// count left, above every peer that lost none: no peer loses a key while
// another holds two more than it, and none holding less than limit /
// holders loses any.
func TestPlanSkippedEvictionCutsTheLargestFirst(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 13))
	for range 2000 {
		hs := make([]SkippedHolder, 1+r.IntN(8))
		total := 0
		for i := range hs {
			hs[i] = holder(fmt.Sprintf("p%d", i), r.IntN(30))
			total += hs[i].Count
		}
		limit := r.IntN(total + 5)
		plan := PlanSkippedEviction(hs, limit)
		lost := map[messages.DeviceAddress]int{}
		dropped := 0
		for _, e := range plan {
			lost[e.Peer] = e.Count
			dropped += e.Count
		}
		if want := max(0, total-limit); dropped != want {
			t.Fatalf("%v limit %d: dropped %d, want %d", hs, limit, dropped, want)
		}
		top := 0
		for _, h := range hs {
			if lost[h.Peer] > h.Count || lost[h.Peer] < 0 {
				t.Fatalf("%v limit %d: %s loses %d of %d", hs, limit, h.Peer, lost[h.Peer], h.Count)
			}
			top = max(top, h.Count-lost[h.Peer])
		}
		for _, h := range hs {
			left := h.Count - lost[h.Peer]
			if lost[h.Peer] > 0 && left < top-1 {
				t.Fatalf("%v limit %d: %s cut to %d while another keeps %d", hs, limit, h.Peer, left, top)
			}
			// The fair share: a peer under limit / holders keeps all.
			if lost[h.Peer] > 0 && h.Count < limit/len(hs) {
				t.Fatalf("%v limit %d: %s holds %d, under its share %d, and loses %d", hs, limit, h.Peer, h.Count, limit/len(hs), lost[h.Peer])
			}
		}
	}
}
