package main

// The watch section (-only watch): commits/s of one writer with four idle
// watchers (each on a table that never changes) against none, with the
// change log holding watchPreload changes of the written table. An idle
// watcher is woken by every commit; what it then does must not cost the
// writer: target ≥ 0.9. The arms are interleaved trial after trial
// (internal/ab), each on a fresh copy of one preloaded store.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	watchPreload = flag.Int("watch-preload", 90_000, "watch: changes in the log before each trial")
	watchCommits = flag.Int("watch-commits", 2_000, "watch: commits per trial and arm (one write each)")
	watchTrials  = flag.Int("watch-trials", 11, "watch: interleaved trials (after one warm-up round of each arm)")
	watchFsync   = flag.Bool("watch-fsync", false, "watch: fsync on (off by default: the watchers' CPU is what is measured)")
)

var watchBusy = runtime.TableDef{Schema: "app", Table: "busy", KeyColumns: []string{"id"}, Columns: []string{"v"}}

func watchQuiet(i int) runtime.TableDef {
	return runtime.TableDef{Schema: "app", Table: fmt.Sprintf("quiet%d", i), KeyColumns: []string{"id"}, Columns: []string{"v"}}
}

func watchReport(preload, commits, trials int) error {
	fmt.Printf("\n== change feed: commits/s of one writer with 4 idle watchers (tables that never change) vs none; %d changes in the log, %d commits per trial, fsync %v, %d interleaved trials after a warm-up round (min / median / max)\n",
		preload, commits, *watchFsync, trials)
	ctx := context.Background()
	work, err := os.MkdirTemp("", "benchwatch")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tmpl := filepath.Join(work, "template")
	if err := watchPreloadStore(ctx, tmpl, preload); err != nil {
		return err
	}
	cpu := map[int][]float64{}
	arm := func(watchers int) func(int) (float64, error) {
		return func(t int) (float64, error) {
			dir := filepath.Join(work, fmt.Sprintf("w%d-t%d", watchers, t))
			defer os.RemoveAll(dir)
			if err := copyDir(tmpl, dir); err != nil {
				return 0, err
			}
			rate, perCommit, err := watchTrial(ctx, dir, watchers, preload, commits)
			if t > 0 { // not the warm-up round
				cpu[watchers] = append(cpu[watchers], perCommit)
			}
			return rate, err
		}
	}
	// One warm-up round of each arm first: the process's first trials pay
	// for its heap and page cache growing, whichever arm runs them.
	s, err := ab.RunWarm(1, trials, ab.Arm{Name: "none", Run: arm(0)}, ab.Arm{Name: "four", Run: arm(4)})
	if err != nil {
		return err
	}
	ratio := s.Ratio("four", "none")
	fmt.Print(ab.Table([][2]string{
		{"commits/s, no watcher", s.Stats("none").Format("%.0f")},
		{"commits/s, 4 idle watchers", s.Stats("four").Format("%.0f")},
		{"ratio four / none (per trial)", ratio.String() + "  " + ratio.Verdict(0.9, true)},
		{"process CPU µs per commit, no watcher", ab.Summarize(cpu[0]).Format("%.0f")},
		{"process CPU µs per commit, 4 idle watchers", ab.Summarize(cpu[4]).Format("%.0f")},
		{"CPU ratio none / four (per trial; the machine's other load does not count)", ab.Paired(cpu[0], cpu[4]).String()},
	}))
	return nil
}

func watchOpen(ctx context.Context, dir string) (*runtime.Node, error) {
	return runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: []byte("bench-watch"), NoSync: !*watchFsync, SyncInterval: -1, ReconcileInterval: -1, ChangeLogLimit: runtime.DefaultChangeLogLimit})
}

// watchPreloadStore writes preload changes of the busy table, from
// several goroutines so the writes group-commit.
func watchPreloadStore(ctx context.Context, dir string, preload int) error {
	n, err := watchOpen(ctx, dir)
	if err != nil {
		return err
	}
	defer n.Close()
	for _, d := range []runtime.TableDef{watchBusy, watchQuiet(0), watchQuiet(1), watchQuiet(2), watchQuiet(3)} {
		if err := n.DefineTable(ctx, d); err != nil {
			return err
		}
	}
	const writers = 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < preload; i += writers {
				if _, err := n.Upsert(ctx, "app", "busy", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// watchTrial returns commits/s and the process's CPU µs per commit.
func watchTrial(ctx context.Context, dir string, watchers, preload, commits int) (float64, float64, error) {
	n, err := watchOpen(ctx, dir)
	if err != nil {
		return 0, 0, err
	}
	defer n.Close()
	last, err := n.LastChangeSeq(ctx)
	if err != nil {
		return 0, 0, err
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	werr := make(chan error, watchers)
	for i := 0; i < watchers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// From now: an idle watcher waiting for its table's next
			// change. (A watcher resuming from before the log's start
			// walks the log once, on its first read.)
			for _, err := range n.Watch(wctx, "app", watchQuiet(i).Table, last) {
				if err != nil && !errors.Is(err, context.Canceled) {
					werr <- err
				}
				if err != nil {
					return
				}
			}
		}(i)
	}
	time.Sleep(50 * time.Millisecond) // the watchers are waiting
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < commits; i++ {
		id := preload + i
		if _, err := n.Upsert(ctx, "app", "busy", map[string]any{"id": id}, map[string]any{"v": id}); err != nil {
			cancel()
			return 0, 0, err
		}
	}
	el, cpuS := time.Since(start), cpuTime()-cpu0
	cancel()
	wg.Wait()
	close(werr)
	if err := <-werr; err != nil {
		return 0, 0, fmt.Errorf("watch: idle watcher: %w", err)
	}
	return float64(commits) / el.Seconds(), cpuS * 1e6 / float64(commits), nil
}
