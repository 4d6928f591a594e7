package persistence

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// Past MaxPreparedEvents outstanding preparations PrepareEvents prepares
// nothing more (the store does the work in its transaction), and
// releasing frees the budget again: what preparing holds is bounded
// however many events are in flight.
func TestPrepareStopsAtItsBudget(t *testing.T) {
	before := PreparedOutstanding()
	evs := make([]StoredEvent, MaxPreparedEvents-before+1)
	ptrs := make([]*StoredEvent, len(evs))
	for i := range evs {
		evs[i] = StoredEvent{ID: EventID{byte(i), byte(i >> 8), 1}, Raw: []byte{byte(i)}, Site: messages.SiteID{1}, HLC: messages.HLC(i),
			Schema: "s", Table: "t"}
		ptrs[i] = &evs[i]
	}
	PrepareEvents(ptrs, nil)
	last := &evs[len(evs)-1]
	if last.Prepared != nil {
		t.Fatalf("preparation %d of a budget of %d was made", len(evs)+int(before), MaxPreparedEvents)
	}
	if edge := &evs[len(evs)-2]; !edge.Prepared.For(edge) {
		t.Fatalf("the preparation at the budget's edge was not made")
	}
	evs[0].Prepared.Release()
	evs[0].Prepared.Release() // a second release changes nothing
	PrepareEvents([]*StoredEvent{last}, nil)
	if !last.Prepared.For(last) {
		t.Fatalf("a released preparation did not free the budget")
	}
	for i := 1; i < len(evs); i++ {
		evs[i].Prepared.Release()
	}
	if got := PreparedOutstanding(); got != before {
		t.Fatalf("%d outstanding after releasing everything, %d before", got, before)
	}
}
