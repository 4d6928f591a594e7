package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/crypto/sign"
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

	var extraOf [][]byte // the d = 1 000 events, held by both nodes at the end
	var d1000 float64    // the d = 1 000 session's CPU, ms
	next := 0            // index of the next extra event (epoch 1: new events of the same rows)
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
		extraOf = extra
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
		if d == 1000 {
			d1000 = float64(t.cpu.Microseconds()) / 1000
		}
		again, err := run()
		if err != nil {
			return err
		}
		if again.rep.Missing != 0 || again.rep.Fetched != 0 {
			return fmt.Errorf("after d = %d: a second reconciliation found %d", d, again.rep.Missing)
		}
	}
	fmt.Printf("   (d = 0 CPU target: ≤ 100 ms per side; the CPU column is both sides in this process, median: an upper bound on each side)\n")
	return hostileReconcile(ctx, a, net, extraOf, p.Trials, d1000)
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

// hostileReconcile measures what a hostile peer costs (node b, answering;
// node a, asking), interleaved with the honest figure it is compared to:
//
//   - one hostile range request (a new bound and a fingerprint that never
//     agrees, 46 bytes) against b, beside an honest d = 0 session; served
//     while the peer has budget (a new peer name per trial), and refused
//     past it; in version 3 (fingerprints from range sums) and, for
//     comparison, version 2 (SHA-256 passes over the keys);
//   - a session of a against a hostile responder answering every round
//     with fingerprints that never agree, beside an honest d = 0 session;
//   - bytes out per byte in when a peer fetches the same known keys again
//     and again, until its byte budget refuses it.
func hostileReconcile(ctx context.Context, a *runtime.Node, net *runtime.Network, known [][]byte, trials int, d1000 float64) error {
	fmt.Printf("\n== reconciliation under a hostile peer (CPU: this process, both nodes; min/median/max over %d interleaved trials)\n", max(trials, 1))
	group := messages.ReconcileGroup{Schema: "bench", Table: "t"}
	rng := mrand.New(mrand.NewPCG(7, 11))
	sumRanges := true
	hostileReq := func(bound uint64) []byte {
		var fp [messages.FingerprintSize]byte
		for i := range fp {
			fp[i] = byte(rng.Uint32())
		}
		g := group
		g.Bound, g.Ranges = messages.HLC(bound), []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: fp}}
		b, _ := messages.EncodeReconcile(&messages.Reconcile{SumRanges: sumRanges, Groups: []messages.ReconcileGroup{g}})
		return b
	}
	const perTrial = 20
	honest := func(k int) (float64, error) {
		cpu0 := reconCPU()
		for range k {
			if _, err := a.Reconcile(ctx, "b"); err != nil {
				return 0, err
			}
		}
		return float64((reconCPU() - cpu0).Microseconds()) / 1000 / float64(k), nil
	}
	var served, servedV2, refused, honestMS []float64
	var refusedOf []int // of zeroBatch requests past the budget, how many were refused
	reqBytes := 0
	for trial := range max(trials, 1) {
		// Version 2 first (a peer of its own: its budget is its own).
		callV2, err := runtime.ReconcileRequester(net.Transport(fmt.Sprintf("v%d", trial)), fmt.Sprintf("v%d", trial), "b")
		if err != nil {
			return err
		}
		sumRanges = false
		cpu0 := reconCPU()
		const perTrialV2 = 3
		for i := range perTrialV2 {
			if _, err := callV2(ctx, runtime.ReconcileRangeRequest, hostileReq(uint64(trial*perTrial+i+1))); err != nil {
				return fmt.Errorf("hostile version-2 request %d served: %w", i, err)
			}
		}
		servedV2 = append(servedV2, float64((reconCPU()-cpu0).Microseconds())/1000/perTrialV2)
		sumRanges = true
		call, err := runtime.ReconcileRequester(net.Transport(fmt.Sprintf("m%d", trial)), fmt.Sprintf("m%d", trial), "b")
		if err != nil {
			return err
		}
		cpu0 = reconCPU()
		for i := range perTrial {
			req := hostileReq(uint64(trial*perTrial + i + 1))
			reqBytes = len(req)
			if _, err := call(ctx, runtime.ReconcileRangeRequest, req); err != nil {
				return fmt.Errorf("hostile request %d served: %w", i, err)
			}
		}
		served = append(served, float64((reconCPU()-cpu0).Microseconds())/1000/perTrial)
		// Spend the rest of the budget, then measure refused requests.
		for i := 0; ; i++ {
			_, err := call(ctx, runtime.ReconcileRangeRequest, hostileReq(uint64(1000+i)))
			if errors.Is(err, runtime.ErrReconcileLimited) {
				break
			}
			if err != nil || i > 1000000 {
				return fmt.Errorf("spending the budget: %v after %d requests", err, i)
			}
		}
		// The budget refills over a minute: a request may be served again
		// once enough has refilled; only the refused ones are measured.
		var refusedCPU time.Duration
		nRefused := 0
		for i := range zeroBatch {
			cpu0 = reconCPU()
			_, err := call(ctx, runtime.ReconcileRangeRequest, hostileReq(uint64(20000+i)))
			switch {
			case errors.Is(err, runtime.ErrReconcileLimited):
				refusedCPU += reconCPU() - cpu0
				nRefused++
			case err != nil:
				return fmt.Errorf("past the budget: %v", err)
			}
		}
		if nRefused == 0 {
			return fmt.Errorf("past the budget: none of %d requests refused", zeroBatch)
		}
		refused = append(refused, float64(refusedCPU.Microseconds())/1000/float64(nRefused))
		refusedOf = append(refusedOf, nRefused)
		ms, err := honest(zeroBatch)
		if err != nil {
			return err
		}
		honestMS = append(honestMS, ms)
	}
	mmm := func(v []float64) string {
		v = slices.Clone(v)
		slices.Sort(v)
		return fmt.Sprintf("%.3f/%.3f/%.3f", v[0], v[len(v)/2], v[len(v)-1])
	}
	fmt.Printf("   one hostile range request (%d bytes, new bound), served:  %s ms CPU (target ≤ 1 ms at n = 1 000 000)\n", reqBytes, mmm(served))
	fmt.Printf("   the same in version 2 (SHA-256 passes), served:            %s ms CPU\n", mmm(servedV2))
	fmt.Printf("   the same past the peer's work budget (refused):          %s ms CPU (refused %v of %d per trial; the rest served as the budget refilled)\n", mmm(refused), refusedOf, zeroBatch)
	fmt.Printf("   an honest d = 0 session (both sides):                      %s ms CPU\n", mmm(honestMS))

	// A hostile responder: every round, a fingerprint that never agrees.
	hostileResponder := runtime.InterceptReconcile(net.Transport("a"), func(ctx context.Context, kind byte, body []byte, next runtime.ReconcileCall) ([]byte, error) {
		if kind != runtime.ReconcileRangeRequest {
			return next(ctx, kind, body)
		}
		in, err := messages.DecodeReconcile(body)
		if err != nil {
			return nil, err
		}
		out := &messages.Reconcile{SumRanges: in.SumRanges}
		for _, g := range in.Groups {
			var fp [messages.FingerprintSize]byte
			for i := range fp {
				fp[i] = byte(rng.Uint32())
			}
			out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: g.Bound,
				Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: fp}}})
		}
		return messages.EncodeReconcile(out)
	})
	if err := a.AddPeer("hostile", hostileResponder, ""); err != nil {
		return err
	}
	var hostileMS, honest2 []float64
	rounds, bytesIn := 0, 0
	for range max(trials, 1) {
		cpu0 := reconCPU()
		rep, err := a.Reconcile(ctx, "hostile")
		if !errors.Is(err, runtime.ErrReconcilePeer) {
			return fmt.Errorf("hostile responder: %v, want the peer's error", err)
		}
		hostileMS = append(hostileMS, float64((reconCPU()-cpu0).Microseconds())/1000)
		rounds, bytesIn = rep.Rounds, rep.BytesReceived
		ms, err := honest(1)
		if err != nil {
			return err
		}
		honest2 = append(honest2, ms)
	}
	fmt.Printf("   session against a hostile responder (random fingerprints): %s ms CPU, %d rounds, %d bytes received (cut at its work budget or its rounds)\n", mmm(hostileMS), rounds, bytesIn)
	fmt.Printf("   an honest d = 0 session, interleaved:                       %s ms CPU\n", mmm(honest2))
	if d1000 > 0 {
		med := slices.Clone(hostileMS)
		slices.Sort(med)
		fmt.Printf("   hostile responder's session / honest d = 1 000 session:     %.2f× (target ≤ 2×)\n", med[len(med)/2]/d1000)
	}

	// Fetching the same known keys again and again.
	keys := make([]messages.ReconcileKey, 0, len(known))
	for _, raw := range known {
		ev, err := sign.ParseVerified(raw)
		if err != nil {
			return err
		}
		keys = append(keys, messages.NewReconcileKey(ev.Site, ev.HLC, eventid.Of(raw)))
	}
	slices.SortFunc(keys, func(x, y messages.ReconcileKey) int { return bytes.Compare(x[:], y[:]) })
	keys = slices.Compact(keys)
	body, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: "bench", Table: "t", Keys: keys}}})
	if err != nil {
		return err
	}
	call, err := runtime.ReconcileRequester(net.Transport("f"), "f", "b")
	if err != nil {
		return err
	}
	in, out, served2 := 0, 0, 0
	t0 := time.Now()
	// Capped at a minute: on a loaded machine fetches can come no faster
	// than the budget refills (4 MiB/s), and are then all served.
	for served2 < 100000 && time.Since(t0) < time.Minute {
		raw, err := call(ctx, runtime.ReconcileFetchRequest, body)
		in += len(body)
		if errors.Is(err, runtime.ErrReconcileLimited) {
			break
		}
		if err != nil {
			return err
		}
		out += len(raw)
		served2++
	}
	el := time.Since(t0)
	fmt.Printf("   refetching the same %d known keys: %d fetches served in %v, %d bytes out for %d in (%.1f× per fetch served; %.1f MiB/s out), then refused or stopped at a minute (budget: %d MiB at once, %d MiB/s after)\n",
		len(keys), served2, el.Round(time.Millisecond), out, in, float64(out)/float64(max(in, 1)), float64(out)/(1<<20)/el.Seconds(), 64, 4)
	return nil
}
