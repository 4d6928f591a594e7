package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/runtime"
)

// Flags of the hosting section (registered here so main.go only has to
// call hostingReport).
var (
	hostingBoltDevices = flag.Int("hosting-bolt-devices", 1000, "devices opened on bbolt files for the per-device cost with storage (0: skip)")
	hostingPeerDevices = flag.Int("hosting-peer-devices", 100, "devices of the same run's peer measurement (same per-pair pattern, in rounds to the same total)")
	hostingHeapProfile = flag.String("hosting-heapprofile", "", "write a heap profile of the idle in-memory devices here")
	hostingCPUProfile  = flag.String("hosting-cpuprofile", "", "write a CPU profile of the exchange among all hosted devices here")
)

// hostingReport prints the multi-tenant hosting costs: many device nodes
// in one process on ONE actor system, ONE Prometheus registry and one
// in-process runtime.Network.
//
//   - Memory per idle hosted device: heap in use, goroutine stacks and RSS
//     after a forced GC, divided by the device count, for fresh devices
//     (identity, signing key and prekeys created, no session) and again
//     once every device has one established session (one message each
//     way with its pair partner, committed and acknowledged). In-memory
//     stores for the large count; bbolt files for a smaller count.
//   - Throughput: devices in pairs, every device sending messages/devices
//     messages of 256 B to its partner at once (64 concurrent senders);
//     each delivery is committed by the receiver's Handler (the commit
//     sends the ACK back); the rate counts messages committed AND
//     acknowledged end to end, and every node's pending counts (received
//     and sent) are checked to be 0 after each run. The peer measured in
//     the same run: the same per-pair pattern among fewer devices
//     (-hosting-peer-devices), repeated in rounds to the same total, so
//     the ratio isolates the cost of hosting more devices.
func hostingReport(devices, messages int) error {
	if devices < 2 || devices%2 != 0 {
		return fmt.Errorf("hosting: %d devices: want an even number >= 2", devices)
	}
	if messages < devices {
		return fmt.Errorf("hosting: %d messages: want at least one per device (%d)", messages, devices)
	}
	perDevice := messages / devices
	messages = perDevice * devices
	ctx := context.Background()
	fmt.Printf("== hosting: %d device nodes on one actor system + one registry + one in-process Network (in-memory stores); %d messages of 256 B exchanged concurrently in pairs, each committed by the receiver's Handler and ACKed; GOMAXPROCS=%d\n",
		devices, messages, goruntime.GOMAXPROCS(0))

	// The peer first, on a clean heap: the same total among fewer devices.
	peerN := *hostingPeerDevices
	var peer exchangeResult
	var peerEst time.Duration
	if peerN >= 2 && peerN%2 == 0 && peerN < devices {
		h, err := openHost(ctx, peerN, "")
		if err != nil {
			return err
		}
		start := time.Now()
		err = h.establish(ctx)
		peerEst = time.Since(start)
		if err == nil {
			peer, err = h.exchange(ctx, messages/devices, devices/peerN)
		}
		h.close()
		if err != nil {
			return err
		}
	}

	base := sampleMem()
	start := time.Now()
	h, err := openHost(ctx, devices, "")
	if err != nil {
		return err
	}
	defer h.close()
	openTime := time.Since(start)
	fresh := sampleMem()
	if *hostingHeapProfile != "" {
		if err := writeHeapProfile(*hostingHeapProfile); err != nil {
			return err
		}
	}
	start = time.Now()
	if err := h.establish(ctx); err != nil {
		return err
	}
	estTime := time.Since(start)
	est := sampleMem()
	fmt.Printf("open          %d device nodes in %.1f s = %.0f /s (first open: site id + Ed25519 key, device identity, signed prekey + 100 one-time X25519 prekeys each)\n",
		devices, openTime.Seconds(), float64(devices)/openTime.Seconds())
	fmt.Printf("idle, fresh   %s\n", fresh.sub(base).perDevice(devices))
	fmt.Printf("1 session     %s\n", est.sub(base).perDevice(devices))
	fmt.Printf("  of which    the session: %s\n", est.sub(fresh).perDevice(devices))
	estRate := float64(devices) / estTime.Seconds()
	fmt.Printf("sessions      %d established (bundle fetch, X3DH, one message each way committed + ACKed) in %.1f s = %.0f /s",
		devices, estTime.Seconds(), estRate)
	if peerEst > 0 {
		pr := float64(peerN) / peerEst.Seconds()
		fmt.Printf("   at %d devices %.0f /s   ratio %.2f", peerN, pr, estRate/pr)
	}
	fmt.Println()

	if *hostingCPUProfile != "" {
		f, err := os.Create(*hostingCPUProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return err
		}
		defer f.Close()
	}
	r, err := h.exchange(ctx, messages/devices, 1)
	pprof.StopCPUProfile()
	if err != nil {
		return err
	}
	line := func(n int, r exchangeResult) {
		fmt.Printf("  %6d devices  %6d messages  %6.0f msg/s  (%8.3f msg/s per device; %.2f s; peak %d goroutines)\n",
			n, r.messages, r.rate(), r.rate()/float64(n), r.elapsed.Seconds(), r.maxGoroutines)
	}
	fmt.Printf("exchange      every device sends %d to its partner at once, each committed by the Handler + ACKed end to end; after each run 0 pending received and 0 pending sent on every node\n", perDevice)
	line(devices, r)
	if peer.messages > 0 {
		fmt.Printf("  peer: the same pattern (%d per device per round) among %d devices, %d rounds back to back:\n", perDevice, peerN, devices/peerN)
		line(peerN, peer)
		fmt.Printf("  ratio       rate(%d devices)/rate(%d devices) = %.2f   (1.00: hosting %dx the devices costs no aggregate throughput)\n",
			devices, peerN, r.rate()/peer.rate(), devices/peerN)
	}
	h.close()

	if nb := *hostingBoltDevices; nb >= 2 {
		if nb%2 != 0 {
			nb--
		}
		dir, err := os.MkdirTemp("", "syncmesh-hosting-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		base := sampleMem()
		start := time.Now()
		hb, err := openHost(ctx, nb, dir)
		if err != nil {
			return err
		}
		defer hb.close()
		openTime := time.Since(start)
		fresh := sampleMem()
		if err := hb.establish(ctx); err != nil {
			return err
		}
		est := sampleMem()
		app, alloc := dirSize(dir)
		fmt.Printf("bbolt         %d device nodes, one bbolt file each (NoSync: fsync changes time, not memory), opened in %.1f s; %.1f open fds per device\n",
			nb, openTime.Seconds(), float64(fresh.fds-base.fds)/float64(nb))
		fmt.Printf("  fresh       %s\n", fresh.sub(base).perDevice(nb))
		fmt.Printf("  1 session   %s\n", est.sub(base).perDevice(nb))
		fmt.Printf("  disk        %s allocated per device (node.db + storage.key; apparent size %s: bbolt preallocates sparsely)\n",
			bytesIEC(float64(alloc)/float64(nb)), bytesIEC(float64(app)/float64(nb)))
	}
	return nil
}

// host is many device nodes on one actor system, one registry and one
// in-process Network, devices 2k and 2k+1 being partners.
type host struct {
	sys       *actor.ActorSystem
	reg       *prometheus.Registry
	net       *runtime.Network
	nodes     []*runtime.Node
	committed atomic.Int64
	failed    atomic.Pointer[error]
	closeOnce sync.Once
}

func deviceAddr(i int) runtime.DeviceAddress {
	return runtime.DeviceAddress{User: fmt.Sprintf("u%05d", i), Device: 1}
}

func partner(i int) int { return i ^ 1 }

// openHost opens n device nodes in parallel (one worker per core): in
// memory when dir is empty, else one bbolt directory each under dir.
func openHost(ctx context.Context, n int, dir string) (*host, error) {
	logger := slog.New(slog.DiscardHandler)
	h := &host{
		sys:   actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger })),
		reg:   prometheus.NewRegistry(),
		net:   runtime.NewNetwork(1),
		nodes: make([]*runtime.Node, n),
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range goruntime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := h.open(ctx, i, dir); err != nil {
					select {
					case errs <- err:
					default:
					}
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		h.close()
		return nil, err
	default:
	}
	return h, nil
}

