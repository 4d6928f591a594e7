package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	catchupProfile = flag.String("catchup-cpuprofile", "", "catch-up: write CPU profiles into this directory: the source (this process, source.pprof, over the interleaved trials) and every child (catchup-joiner-<pid>.pprof, apply-fresh-<pid>.pprof)")
	catchupMany    = flag.Bool("catchup-many", true, "catch-up: also measure joining from 3 peers at once")
	catchupWindow  = flag.Int("catchup-push-window", 0, "catch-up: the sources' pushes in flight (runtime.Config.PushWindow; 0: the node's default)")
)

// countingProxy forwards TCP connections to target and counts the bytes
// going each way: what the wire carries, framing and all.
type countingProxy struct {
	ln         net.Listener
	target     string
	toTarget   atomic.Uint64
	fromTarget atomic.Uint64
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      []net.Conn
	closed     atomic.Bool
}

func newCountingProxy(target string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countingProxy) Addr() string { return p.ln.Addr().String() }

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, t)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(t, c, &p.toTarget)
		go p.pipe(c, t, &p.fromTarget)
	}
}

func (p *countingProxy) pipe(dst, src net.Conn, n *atomic.Uint64) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(uint64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *countingProxy) Close() {
	p.closed.Store(true)
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func openBenchNode(ctx context.Context, dir, name string, peers []*peer, interval time.Duration, batch int) (*runtime.Node, error) {
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh, Name: name, SyncInterval: interval, PushBatch: batch, PushWindow: *catchupWindow})
	if err != nil {
		return nil, err
	}
	if err := n.DefineTable(ctx, benchTable); err != nil {
		n.Close()
		return nil, err
	}
	for _, p := range peers {
		if err := n.Trust(ctx, p.signer.Key()); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

type catchupParams struct {
	Sizes                                    []int
	Sites, Writers, Batch, PushBatch, Trials int
}

// joinerArgs configure the joining node's child process.
type joinerArgs struct {
	Dir, Name, Advertise, Ready string
	Port, Sites, Events         int
	PushBatch                   int
	// Sources are the senders it accepts (default: "source").
	Sources []string
}

// freshArgs configure a child applying an event file to a fresh store.
type freshArgs struct {
	Dir, File             string
	Sites, Writers, Batch int
}

// storeRun is what a child reports: the time its store took to reach the
// events, the bytes it wrote to storage (/proc/self/io write_bytes: page
// cache writeback of its bbolt file, not its sockets) and its peak heap;
// a joiner also its committed sync-plane transactions (bolt DB.Commits)
// and the pushes its remote received while catching up.
type storeRun struct {
	Seconds         float64
	WriteBytes      int64
	PeakHeap        uint64
	Commits, Pushes uint64
	// CPUSeconds is the child's user + system CPU over the measured run.
	CPUSeconds float64
	// GCSeconds is the runtime's estimate of the CPU its garbage
	// collector took over the run (runtime/metrics, mark and assists and
	// pauses), GCCycles the collections completed.
	GCSeconds float64
	// GCIdleSeconds is the part of GCSeconds the collector's idle-priority
	// mark workers took: CPU of this process's idle Ps, which on a shared
	// machine another process (the source) could have used.
	GCIdleSeconds float64
	GCCycles      uint64
	// AllocBytes is what the child allocated on its heap over the run
	// (runtime/metrics): what the collector has to keep up with, and
	// unlike CPU not moved by the machine's load.
	AllocBytes uint64
}

// gcSample reads the garbage collector's CPU estimate (and its idle
// mark workers' share), its cycle count and the bytes allocated so far.
func gcSample() (cpu, idle float64, cycles, alloc uint64) {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"},
		{Name: "/cpu/classes/gc/mark/idle:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindFloat64 {
		cpu = s[0].Value.Float64()
	}
	if s[3].Value.Kind() == metrics.KindFloat64 {
		idle = s[3].Value.Float64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		cycles = s[1].Value.Uint64()
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		alloc = s[2].Value.Uint64()
	}
	return cpu, idle, cycles, alloc
}

func init() {
	ab.Register("catchup-joiner", runJoiner)
	ab.Register("apply-fresh", runApplyFresh)
}

// runJoiner is the joining node: it serves the remote, says it is ready,
// and measures until its log holds every event.
func runJoiner(arg json.RawMessage) (any, error) {
	var a joinerArgs
	if err := json.Unmarshal(arg, &a); err != nil {
		return nil, err
	}
	ctx := context.Background()
	n, err := openBenchNode(ctx, a.Dir, a.Name, benchPeers(a.Sites), 20*time.Millisecond, a.PushBatch)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	rem, err := runtime.StartRemote(n.System(), runtime.RemoteConfig{Port: a.Port, AdvertisedAddress: a.Advertise, Plaintext: true})
	if err != nil {
		return nil, err
	}
	defer rem.Close()
	rem.Serve(n)
	if len(a.Sources) == 0 {
		a.Sources = []string{"source"}
	}
	for _, src := range a.Sources {
		if err := n.AcceptPeer(src); err != nil { // only configured senders are accepted
			return nil, err
		}
	}
	goruntime.GC()
	io0, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	hp := ab.StartHeapPeak(5 * time.Millisecond)
	commits0, pushes0 := n.StoreCommits().Sync, rem.Stats().PushesReceived
	if err := os.WriteFile(a.Ready, nil, 0o600); err != nil {
		return nil, err
	}
	start, cpu0 := time.Now(), reconCPU()
	gc0, idle0, cyc0, al0 := gcSample()
	for {
		got, err := n.LastSeq(ctx)
		if err != nil {
			return nil, err
		}
		if got >= uint64(a.Events) {
			break
		}
		if time.Since(start) > 30*time.Minute {
			return nil, fmt.Errorf("catch-up stalled at %d of %d events", got, a.Events)
		}
		time.Sleep(2 * time.Millisecond)
	}
	el, cpu := time.Since(start), reconCPU()-cpu0
	gc1, idle1, cyc1, al1 := gcSample()
	peak := hp.Stop()
	// Every push counted here was answered after its commit: read the
	// pushes first, so a push committed after this read is not counted
	// without its commit.
	pushes := rem.Stats().PushesReceived - pushes0
	commits := n.StoreCommits().Sync - commits0
	io1, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	return storeRun{Seconds: el.Seconds(), WriteBytes: io1.WriteBytes - io0.WriteBytes, PeakHeap: peak, Commits: commits, Pushes: pushes,
		CPUSeconds: cpu.Seconds(), GCSeconds: gc1 - gc0, GCIdleSeconds: idle1 - idle0, GCCycles: cyc1 - cyc0, AllocBytes: al1 - al0}, nil
}

// runApplyFresh applies an event file to a fresh store: the single-node
// rate catch-up is compared with, measured the same way.
func runApplyFresh(arg json.RawMessage) (any, error) {
	var a freshArgs
	if err := json.Unmarshal(arg, &a); err != nil {
		return nil, err
	}
	raws, err := readEvents(a.File)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	n, err := openApplyNode(ctx, a.Dir, benchPeers(a.Sites))
	if err != nil {
		return nil, err
	}
	defer n.Close()
	goruntime.GC()
	io0, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	hp := ab.StartHeapPeak(5 * time.Millisecond)
	commits0 := n.StoreCommits().Sync
	start, cpu0 := time.Now(), reconCPU()
	gc0, idle0, cyc0, al0 := gcSample()
	if _, err := applyAll(ctx, n, raws, a.Writers, a.Batch); err != nil {
		hp.Stop()
		return nil, err
	}
	el, cpu := time.Since(start), reconCPU()-cpu0
	gc1, idle1, cyc1, al1 := gcSample()
	peak := hp.Stop()
	io1, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	return storeRun{Seconds: el.Seconds(), WriteBytes: io1.WriteBytes - io0.WriteBytes, PeakHeap: peak, CPUSeconds: cpu.Seconds(),
		Commits: n.StoreCommits().Sync - commits0, GCSeconds: gc1 - gc0, GCIdleSeconds: idle1 - idle0, GCCycles: cyc1 - cyc0, AllocBytes: al1 - al0}, nil
}

// catchupSource is one size's source node, serving its log over a remote.
type catchupSource struct {
	n      int
	node   *runtime.Node
	rem    *runtime.Remote
	file   string
	signed int
}

// catchupReport measures nodes joining from genesis over the protoactor
// remote transport: a source node (this process) holds the events; the
// joiner is a child process, so its bytes written (/proc/self/io) and
// heap are its own. Each trial interleaves, for every size, a catch-up
// and a single-node ApplySignedBatch of the same events into a fresh
// store (also a child); the wire bytes toward the joiner are counted by a
// TCP proxy in front of it.
func catchupReport(p catchupParams) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "syncmesh-catchup-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fmt.Printf("== sync plane: a node joining from genesis catches up from one peer over protoactor remote (gRPC, loopback, plaintext), bbolt fsync on, pushes of %d; sizes %v, %d interleaved trials, figures median (min max)\n", p.PushBatch, p.Sizes, p.Trials)
	var srcs []*catchupSource
	defer func() {
		for _, s := range srcs {
			s.rem.Close()
			s.node.Close()
		}
	}()
	for _, size := range p.Sizes {
		peers, raws, err := makeEvents(size, p.Sites)
		if err != nil {
			return err
		}
		s := &catchupSource{n: size, file: eventFile(work, fmt.Sprintf("catchup-%d", size))}
		for _, r := range raws {
			s.signed += len(r)
		}
		if err := writeEvents(s.file, raws); err != nil {
			return err
		}
		if s.node, err = openBenchNode(ctx, filepath.Join(work, fmt.Sprintf("source-%d", size)), "source", peers, 20*time.Millisecond, p.PushBatch); err != nil {
			return err
		}
		srcs = append(srcs, s)
		if _, err := applyAll(ctx, s.node, raws, p.Writers, p.Batch); err != nil {
			return err
		}
		if s.rem, err = runtime.StartRemote(s.node.System(), runtime.RemoteConfig{Plaintext: true}); err != nil {
			return err
		}
		s.rem.Serve(s.node)
	}
	type extra struct {
		bytesPerEvent, heap, wire, commitsPerPush, cpuUS, srcCPUUS []float64
		gcUS, gcIdleUS, gcCycles, eventsPerCommit, allocB          []float64
	}
	joinX := map[int]*extra{}
	freshX := map[int]*extra{}
	var arms []ab.Arm
	for _, s := range srcs {
		s := s
		joinX[s.n], freshX[s.n] = &extra{}, &extra{}
		arms = append(arms,
			ab.Arm{Name: fmt.Sprintf("catchup-%d", s.n), Run: func(t int) (float64, error) {
				cpu0 := reconCPU()
				r, wire, err := catchupOnce(ctx, work, s, p, t)
				if err != nil {
					return 0, err
				}
				x := joinX[s.n]
				x.cpuUS = append(x.cpuUS, r.CPUSeconds*1e6/float64(s.n))
				x.gcUS = append(x.gcUS, r.GCSeconds*1e6/float64(s.n))
				x.gcIdleUS = append(x.gcIdleUS, r.GCIdleSeconds*1e6/float64(s.n))
				x.gcCycles = append(x.gcCycles, float64(r.GCCycles))
				x.allocB = append(x.allocB, float64(r.AllocBytes)/float64(s.n))
				x.srcCPUUS = append(x.srcCPUUS, (reconCPU()-cpu0).Seconds()*1e6/float64(s.n))
				x.bytesPerEvent = append(x.bytesPerEvent, float64(r.WriteBytes)/float64(s.n))
				x.heap = append(x.heap, float64(r.PeakHeap)/(1<<20))
				x.wire = append(x.wire, wire/(float64(s.signed)/float64(s.n)))
				if r.Pushes > 0 {
					x.commitsPerPush = append(x.commitsPerPush, float64(r.Commits)/float64(r.Pushes))
				}
				if r.Commits > 0 {
					x.eventsPerCommit = append(x.eventsPerCommit, float64(s.n)/float64(r.Commits))
				}
				return float64(s.n) / r.Seconds, nil
			}},
			ab.Arm{Name: fmt.Sprintf("single-%d", s.n), Run: func(t int) (float64, error) {
				var r storeRun
				dir := filepath.Join(work, fmt.Sprintf("fresh-%d-%d", s.n, t))
				defer os.RemoveAll(dir)
				if err := ab.Child(ctx, ab.Proc{}, "apply-fresh", freshArgs{Dir: dir, File: s.file, Sites: p.Sites, Writers: p.Writers, Batch: p.Batch}, &r); err != nil {
					return 0, err
				}
				x := freshX[s.n]
				x.cpuUS = append(x.cpuUS, r.CPUSeconds*1e6/float64(s.n))
				x.gcUS = append(x.gcUS, r.GCSeconds*1e6/float64(s.n))
				x.gcIdleUS = append(x.gcIdleUS, r.GCIdleSeconds*1e6/float64(s.n))
				x.gcCycles = append(x.gcCycles, float64(r.GCCycles))
				x.allocB = append(x.allocB, float64(r.AllocBytes)/float64(s.n))
				x.bytesPerEvent = append(x.bytesPerEvent, float64(r.WriteBytes)/float64(s.n))
				x.heap = append(x.heap, float64(r.PeakHeap)/(1<<20))
				if r.Commits > 0 {
					x.eventsPerCommit = append(x.eventsPerCommit, float64(s.n)/float64(r.Commits))
				}
				return float64(s.n) / r.Seconds, nil
			}},
		)
	}
	stopProfile := func() {}
	if dir := *catchupProfile; dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// The children inherit the variable: each profiles its own run.
		if err := os.Setenv(ab.EnvProfileDir, dir); err != nil {
			return err
		}
		if stopProfile, err = startProfile(filepath.Join(dir, "source.pprof")); err != nil {
			return err
		}
	}
	res, err := ab.Run(p.Trials, arms...)
	stopProfile()
	os.Unsetenv(ab.EnvProfileDir)
	if err != nil {
		return err
	}
	ref := srcs[0].n
	for _, s := range srcs {
		c, f := fmt.Sprintf("catchup-%d", s.n), fmt.Sprintf("single-%d", s.n)
		ratio := res.Ratio(c, f)
		j, fr := joinX[s.n], freshX[s.n]
		rows := [][2]string{
			{"single-node ApplySignedBatch (child, fresh store)", res.Stats(f).Format("%.0f") + " ev/s"},
			{"catch-up (joiner child)", res.Stats(c).Format("%.0f") + " ev/s"},
			{"catch-up / single", ratio.String() + "   " + ratio.Verdict(0.9, true)},
			{"joiner bytes written per event", ab.Summarize(j.bytesPerEvent).Format("%.0f") + " B"},
			{"single-node bytes written per event", ab.Summarize(fr.bytesPerEvent).Format("%.0f") + " B"},
			{"joiner peak heap (live objects)", ab.Summarize(j.heap).Format("%.1f") + " MiB"},
			{"wire bytes toward the joiner / signed event bytes", ab.Summarize(j.wire).Format("%.3f") + "   " + ab.Summarize(j.wire).Verdict(1.1, false)},
			{"read-write store commits per received push (joiner, bolt DB.Commits)", ab.Summarize(j.commitsPerPush).Format("%.3f") + "   " + ab.Summarize(j.commitsPerPush).Verdict(1, false)},
			{"events per read-write store commit: single-node child", ab.Summarize(fr.eventsPerCommit).Format("%.0f")},
			{"events per read-write store commit: joiner child", ab.Summarize(j.eventsPerCommit).Format("%.0f")},
			{"CPU per event: single-node child", ab.Summarize(fr.cpuUS).Format("%.1f") + " us"},
			{"CPU per event: joiner child", ab.Summarize(j.cpuUS).Format("%.1f") + " us"},
			{"CPU per event: source process (source node, proxy)", ab.Summarize(j.srcCPUUS).Format("%.1f") + " us"},
			{"GC CPU per event (runtime estimate): single-node child", ab.Summarize(fr.gcUS).Format("%.1f") + " us"},
			{"GC CPU per event (runtime estimate): joiner child", ab.Summarize(j.gcUS).Format("%.1f") + " us"},
			{"  of which idle mark workers: single-node child", ab.Summarize(fr.gcIdleUS).Format("%.1f") + " us"},
			{"  of which idle mark workers: joiner child", ab.Summarize(j.gcIdleUS).Format("%.1f") + " us"},
			{"heap bytes allocated per event: single-node child", ab.Summarize(fr.allocB).Format("%.0f") + " B"},
			{"heap bytes allocated per event: joiner child", ab.Summarize(j.allocB).Format("%.0f") + " B"},
			{"GC cycles: single-node child", ab.Summarize(fr.gcCycles).Format("%.0f")},
			{"GC cycles: joiner child", ab.Summarize(j.gcCycles).Format("%.0f")},
			// Both processes share the cores the single-node child has to
			// itself: on a busy (CPU-bound) machine this is the rate ratio.
			{"CPU per event, single-node / (joiner + source)", ab.Paired(fr.cpuUS, sumOf(j.cpuUS, j.srcCPUUS)).String()},
		}
		if s.n != ref {
			jr := joinX[ref]
			bg := ab.Paired(j.bytesPerEvent, jr.bytesPerEvent)
			hg := ab.Paired(j.heap, jr.heap)
			rows = append(rows,
				[2]string{fmt.Sprintf("joiner bytes/event at %d / at %d", s.n, ref), bg.String() + "   " + bg.Verdict(1.5, false)},
				[2]string{fmt.Sprintf("joiner peak heap at %d / at %d", s.n, ref), hg.String() + "   " + hg.Verdict(1.5, false)},
			)
		}
		fmt.Printf("%d events (signed event %.1f B):\n", s.n, float64(s.signed)/float64(s.n))
		fmt.Print(ab.Table(rows))
	}
	if !*catchupMany {
		return nil
	}
	return joinManyReport(ctx, work, srcs[0], p)
}

