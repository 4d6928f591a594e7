package inbound

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// BenchmarkDurableReceive measures receives committed durably (bbolt with
// fsync) by the inbound actor, from 1 and from 64 concurrent callers: with
// group commit the concurrent rate is a multiple of the one-caller rate,
// which is bounded by one fsync per transaction (docs/architecture.md, "Costs": ~2.2 k
// fsync'd transactions/s here).
func BenchmarkDurableReceive(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "bench.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			s, err := New(actortest.System(b), Config{Store: db.Delivery()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var next atomic.Uint64
			b.ResetTimer()
			var wg sync.WaitGroup
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						n := next.Add(1)
						if n > uint64(b.N) {
							return
						}
						var id messages.LogicalMessageID
						id[0], id[1], id[2], id[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
						p, f := appPayload(id, "body")
						if _, err := s.Receive(bg, alice, p, f, nil); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