func (h *host) open(ctx context.Context, i int, dir string) error {
	name := fmt.Sprintf("d%05d", i)
	addr := deviceAddr(i)
	var self atomic.Pointer[runtime.Node]
	cfg := runtime.Config{
		InMemory: dir == "", MeshID: mesh, Name: name, SyncInterval: -1,
		System: h.sys, Registerer: h.reg,
		Device: &runtime.DeviceConfig{
			Address:   addr,
			Transport: h.net.DeviceTransport(name, addr),
			// The application's commit: here nothing to apply, so commit
			// at once; the commit sends the ACK back to the sender.
			Handler: func(ctx context.Context, m runtime.ReceivedMessage) {
				n := self.Load()
				if n == nil {
					// Only Open's redelivery of pending messages runs
					// before self is set, and these nodes are new.
					return
				}
				res, err := n.CommitMessage(ctx, m)
				switch {
				case err != nil:
					if !errors.Is(err, runtime.ErrClosed) {
						h.fail(fmt.Errorf("%s commit: %w", name, err))
					}
				case res.Status == runtime.Committed:
					h.committed.Add(1)
				}
			},
		},
	}
	if dir != "" {
		cfg.Dir, cfg.NoSync = filepath.Join(dir, name), true
	}
	n, err := runtime.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("hosting: open device %d: %w", i, err)
	}
	self.Store(n)
	h.nodes[i] = n
	h.net.RegisterDevice(name, n)
	return nil
}