// joinManyReport measures a node joining from three peers at once, all
// holding the same history in the same log order, against joining from
// one of them, interleaved: the wire bytes toward the joiner per event
// beside the mean signed event size (target ≤ 1.2: each event about once;
// the senders probe, the joiner leases each origin site to one of them).
// The three sources relay: no claim of the events' origins reaches the
// joiner, so watermarks cannot help.
func joinManyReport(ctx context.Context, work string, one *catchupSource, p catchupParams) error {
	_, raws, err := makeEvents(one.n, p.Sites)
	if err != nil {
		return err
	}
	var srcs []*catchupSource
	defer func() {
		for _, s := range srcs {
			s.node.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("source-%d", i+1)
		n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(work, "many-"+name), MeshID: mesh, Name: name,
			SyncInterval: 20 * time.Millisecond, PushBatch: p.PushBatch, ReconcileInterval: -1})
		if err != nil {
			return err
		}
		s := &catchupSource{n: one.n, node: n, file: one.file, signed: one.signed}
		srcs = append(srcs, s)
		if err := n.DefineTable(ctx, benchTable); err != nil {
			return err
		}
		for _, pr := range benchPeers(p.Sites) {
			if err := n.Trust(ctx, pr.signer.Key()); err != nil {
				return err
			}
		}
		// One writer: every source's log holds the events in one order.
		if _, err := applyAll(ctx, n, raws, 1, p.Batch); err != nil {
			return err
		}
		// The sources only push: they share the first size's remote as
		// their transport (a second remote in one process races on
		// gRPC's global logger).
		s.rem = one.rem
	}
	fmt.Printf("== sync plane: a node joining from 3 peers at once (same history, same order, relays only) vs from 1, over protoactor remote, pushes of %d; %d events, %d interleaved trials, min / median / max\n", p.PushBatch, one.n, p.Trials)
	wire := map[int][]float64{}
	rate := map[int][]float64{}
	arm := func(k int) ab.Arm {
		return ab.Arm{Name: fmt.Sprintf("join-%d", k), Run: func(t int) (float64, error) {
			r, w, err := joinManyOnce(ctx, work, srcs[:k], p, t)
			if err != nil {
				return 0, err
			}
			wire[k] = append(wire[k], w/(float64(one.signed)/float64(one.n)))
			rate[k] = append(rate[k], float64(one.n)/r.Seconds)
			return float64(one.n) / r.Seconds, nil
		}}
	}
	if _, err := ab.Run(p.Trials, arm(1), arm(3)); err != nil {
		return err
	}
	w3 := ab.Summarize(wire[3])
	fmt.Printf("%d events (signed event %.1f B):\n", one.n, float64(one.signed)/float64(one.n))
	fmt.Print(ab.Table([][2]string{
		{"wire bytes toward the joiner per event / signed event size, from 1 peer", ab.Summarize(wire[1]).Format("%.3f")},
		{"wire bytes toward the joiner per event / signed event size, from 3 peers at once", w3.Format("%.3f") + "   " + w3.Verdict(1.2, false)},
		{"wire bytes from 3 peers / from 1 (paired)", ab.Paired(wire[3], wire[1]).Format("%.3f")},
		{"catch-up from 3 peers (joiner child)", ab.Summarize(rate[3]).Format("%.0f") + " ev/s"},
		{"catch-up from 1 peer (joiner child)", ab.Summarize(rate[1]).Format("%.0f") + " ev/s"},
	}))
	return nil
}

