package main

// The tables section (-only tables): local writes of a replicated table,
// one Upsert per row against Node.Write of batches of rows (each row still
// its own signed event; one transaction and one fsync per batch). Both
// arms write the same rows to a fresh bbolt store (fsync on), interleaved
// trial after trial (internal/ab); the report prints each arm's rows/s and
// the per-trial ratio batch / one-at-a-time as median (min, max).

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	tablesRows   = flag.Int("tables-rows", 1000, "tables: rows written per trial and arm")
	tablesBatch  = flag.Int("tables-batch", 100, "tables: rows per Node.Write batch")
	tablesTrials = flag.Int("tables-trials", 5, "tables: interleaved trials")
)

var todoTable = runtime.TableDef{Schema: "bench", Table: "todo", KeyColumns: []string{"id"}, Columns: []string{"title", "done", "due"}}

func tablesReport(rows, batch, trials int) error {
	fmt.Printf("\n== tables: local writes, %d rows per trial, one Upsert per row vs Node.Write of %d rows (bbolt, fsync on; %d interleaved trials)\n",
		rows, batch, trials)
	ctx := context.Background()
	arm := func(batched bool) func(int) (float64, error) {
		return func(int) (float64, error) { return tablesTrial(ctx, rows, batch, batched) }
	}
	s, err := ab.RunWarm(1, trials, ab.Arm{Name: "single", Run: arm(false)}, ab.Arm{Name: "batch", Run: arm(true)})
	if err != nil {
		return err
	}
	ratio := s.Ratio("batch", "single")
	fmt.Print(ab.Table([][2]string{
		{"one Upsert per row (rows/s)", s.Stats("single").Format("%.0f")},
		{fmt.Sprintf("Node.Write, %d rows per batch (rows/s)", batch), s.Stats("batch").Format("%.0f")},
		{"batch / one at a time, per trial", ratio.String() + "  " + ratio.Verdict(10, true)},
	}))
	return nil
}

// tablesTrial opens a fresh node (untimed), writes rows rows and returns
// the rate in rows/s.
func tablesTrial(ctx context.Context, rows, batch int, batched bool) (float64, error) {
	dir, err := os.MkdirTemp("", "syncmesh-bench-tables-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh, Name: "tables", SyncInterval: -1, ReconcileInterval: -1})
	if err != nil {
		return 0, err
	}
	defer n.Close()
	if err := n.DefineTable(ctx, todoTable); err != nil {
		return 0, err
	}
	row := func(i int) (map[string]any, map[string]any) {
		return map[string]any{"id": i}, map[string]any{"title": fmt.Sprintf("task %d", i), "done": i%3 == 0, "due": int64(1_800_000_000 + i)}
	}
	start := time.Now()
	if batched {
		var b runtime.Batch
		for i := 0; i < rows; i += batch {
			b.Reset()
			for j := i; j < min(i+batch, rows); j++ {
				k, v := row(j)
				b.Upsert(todoTable.Schema, todoTable.Table, k, v)
			}
			if _, err := n.Write(ctx, &b); err != nil {
				return 0, err
			}
		}
	} else {
		for i := range rows {
			k, v := row(i)
			if _, err := n.Upsert(ctx, todoTable.Schema, todoTable.Table, k, v); err != nil {
				return 0, err
			}
		}
	}
	rate := float64(rows) / time.Since(start).Seconds()
	// Every row is there: a rate of writes that did not land is no rate.
	got := 0
	for _, err := range n.Rows(ctx, todoTable.Schema, todoTable.Table, runtime.ScanOptions{}) {
		if err != nil {
			return 0, err
		}
		got++
	}
	if got != rows {
		return 0, fmt.Errorf("tables: %d rows written, %d read back", rows, got)
	}
	return rate, nil
}
