package reconcile

import (
	"syscall"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// BenchmarkHostileRequest: one request naming a new bound and a
// fingerprint that never agrees, answered from an index of 200 000 keys
// of 4 sites (version 3: range sums).
func BenchmarkHostileRequest(b *testing.B) {
	g := Group{"s", "t"}
	m := newMem()
	m.horizons[g] = 0
	for i := 0; i < 200000; i++ {
		m.keys[g] = append(m.keys[g], key(byte(i%4), messages.HLC(1000+i), uint64(i)))
	}
	x := NewIndex(NewSet(m.keys[g]).Keys())
	src := &indexSource{m: m, x: x}
	b.ResetTimer()
	cpu0 := cpuNow()
	for i := 0; i < b.N; i++ {
		req := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: messages.HLC(1000 + 7*i%199000),
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: [16]byte{byte(i)}}}}}}
		if _, err := Respond(src, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuNow()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(src.charged)/float64(b.N), "charged/op")
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type indexSource struct {
	m       *memSource
	x       *Index
	charged int
}

func (s *indexSource) Ceiling() messages.HLC { return messages.HLC(^uint64(0)) }
func (s *indexSource) Charge(n int) error    { s.charged += n; return nil }

func (s *indexSource) Horizon(g Group) (messages.HLC, bool, error)  { return s.m.Horizon(g) }
func (s *indexSource) Keys(g Group, min messages.HLC) (View, error) { return s.x.View(min), nil }
func (s *indexSource) Sum(g Group, min messages.HLC) (uint64, lthash.Sum, error) {
	n, sum, _ := s.x.View(min).RangeSum(nil, nil)
	return n, sum, nil
}
