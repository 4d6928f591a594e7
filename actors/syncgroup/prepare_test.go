package syncgroup

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// Prepare's pooled scratch is not what the preparations live in: after
// later calls reuse it (nil requests among them, batches longer and
// shorter than before), every earlier request's preparation is still the
// one made for its own event, and the scratch back in the pool holds no
// event's bytes.
func TestPrepareScratchDoesNotAliasPreparations(t *testing.T) {
	r := &Router{deps: Deps{Store: memory.New()}}
	before := persistence.PreparedOutstanding()
	mk := func(n, seed int) []*Apply {
		reqs := make([]*Apply, n)
		for i := range reqs {
			if i%5 == 3 {
				continue // decided by the pure checks: no request
			}
			raw := []byte{byte(seed), byte(i), 0xaa}
			e := &messages.Event{Site: messages.SiteID{byte(seed)}, HLC: messages.HLC(1000*seed + i), Schema: "s", Table: "t"}
			reqs[i] = &Apply{ID: messages.EventID{byte(seed), byte(i)}, Raw: raw, Event: e, RowKey: []byte{0xa1}}
		}
		return reqs
	}
	var all [][]*Apply
	for seed, n := range []int{64, 7, 130, 64, 1} {
		reqs := mk(n, seed+1)
		r.Prepare(reqs)
		all = append(all, reqs)
		sc := prepScratch.Get().(*prepareScratch)
		for _, ev := range sc.evs[:cap(sc.evs)] {
			if ev.Raw != nil || ev.Prepared != nil {
				t.Fatalf("pooled scratch still holds an event: %+v", ev)
			}
		}
		prepScratch.Put(sc)
	}
	for b, reqs := range all {
		for i, req := range reqs {
			if req == nil {
				continue
			}
			se := stored(req)
			if !req.Prepared.For(&se) {
				t.Fatalf("batch %d request %d: its preparation is not its event's after later calls", b, i)
			}
			req.Release()
		}
	}
	if got := persistence.PreparedOutstanding(); got != before {
		t.Fatalf("%d preparations outstanding after release, %d before", got, before)
	}
}
