package replication

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// TestLeaderKillRounds kills the leader of a unit's partition while
// writers commit through it, every other round with its directories
// deleted, restarts it empty or not, and checks that every acknowledged
// write is on the successor. It logs the take-over times (kill until the
// successor passed its Barrier). Rounds: REPLICATION_SOAK_ROUNDS (make
// soak), default 1.
func TestLeaderKillRounds(t *testing.T) {
	rounds := 1
	if s := os.Getenv("REPLICATION_SOAK_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("REPLICATION_SOAK_ROUNDS=%q: %v", s, err)
		}
		rounds = n
	}
	c := newCluster(t, func(cfg *Config) { cfg.TrailingLogs = 16; cfg.SnapshotThreshold = 32 }, "a", "b", "c")
	ctx := context.Background()
	p := c.engines["a"].PartitionOf(unitA)
	var takeovers []time.Duration
	acked := map[string]bool{}
	for round := range rounds {
		l := c.leader(p)
		db, detach, err := c.engines[l].OpenUnit(unitA, bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					k := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					err := putMeta(cctx, db, k, "1")
					cancel()
					if err != nil {
						return
					}
					mu.Lock()
					acked[k] = true
					mu.Unlock()
				}
			}()
		}
		time.Sleep(150 * time.Millisecond) // let writes flow before the kill
		addr := c.addrs[l]
		killed := time.Now()
		_ = c.engines[l].Close()
		wipe := round%2 == 1
		if wipe {
			_ = os.RemoveAll(filepath.Join(c.root, l))
		}
		delete(c.engines, l)
		close(stop)
		wg.Wait()
		detach()
		_ = db.Close()
		succ := c.leader(p)
		if err := c.engines[succ].Barrier(ctx, p); err != nil {
			t.Fatal(err)
		}
		takeovers = append(takeovers, time.Since(killed))
		have := map[string]bool{}
		for _, line := range dumpUnit(t, c.engines[succ], unitA) {
			have[line] = true
		}
		lost := 0
		for k := range acked {
			if _, ok := metaOf(t, c.engines[succ], unitA, k); !ok {
				lost++
			}
		}
		if lost > 0 {
			t.Fatalf("round %d: %d of %d acknowledged writes missing on the successor %s", round, lost, len(acked), succ)
		}
		c.start(l, addr)
		c.setMembers()
		c.caughtUp(p, succ, l)
		sameContent(t, unitA, c.engines[succ], c.engines[l])
	}
	sort.Slice(takeovers, func(i, j int) bool { return takeovers[i] < takeovers[j] })
	q := func(f float64) time.Duration { return takeovers[int(f*float64(len(takeovers)-1))] }
	t.Logf("%d rounds, %d acknowledged writes, take-over p50 %v p99 %v max %v", rounds, len(acked), q(0.5), q(0.99), takeovers[len(takeovers)-1])
}
