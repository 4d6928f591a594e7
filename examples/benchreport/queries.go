package main

// The queries section (-only queries): secondary indexes.
//
// Apply rate with one index against none: the sync workload's signed
// events (makeEvents) applied to a fresh bbolt node (fsync on) whose
// table declares no index, or one index over the text column a; the two
// arms interleaved trial after trial (internal/ab), the ratio per trial
// index / none as median (min, max).
//
// Query latency by an index: a bbolt node holding -queries-rows rows
// (written untimed, Node.Write batches), with an index over (owner,
// prio) and 1 000 owners; each trial runs -queries-n queries (equality on
// a random owner, limit 10) and reports their p50 and p99; the table
// prints those per-trial values as median (min, max).

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	queriesRows   = flag.Int("queries-rows", 100000, "queries: rows of the queried table (the target is set at 1 000 000)")
	queriesN      = flag.Int("queries-n", 2000, "queries: queries per trial")
	queriesEvents = flag.Int("queries-events", 20000, "queries: signed events per apply trial")
	queriesTrials = flag.Int("queries-trials", 5, "queries: interleaved trials")
)

var queryTable = runtime.TableDef{Schema: "bench", Table: "q", KeyColumns: []string{"id"}, Columns: []string{"owner", "prio", "title"},
	Types:   map[string]runtime.ColumnType{"id": runtime.TypeInteger, "owner": runtime.TypeText, "prio": runtime.TypeInteger, "title": runtime.TypeText},
	Indexes: []runtime.IndexDef{{Name: "by_owner_prio", Columns: []string{"owner", "prio"}}}}

func queriesReport(rows, queries, events, trials int) error {
	ctx := context.Background()
	fmt.Printf("\n== queries: apply rate with one index vs none (%d events, bbolt, fsync on; %d interleaved trials)\n", events, trials)
	peers, raws, err := makeEvents(events, 4)
	if err != nil {
		return err
	}
	arm := func(indexed bool) func(int) (float64, error) {
		return func(int) (float64, error) { return queriesApplyTrial(ctx, peers, raws, indexed) }
	}
	s, err := ab.RunWarm(1, trials, ab.Arm{Name: "none", Run: arm(false)}, ab.Arm{Name: "index", Run: arm(true)})
	if err != nil {
		return err
	}
	ratio := s.Ratio("index", "none")
	fmt.Print(ab.Table([][2]string{
		{"no index (events/s)", s.Stats("none").Format("%.0f")},
		{"one index over a (events/s)", s.Stats("index").Format("%.0f")},
		{"one index / none, per trial", ratio.String() + "  " + ratio.Verdict(0.8, true)},
	}))

	fmt.Printf("\n== queries: equality on an index at %d rows, limit 10, %d queries per trial (bbolt; %d trials)\n", rows, queries, trials)
	dir, err := os.MkdirTemp("", "syncmesh-bench-queries-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	n, err := queriesFill(ctx, dir, rows)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Printf("(filled in %s, untimed)\n", time.Since(start).Round(time.Second))
	var p50s, p99s []float64
	rng := rand.New(rand.NewPCG(1, 2))
	for range trials {
		lat := make([]float64, 0, queries)
		for range queries {
			owner := fmt.Sprintf("user-%04d", rng.IntN(1000))
			t0 := time.Now()
			got := 0
			for _, err := range n.Query(ctx, runtime.Query{Schema: "bench", Table: "q", Index: "by_owner_prio", Eq: []any{owner}, Limit: 10}) {
				if err != nil {
					return err
				}
				got++
			}
			lat = append(lat, float64(time.Since(t0).Microseconds()))
			if got != min(10, rows/1000) {
				return fmt.Errorf("queries: %d rows for %s", got, owner)
			}
		}
		slices.Sort(lat)
		p50s = append(p50s, lat[len(lat)/2])
		p99s = append(p99s, lat[len(lat)*99/100])
	}
	p50 := ab.Summarize(p50s)
	fmt.Print(ab.Table([][2]string{
		{"p50 (µs)", p50.Format("%.0f") + "  " + verdictBelow(p50.Median, 1000)},
		{"p99 (µs)", ab.Summarize(p99s).Format("%.0f")},
	}))
	return nil
}

func verdictBelow(v, target float64) string {
	if v < target {
		return fmt.Sprintf("(target < %.0f: met)", target)
	}
	return fmt.Sprintf("(target < %.0f: NOT met)", target)
}

// queriesApplyTrial applies raws to a fresh node whose table has one index
// over a (indexed) or none, and returns events/s.
func queriesApplyTrial(ctx context.Context, peers []*peer, raws [][]byte, indexed bool) (float64, error) {
	dir, err := os.MkdirTemp("", "syncmesh-bench-qapply-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh, SyncInterval: -1, ReconcileInterval: -1})
	if err != nil {
		return 0, err
	}
	defer n.Close()
	def := benchTable
	if indexed {
		def.Indexes = []runtime.IndexDef{{Name: "by_a", Columns: []string{"a"}}}
	}
	if err := n.EnsureTable(ctx, def); err != nil {
		return 0, err
	}
	for _, p := range peers {
		if err := n.Trust(ctx, p.signer.Key()); err != nil {
			return 0, err
		}
	}
	return applyAll(ctx, n, raws, 4, 2000)
}

// queriesFill opens a node in dir holding rows rows of queryTable.
func queriesFill(ctx context.Context, dir string, rows int) (*runtime.Node, error) {
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
	if err != nil {
		return nil, err
	}
	if err := n.EnsureTable(ctx, queryTable); err != nil {
		n.Close()
		return nil, err
	}
	var b runtime.Batch
	for i := 0; i < rows; i += 1000 {
		b.Reset()
		for j := i; j < min(i+1000, rows); j++ {
			b.Upsert("bench", "q", map[string]any{"id": j}, map[string]any{"owner": fmt.Sprintf("user-%04d", j%1000), "prio": j % 97, "title": fmt.Sprintf("task %d", j)})
		}
		if _, err := n.Write(ctx, &b); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}
