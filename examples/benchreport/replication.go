package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime/hosting/replication"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

var (
	replCommits = flag.Int("replication-commits", 2000, "commits per trial and arm at 64 in flight (a fifth of it at 1 in flight)")
	replTrials  = flag.Int("replication-trials", 3, "interleaved trials per comparison")
	replUnits   = flag.Int("replication-idle-units", 10000, "idle replicated units for the memory per unit")
	replParts   = flag.Int("replication-partitions", 16, "partitions (raft groups per member)")
	replProfile = flag.String("replication-cpuprofile", "", "replication: write a CPU profile of the first R = 3 trial at 64 in flight (all three members: one process) here")
)

// replTune adjusts the engines' configuration (the smoke test shortens
// raft's timers); nil keeps the defaults.
var replTune func(*replication.Config)

// replicationReport compares a unit's commits replicated on three
// members (R = 3: three engines in this process over loopback mutual
// TLS, -replication-partitions partitions, fsync on) with the same commits on a plain bbolt
// file (R = 1, today's behaviour), A and B interleaved, at 1 and at 64
// commits in flight (64 in flight: 64 units, one writer each). A commit
// is one Sync().Update writing one 64-byte meta value. Then idle memory
// per unit with replication on: heap and goroutines after a forced GC,
// with -replication-idle-units units (one small replicated file each)
// against none.
//
// All three members share this machine's cores and disk, so R = 3 pays
// three members' work here; on separate machines it pays one round trip
// and the slowest of the quorum's fsyncs.
func replicationReport() error {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "syncmesh-bench-repl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	cl, err := newReplCluster(ctx, filepath.Join(root, "commits"))
	if err != nil {
		return err
	}
	defer cl.close()
	fmt.Printf("== replication: R = 3 (hashicorp/raft, 3 members in one process, %d partitions) vs R = 1 (plain bbolt), fsync on ==\n", *replParts)
	for _, inflight := range []int{1, 64} {
		n := *replCommits
		if inflight == 1 {
			n /= 5
		}
		var r1, r3, l1, l3 []float64
		for trial := range *replTrials {
			for _, arm := range []int{trial % 2, 1 - trial%2} {
				var rate, lat float64
				if arm == 0 {
					rate, lat, err = runPlain(ctx, filepath.Join(root, fmt.Sprintf("plain-%d-%d", inflight, trial)), inflight, n)
					r1, l1 = append(r1, rate), append(l1, lat)
				} else {
					// A leader change under load ends the trial's units on
					// that member (ErrNotLeader, also for an unknown
					// outcome): the trial runs again on fresh units.
					for attempt := 0; ; attempt++ {
						stop := startReplProfile(inflight)
						rate, lat, err = cl.run(ctx, fmt.Sprintf("t%d-%d-%d", inflight, trial, attempt), inflight, n)
						stop()
						if err == nil || !errors.Is(err, replication.ErrNotLeader) || attempt == 4 {
							break
						}
						fmt.Printf("  (trial %d at %d in flight run again: %v)\n", trial, inflight, err)
					}
					r3, l3 = append(r3, rate), append(l3, lat)
				}
				if err != nil {
					return err
				}
			}
		}
		ratio := median(r3) / median(r1)
		verdict := "MET"
		if ratio < 0.5 {
			verdict = "MISSED"
		}
		fmt.Printf("  %2d in flight: R=1 %s commits/s (median latency %s ms), R=3 %s commits/s (%s ms) — ratio %.2f (target ≥ 0.5: %s)\n",
			inflight, minMedMax(r1, "%.0f"), minMedMax(l1, "%.1f"), minMedMax(r3, "%.0f"), minMedMax(l3, "%.1f"), ratio, verdict)
	}
	// Idle memory on a fresh cluster: nothing of the runs above in it.
	cl.close()
	idle, err := newReplCluster(ctx, filepath.Join(root, "idle"))
	if err != nil {
		return err
	}
	defer idle.close()
	return idle.idle(ctx, *replUnits)
}

// startReplProfile profiles the first R = 3 trial at 64 in flight into
// -replication-cpuprofile (all three members: this one process); the
// returned func stops it.
func startReplProfile(inflight int) func() {
	if *replProfile == "" || inflight != 64 {
		return func() {}
	}
	path := *replProfile
	*replProfile = "" // one trial only
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "replication: cpu profile: %v\n", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// commitLoop runs n commits, inflight at a time, each on its unit's DB;
// it returns commits/s and the median latency in ms.
func commitLoop(ctx context.Context, dbs []*bolt.DB, n int) (float64, float64, error) {
	per := n / len(dbs)
	lat := make([][]float64, len(dbs))
	errs := make([]error, len(dbs))
	val := make([]byte, 64)
	var wg sync.WaitGroup
	start := time.Now()
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range per {
				t0 := time.Now()
				err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta(fmt.Sprint("k", j), val) })
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], float64(time.Since(t0).Microseconds())/1000)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var all []float64
	for i := range dbs {
		if errs[i] != nil {
			return 0, 0, errs[i]
		}
		all = append(all, lat[i]...)
	}
	return float64(per*len(dbs)) / el.Seconds(), median(all), nil
}

