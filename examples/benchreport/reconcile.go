package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// The reconciliation section (-only reconcile): two bbolt nodes holding n events
// that differ by d ∈ {0, 10, 1 000}. The store is built once and its
// directory copied; the d differences are then added to one copy in
// steps (d = 0, then 10 more, reconciled, then 1 000 more), so one build
// serves every d. Per d: round trips, wire bytes (the encoded range
// messages, fetches and fetched events) beside d × the mean signed event
// size and the target d × size + 64·d·⌈log₂(n/d)⌉ + a few KB, wall time
// and CPU. Both nodes run in this process over the in-process Network, so
// the CPU figure is both sides together (an upper bound on either side).

type reconcileParams struct {
	Events, Sites, Batch, Trials int
	Dir                          string // empty: a temporary directory
	// StoreCache, when set, keeps the built store in a subdirectory of it
	// (reconcile-<n>) and copies it on later runs instead of rebuilding.
	StoreCache string
}

// zeroBatch is how many d = 0 reconciliations one trial runs: a single
// one costs less than the kernel's CPU accounting resolves.
const zeroBatch = 100

func reconCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reconcileReport(p reconcileParams) error {
	ctx := context.Background()
	dir := p.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-reconcile-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	peers := benchPeers(p.Sites)
	fmt.Printf("\n== reconciliation: two bbolt nodes, n = %d events, differing by d (load: %s)\n", p.Events, loadAvg())
	build := time.Now()
	aDir, bDir := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	base := aDir
	if p.StoreCache != "" {
		base = filepath.Join(p.StoreCache, fmt.Sprintf("reconcile-%d", p.Events))
	}
	if _, err := os.Stat(filepath.Join(base, "node.db")); err == nil && base != aDir {
		fmt.Printf("   reusing the store in %s\n", base)
	} else {
		if err := preloadStore(ctx, base, peers, p.Events, p.Batch); err != nil {
			return fmt.Errorf("build the store: %w", err)
		}
		fmt.Printf("   store of %d events built in %v\n", p.Events, time.Since(build).Round(time.Second))
	}
	for _, d := range []string{aDir, bDir} {
		if d == base {
			continue
		}
		if err := copyDir(base, d); err != nil {
			return fmt.Errorf("copy the store: %w", err)
		}
	}

	open := func(name, d string) (*runtime.Node, error) {
		return runtime.Open(ctx, runtime.Config{Dir: d, MeshID: mesh, Name: name, SyncInterval: -1, ReconcileInterval: -1})
	}
	a, err := open("a", aDir)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := open("b", bDir)
	if err != nil {
		return err
	}
	defer b.Close()
	net := runtime.NewNetwork(1)
	net.Register("a", a)
	net.Register("b", b)
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		return err
	}

	type trial struct {
		rep       runtime.ReconcileReport
		wall, cpu time.Duration
	}
	run := func() (trial, error) {
		cpu0, t0 := reconCPU(), time.Now()
		rep, err := a.Reconcile(ctx, "b")
		return trial{rep, time.Since(t0), reconCPU() - cpu0}, err
	}
	// runMany is a trial of k reconciliations, each one's share.
	runMany := func(k int) (trial, error) {
		cpu0, t0 := reconCPU(), time.Now()
		var rep runtime.ReconcileReport
		for range k {
			var err error
			if rep, err = a.Reconcile(ctx, "b"); err != nil {
				return trial{}, err
			}
			if rep.Missing != 0 || rep.PeerLacks != 0 {
				return trial{}, fmt.Errorf("d = 0: found %d missing, %d lacking", rep.Missing, rep.PeerLacks)
			}
		}
		return trial{rep, time.Since(t0) / time.Duration(k), (reconCPU() - cpu0) / time.Duration(k)}, nil
	}
	fmt.Printf("   %-7s %6s %11s %13s %13s %22s %8s\n", "d", "rounds", "wire bytes", "d × size", "target", "wall min/med/max ms", "CPU ms")
	cpuCol := func(ms []float64) string { return fmt.Sprintf("%8.3f", ms[len(ms)/2]) }
	line := func(d int, ts []trial, size float64) {
		walls := make([]float64, len(ts))
		cpus := make([]float64, len(ts))
		for i, t := range ts {
			walls[i], cpus[i] = float64(t.wall.Microseconds())/1000, float64(t.cpu.Microseconds())/1000
		}
		slices.Sort(walls)
		slices.Sort(cpus)
		r := ts[0].rep
		wire := r.BytesSent + r.BytesReceived
		dsize, target := "—", "—"
		if d > 0 {
			dsize = fmt.Sprintf("%.0f", float64(d)*size)
			target = fmt.Sprintf("%.0f+KB", float64(d)*size+64*float64(d)*math.Ceil(math.Log2(float64(p.Events)/float64(d))))
		}
		note := ""
		if d == 0 {
			note = fmt.Sprintf(", each the mean of %d; CPU min/max %.3f/%.3f ms", zeroBatch, cpus[0], cpus[len(cpus)-1])
		}
		fmt.Printf("   %-7d %6d %11d %13s %13s %8.3f/%6.3f/%6.3f %s   (fetched %d, trials %d%s)\n",
			d, r.Rounds, wire, dsize, target, walls[0], walls[len(walls)/2], walls[len(walls)-1], cpuCol(cpus), r.Fetched, len(ts), note)
	}

	// d = 0: the sets agree.
	var zero []trial
	for range max(p.Trials, 1) {
		t, err := runMany(zeroBatch)
		if err != nil {
			return err
		}
		zero = append(zero, t)
	}
	line(0, zero, 0)

	next := 0 // index of the next extra event (epoch 1: new events of the same rows)
	for _, d := range []int{10, 1000} {
		extra, err := makeEventsRange(peers, next, next+d, 1)
		if err != nil {
			return err
		}
		next += d
		size := 0
		for _, raw := range extra {
			size += len(raw)
		}
		outs, err := b.ApplySignedBatch(ctx, extra)
		if err != nil {
			return err
		}
		for i, o := range outs {
			if o.Kind != messages.Applied {
				return fmt.Errorf("extra event %d: %v", i, o)
			}
		}
		t, err := run()
		if err != nil {
			return err
		}
		if t.rep.Missing != d || t.rep.Fetched != d {
			return fmt.Errorf("d = %d: found %d missing, fetched %d", d, t.rep.Missing, t.rep.Fetched)
		}
		line(d, []trial{t}, float64(size)/float64(d))
		again, err := run()
		if err != nil {
			return err
		}
		if again.rep.Missing != 0 || again.rep.Fetched != 0 {
			return fmt.Errorf("after d = %d: a second reconciliation found %d", d, again.rep.Missing)
		}
	}
	fmt.Printf("   (d = 0 CPU target: ≤ 100 ms per side; the CPU column is both sides in this process, median: an upper bound on each side)\n")
	return nil
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := string(b)
	if len(f) > 14 {
		f = f[:14]
	}
	return f
}