// joinManyOnce runs one joiner child catching up from every source of
// srcs at once and returns its report and the wire bytes per event
// toward it (every source's pushes and probes cross one counting proxy).
func joinManyOnce(ctx context.Context, work string, srcs []*catchupSource, p catchupParams, t int) (storeRun, float64, error) {
	var names []string
	for _, s := range srcs {
		names = append(names, s.node.Name())
	}
	return startJoiner(ctx, work, fmt.Sprintf("joiner-many-%d-%d", len(srcs), t), srcs, names, p)
}

// catchupOnce runs one joiner child against s's source and returns its
// report and the wire bytes per event toward it.
func catchupOnce(ctx context.Context, work string, s *catchupSource, p catchupParams, t int) (storeRun, float64, error) {
	return startJoiner(ctx, work, fmt.Sprintf("joiner-%d-%d", s.n, t), []*catchupSource{s}, nil, p)
}

// startJoiner starts a joiner child named name, waits until it is ready,
// makes every source of srcs push to it and returns the child's report
// and the wire bytes per event toward it. The joiner advertises a
// counting proxy: pushes to it cross the proxy; its answers go straight
// to the sources' own addresses. sources is the joiner's list of the
// senders it accepts (nil: its default, "source").
func startJoiner(ctx context.Context, work, name string, srcs []*catchupSource, sources []string, p catchupParams) (storeRun, float64, error) {
	dir := filepath.Join(work, name)
	defer os.RemoveAll(dir)
	port, err := freeTCPPort()
	if err != nil {
		return storeRun{}, 0, err
	}
	proxy, err := newCountingProxy(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return storeRun{}, 0, err
	}
	defer proxy.Close()
	ready := filepath.Join(work, name+".ready")
	var r storeRun
	done := make(chan error, 1)
	n := srcs[0].n
	go func() {
		done <- ab.Child(ctx, ab.Proc{}, "catchup-joiner", joinerArgs{Dir: dir, Name: name, Advertise: proxy.Addr(), Ready: ready, Port: port, Sites: p.Sites, Events: n, PushBatch: p.PushBatch, Sources: sources}, &r)
	}()
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-done:
			if err == nil {
				err = fmt.Errorf("joiner exited before it was ready")
			}
			return storeRun{}, 0, err
		case <-time.After(time.Millisecond):
		}
	}
	srcs[0].rem.AddPeer(name, proxy.Addr())
	for _, s := range srcs {
		if err := s.node.AddPeer(name, s.rem, "remote"); err != nil {
			return storeRun{}, 0, err
		}
	}
	err = <-done
	for _, s := range srcs {
		_ = s.node.RemovePeer(name, "remote")
	}
	if err != nil {
		return storeRun{}, 0, err
	}
	return r, float64(proxy.toTarget.Load()) / float64(n), nil
}

// sumOf adds a and b element by element.
func sumOf(a, b []float64) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for i := range out {
		out[i] = a[i] + b[i]
	}
	return out
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