func runPlain(ctx context.Context, dir string, inflight, n int) (float64, float64, error) {
	var dbs []*bolt.DB
	defer func() {
		for _, d := range dbs {
			_ = d.Close()
		}
	}()
	for i := range inflight {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprint(i)), 0o700); err != nil {
			return 0, 0, err
		}
		d, err := bolt.Open(filepath.Join(dir, fmt.Sprint(i), "node.db"), bolt.Options{})
		if err != nil {
			return 0, 0, err
		}
		dbs = append(dbs, d)
	}
	return commitLoop(ctx, dbs, n)
}

type replCluster struct {
	engines []*replication.Engine
}

func newReplCluster(ctx context.Context, root string) (*replCluster, error) {
	ca, err := meshtls.NewCA("bench", time.Hour)
	if err != nil {
		return nil, err
	}
	cl := &replCluster{}
	var peers []replication.Peer
	for _, name := range []string{"m1", "m2", "m3"} {
		nc, err := ca.Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			return nil, err
		}
		cfg := replication.Config{
			Member: name, Dir: filepath.Join(root, name, "raft"), UnitsDir: filepath.Join(root, name, "units"),
			Partitions: *replParts, Listen: "127.0.0.1:0", TLS: meshtls.ServerConfig(nc.TLSCertificate(), ca.Pool()), ClientTLS: clientTLS(nc, ca),
		}
		if replTune != nil {
			replTune(&cfg)
		}
		e, err := replication.Open(ctx, cfg)
		if err != nil {
			cl.close()
			return nil, err
		}
		cl.engines = append(cl.engines, e)
		peers = append(peers, replication.Peer{Member: name, Addr: e.Addr()})
	}
	for _, e := range cl.engines {
		if err := e.SetMembers(ctx, peers, 3); err != nil {
			cl.close()
			return nil, err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for p := range *replParts {
		for cl.leaderOf(p) == nil {
			if time.Now().After(deadline) {
				cl.close()
				return nil, fmt.Errorf("replication: no leader of partition %d after a minute", p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return cl, nil
}

func clientTLS(nc *meshtls.NodeCert, ca *meshtls.CA) *tls.Config {
	return meshtls.ClientConfig(nc.TLSCertificate(), ca.Pool())
}

func (cl *replCluster) leaderOf(p int) *replication.Engine {
	for _, e := range cl.engines {
		if e.IsLeader(p) {
			return e
		}
	}
	return nil
}

// awaitLeader waits up to a minute for a leader of p: after a leader
// change under load (a trial run again) the election may still be on.
func (cl *replCluster) awaitLeader(ctx context.Context, p int) (*replication.Engine, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		if l := cl.leaderOf(p); l != nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no leader of partition %d after a minute", p)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (cl *replCluster) close() {
	for _, e := range cl.engines {
		_ = e.Close()
	}
}

// run opens inflight units on their partitions' leaders and runs n
// commits over them.
func (cl *replCluster) run(ctx context.Context, prefix string, inflight, n int) (float64, float64, error) {
	var dbs []*bolt.DB
	var detach []func()
	defer func() {
		for i, d := range dbs {
			detach[i]()
			_ = d.Close()
		}
	}()
	for i := range inflight {
		unit := fmt.Sprintf("%s/u%d", prefix, i)
		l, err := cl.awaitLeader(ctx, cl.engines[0].PartitionOf(unit))
		if err != nil {
			return 0, 0, fmt.Errorf("replication: %s: %w", unit, err)
		}
		d, det, err := l.OpenUnit(unit, bolt.Options{})
		if err != nil {
			return 0, 0, err
		}
		dbs, detach = append(dbs, d), append(detach, det)
	}
	return commitLoop(ctx, dbs, n)
}

// idle measures heap and goroutines per idle replicated unit.
func (cl *replCluster) idle(ctx context.Context, units int) error {
	heap := func() (uint64, int) {
		goruntime.GC()
		goruntime.GC()
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		return ms.HeapInuse, goruntime.NumGoroutine()
	}
	h0, g0 := heap()
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range units {
		unit := fmt.Sprintf("idle/u%d", i)
		l, err := cl.awaitLeader(ctx, cl.engines[0].PartitionOf(unit))
		if err != nil {
			return fmt.Errorf("replication: %s: %w", unit, err)
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := l.WriteFile(ctx, unit, "storage.key", make([]byte, 32))
			// A leader change under load: write again on the new leader
			// (the write is idempotent: the whole file).
			for attempt := 0; errors.Is(err, replication.ErrNotLeader) && attempt < 5; attempt++ {
				var nl *replication.Engine
				if nl, err = cl.awaitLeader(ctx, cl.engines[0].PartitionOf(unit)); err == nil {
					err = nl.WriteFile(ctx, unit, "storage.key", make([]byte, 32))
				}
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	// Followers apply asynchronously: wait until every member knows all.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done := true
		for _, e := range cl.engines {
			if e.Stats().Units < units {
				done = false
			}
		}
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	h1, g1 := heap()
	var counts []int
	for _, e := range cl.engines {
		counts = append(counts, e.Stats().Units)
	}
	sort.Ints(counts)
	fmt.Printf("  idle: %d units in %d partitions on 3 members (replicas %v): heap %.0f B per unit per member, goroutines %+d (independent of units)\n",
		units, *replParts, counts, float64(h1-min(h0, h1))/float64(units)/3, g1-g0)
	return nil
}
