package replication

import (
	"strings"
	"testing"
	"time"

	metrics "github.com/hashicorp/go-metrics/compat"
)

// maxIdleAppendsPerSec bounds the AppendEntries RPCs (heartbeats not
// counted) an idle partition's followers receive in all: two followers,
// each told the commit index once per commitTimeout at most, with room
// for a stray catch-up.
const maxIdleAppendsPerSec = 2*float64(time.Second/commitTimeout) + 20

// TestIdlePartitionSendsFewAppends: a partition with nothing to commit
// sends its followers few AppendEntries (raft's CommitTimeout), so idle
// partitions do not keep the members' raft loops busy. raft reports the
// RPCs it receives to go-metrics; the test swaps in an in-memory sink.
func TestIdlePartitionSendsFewAppends(t *testing.T) {
	c := newCluster(t, func(cfg *Config) { cfg.Partitions = 1 }, "a", "b", "c")
	w := c.writer(unitA)
	w.put("k", "v")
	l := c.leader(0)
	c.caughtUp(0, l, "a", "b", "c")

	mc := metrics.DefaultConfig("idle")
	mc.EnableHostname, mc.EnableRuntimeMetrics = false, false
	t.Cleanup(metrics.Shutdown) // back to the default: nothing collected
	// A leadership change in the window brings a catch-up, not an idle
	// partition's traffic: the window is measured again.
	var n int
	var el time.Duration
	for attempt := 0; ; attempt++ {
		term, _ := c.engines[l].Term(0)
		sink := metrics.NewInmemSink(time.Hour, time.Hour)
		if _, err := metrics.NewGlobal(mc, sink); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		time.Sleep(1500 * time.Millisecond)
		el = time.Since(start)
		metrics.Shutdown()
		n = 0
		for _, iv := range sink.Data() {
			for k, s := range iv.Samples {
				if strings.Contains(k, "rpcEnqueue") && strings.HasSuffix(k, "rpcType=AppendEntries") {
					n += s.Count
				}
			}
		}
		if now, leading := c.engines[l].Term(0); (now == term && leading) || attempt == 2 {
			break
		}
		l = c.leader(0)
	}
	rate := float64(n) / el.Seconds()
	t.Logf("idle partition: %d AppendEntries to its followers in %v (%.0f/s)", n, el.Round(time.Millisecond), rate)
	if rate > maxIdleAppendsPerSec {
		t.Fatalf("idle partition: %.0f AppendEntries/s to its followers, more than %.0f/s", rate, maxIdleAppendsPerSec)
	}
}
