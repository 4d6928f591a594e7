package persistence

import (
	"testing"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
)

func benchEvents(n int) []*StoredEvent {
	evs := make([]*StoredEvent, n)
	for i := range evs {
		evs[i] = &StoredEvent{ID: EventID{byte(i), byte(i >> 8), 1}, Raw: make([]byte, 190), Site: messages.SiteID{byte(i % 4)},
			HLC: messages.HLC(i), Schema: "bench", Table: "t"}
	}
	return evs
}

// BenchmarkPrepareEvents prepares a verified batch of 64 events of 4
// sites (sealed): the work PrepareEvents moves off the writer, per event.
func BenchmarkPrepareEvents(b *testing.B) {
	s, err := sealed.New(sealed.Key{1})
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents(64)
	b.ReportAllocs()
	for i := 0; i < b.N; i += len(evs) {
		PrepareEvents(evs, s)
		for _, ev := range evs {
			ev.Prepared.Release()
		}
	}
}

// BenchmarkUnpreparedWork is what the writer did per event instead: seal
// and add the key's expansion to a sum.
func BenchmarkUnpreparedWork(b *testing.B) {
	s, err := sealed.New(sealed.Key{1})
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents(64)
	var sum lthash.Sum
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ev := evs[i%len(evs)]
		k := messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID)
		sum.Add(k[:])
		if _, err := s.Seal(RecordEvent, ev.ID[:], ev.Raw); err != nil {
			b.Fatal(err)
		}
	}
}