func (h *host) fail(err error) { h.failed.CompareAndSwap(nil, &err) }

func (h *host) close() { h.closeOnce.Do(h.closeAll) }

func (h *host) closeAll() {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range goruntime.GOMAXPROCS(0) * 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(h.nodes) {
					return
				}
				if n := h.nodes[i]; n != nil {
					_ = n.Close()
					h.nodes[i] = nil
				}
			}
		}()
	}
	wg.Wait()
	h.sys.Shutdown()
}

// waitCommitted waits until the host's committed count reaches want, then
// until the network delivered every envelope (the ACKs).
func (h *host) waitCommitted(ctx context.Context, want int64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for h.committed.Load() < want {
		if p := h.failed.Load(); p != nil {
			return *p
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("hosting: %d of %d messages committed: %w", h.committed.Load(), want, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return h.net.Flush(ctx)
}

// establish makes every pair exchange one message each way (the first
// creates the session from the partner's prekey bundle, the reply
// completes it), each committed and acknowledged.
func (h *host) establish(ctx context.Context) error {
	for _, first := range []bool{true, false} {
		before := h.committed.Load()
		err := h.parallel(len(h.nodes)/2, func(p int) error {
			from := 2 * p
			if !first {
				from++
			}
			_, err := h.nodes[from].Send(ctx, deviceAddr(partner(from)), []byte("hello"))
			return err
		})
		if err != nil {
			return err
		}
		if err := h.waitCommitted(ctx, before+int64(len(h.nodes)/2)); err != nil {
			return err
		}
	}
	return h.checkDrained(ctx)
}

type exchangeResult struct {
	messages      int
	elapsed       time.Duration
	maxGoroutines int
}

func (r exchangeResult) rate() float64 { return float64(r.messages) / r.elapsed.Seconds() }

// exchange runs rounds: in each, every device sends perDevice messages of
// 256 B to its partner, from concurrent senders, and the round ends when
// every one is committed and its ACK delivered. It times the rounds, then
// checks nothing is pending. Equal perDevice gives every pair the same
// message/ACK pattern whatever the device count (the ratchet does a DH
// step at each change of direction, so a pair's pattern sets its cost).
func (h *host) exchange(ctx context.Context, perDevice, rounds int) (exchangeResult, error) {
	body := make([]byte, 256)
	n := len(h.nodes)
	total := n * perDevice
	var peak atomic.Int64
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if g := int64(goruntime.NumGoroutine()); g > peak.Load() {
				peak.Store(g)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	start := time.Now()
	var err error
	for r := 0; r < rounds && err == nil; r++ {
		before := h.committed.Load()
		// Message k goes from device k mod n: all devices at once.
		err = h.parallel(total, func(k int) error {
			from := k % n
			_, err := h.nodes[from].Send(ctx, deviceAddr(partner(from)), body)
			return err
		})
		if err == nil {
			err = h.waitCommitted(ctx, before+int64(total))
		}
	}
	el := time.Since(start)
	close(stop)
	if err != nil {
		return exchangeResult{}, err
	}
	if err := h.checkDrained(ctx); err != nil {
		return exchangeResult{}, err
	}
	return exchangeResult{messages: total * rounds, elapsed: el, maxGoroutines: int(peak.Load())}, nil
}

// parallel runs fn(0..count-1) on 64 goroutines: enough concurrent
// senders to keep both cores busy while sessions wait on their actors.
func (h *host) parallel(count int, fn func(int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first.Load() == nil {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				if err := fn(i); err != nil {
					err = fmt.Errorf("hosting: send %d: %w", i, err)
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p := first.Load(); p != nil {
		return *p
	}
	return nil
}

// checkDrained asserts every node has nothing pending in either direction.
func (h *host) checkDrained(ctx context.Context) error {
	return h.parallel(len(h.nodes), func(i int) error {
		n := h.nodes[i]
		c, err := n.PendingReceivedMessageCount(ctx, nil)
		if err != nil {
			return err
		}
		sent, err := countPendingSent(ctx, n)
		if err != nil {
			return err
		}
		if c != 0 || sent != 0 {
			return fmt.Errorf("device %d: %d pending received, %d+ pending sent after the exchange", i, c, sent)
		}
		return nil
	})
}

// memSample is the process's memory after a forced GC.
type memSample struct {
	heap, stack, rss int64
	goroutines, fds  int
}

func sampleMem() memSample {
	goruntime.GC()
	debug.FreeOSMemory()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	s := memSample{heap: int64(ms.HeapInuse), stack: int64(ms.StackInuse), goroutines: goruntime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			s.rss = pages * int64(os.Getpagesize())
		}
	}
	if es, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.fds = len(es)
	}
	return s
}

func (s memSample) sub(o memSample) memSample {
	return memSample{heap: s.heap - o.heap, stack: s.stack - o.stack, rss: s.rss - o.rss, goroutines: s.goroutines - o.goroutines, fds: s.fds - o.fds}
}

func (s memSample) perDevice(n int) string {
	f := float64(n)
	rss := "n/a"
	if s.rss != 0 {
		rss = bytesIEC(float64(s.rss) / f)
	}
	return fmt.Sprintf("heap in use %s/device  goroutine stacks %s/device  RSS %s/device  goroutines %.2f/device",
		bytesIEC(float64(s.heap)/f), bytesIEC(float64(s.stack)/f), rss, float64(s.goroutines)/f)
}

func bytesIEC(b float64) string {
	switch {
	case b >= 1<<20 || b <= -(1<<20):
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	case b >= 1<<10 || b <= -(1<<10):
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

// dirSize returns the apparent size of the files under dir and the disk
// blocks they use (bbolt preallocates sparsely).
func dirSize(dir string) (apparent, allocated int64) {
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			apparent += info.Size()
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				allocated += st.Blocks * 512
			}
		}
		return nil
	})
	return apparent, allocated
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	goruntime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
