package main

// The delivery section (-only delivery): committed-and-acknowledged
// messages per second between devices, 256 B, fsync on, beside the same
// run's embedded NATS JetStream (examples/benchreport/jetstream, its own
// Go module, run as a child process). A syncmesh message counts when the
// receiver's application committed it and its ACK cleared the sender's
// pending entry; a JetStream message when it was published, delivered to
// the durable pull consumer and its ack recorded by the server. Flows and
// JetStream configurations alternate, trial after trial, so both sides
// see the same machine; min/median/max over the trials are printed.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	deliveryMessages = flag.Int("delivery-messages", 2000, "delivery: messages per trial, each flow and each JetStream configuration")
	deliveryTrials   = flag.Int("delivery-trials", 5, "delivery: interleaved trials")
	deliveryRandIDs  = flag.Bool("delivery-random-ids", false, "delivery: send under crypto-random logical ids (as an application choosing its own ids might) instead of the library's time-ordered ones (runtime.NewMessageID, what Send draws)")
	deliveryStrace   = flag.Int("delivery-strace", 500, "delivery: messages of the extra untimed runs under strace -f -c that count fsync+fdatasync per message on both sides (0: skip)")
	jetstreamBin     = flag.String("jetstream-bin", "", "delivery: a built examples/benchreport/jetstream binary (default: built from -jetstream-src into a temporary directory)")
	jetstreamSrc     = flag.String("jetstream-src", filepath.Join("examples", "benchreport", "jetstream"), "delivery: the JetStream peer's module directory")
	deliveryProfile  = flag.String("delivery-cpuprofile", "", "delivery: after the timed trials, run each syncmesh flow once more (untimed) under a CPU profile written to this prefix + the flow number + .pprof")
	deliveryProfileF = flag.String("delivery-cpuprofile-flows", "", "delivery: comma-separated flow numbers to profile (default: every flow)")
	deliveryProfileN = flag.Int("delivery-cpuprofile-messages", 0, "delivery: messages of each profiled run (0: -delivery-messages); with -delivery-trials 0 only the profiled runs happen")
)

const deliveryBodySize = 256

// smFlow is one syncmesh flow: senders devices, each with window messages
// in flight (sent, not yet acknowledged), to one receiver.
type smFlow struct {
	name            string
	senders, window int
}

var smFlows = []smFlow{
	{"syncmesh 1 pair, 64 in flight", 1, 64},
	{"syncmesh 1 pair, one at a time", 1, 1},
	{"syncmesh 16 senders -> 1 receiver, 4 in flight each", 16, 4},
}

// jsFlow is one JetStream configuration (flags of the child binary).
type jsFlow struct {
	name, sync, publish string
}

var jsFlows = []jsFlow{
	{"JetStream SyncAlways, sync publish", "always", "sync"},
	{"JetStream SyncAlways, async publish (64 in flight)", "always", "async"},
	{"JetStream default sync interval, sync publish", "default", "sync"},
	{"JetStream default sync interval, async publish (64 in flight)", "default", "async"},
}

// smResult is one syncmesh trial.
type smResult struct {
	Messages        int     `json:"messages"`
	Seconds         float64 `json:"seconds"`
	SenderCommits   uint64  `json:"sender_commits"`   // read-write commits of every sender, timed part only
	ReceiverCommits uint64  `json:"receiver_commits"` // the receiver's
	CPUSeconds      float64 `json:"cpu_seconds"`      // the process's user+system CPU, timed part
	// Writes is what the pair's delivery-plane commits wrote (every node).
	Writes runtime.StoreWrites `json:"delivery_writes"`
}

// pagesPerCommit and bytesPerMessage are of the delivery-plane commits.
func (r smResult) pagesPerCommit() float64 {
	return float64(r.Writes.Pages) / float64(r.Writes.Commits)
}
func (r smResult) bytesPerMessage() float64 { return float64(r.Writes.Bytes) / float64(r.Messages) }

func cpuTime() float64 {
	ru := selfRusage()
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// selfRusage is this process's resource usage so far (CPU times, minor
// page faults).
func selfRusage() syscall.Rusage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru
}

func (r smResult) rate() float64 { return float64(r.Messages) / r.Seconds }

type jsResult struct {
	Messages   int     `json:"messages"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"rate"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

// deliveryReport runs the section: trials × (every syncmesh flow, every
// JetStream configuration), alternating, then the strace counts.
func deliveryReport(n, trials, straceN int) error {
	if n < 16 || trials < 0 || trials == 0 && *deliveryProfile == "" {
		return fmt.Errorf("delivery: want -delivery-messages >= 16 and -delivery-trials >= 1 (0 only with -delivery-cpuprofile)")
	}
	if trials == 0 {
		pn := *deliveryProfileN
		if pn <= 0 {
			pn = n
		}
		return profileFlows(context.Background(), *deliveryProfile, pn)
	}
	js, cleanup, err := buildJetStream()
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("== delivery plane: committed-and-acknowledged messages/s, %d B, fsync on; %d messages per trial, %d trials, syncmesh flows and JetStream configurations interleaved (min / median / max)\n", deliveryBodySize, n, trials)
	ids := "the library's time-ordered logical ids (what Send draws)"
	if *deliveryRandIDs {
		ids = "crypto-random logical ids (-delivery-random-ids)"
	}
	fmt.Printf("  syncmesh: in one process, bbolt per device, %s, the receiver's Handler commits each message as it arrives (up to 64 commits at once); counted when the ACK cleared the sender's pending entry\n", ids)
	fmt.Println("  JetStream: nats-server embedded in a child process, file storage, durable pull consumer (64 per pull), explicit ack (Msg.Ack) of each message; counted when the server recorded every ack")
	ctx := context.Background()
	sm := make([][]smResult, len(smFlows))
	jr := make([][]jsResult, len(jsFlows))
	for t := 0; t < trials; t++ {
		// A, B, A, B...: each syncmesh flow next to a JetStream run; the
		// order rotates with the trial so no flow always runs first.
		for k := 0; k < max(len(smFlows), len(jsFlows)); k++ {
			i := (k + t) % max(len(smFlows), len(jsFlows))
			if i < len(smFlows) {
				r, err := smTrial(ctx, smFlows[i], n)
				if err != nil {
					return fmt.Errorf("delivery: %s: %w", smFlows[i].name, err)
				}
				sm[i] = append(sm[i], r)
			}
			if i < len(jsFlows) {
				r, err := jsTrial(js, jsFlows[i], n)
				if err != nil {
					return fmt.Errorf("delivery: %s: %w", jsFlows[i].name, err)
				}
				jr[i] = append(jr[i], r)
			}
		}
	}
	for i, f := range smFlows {
		rates := make([]float64, len(sm[i]))
		var snd, rcv, cpu, pages, bytes []float64
		for j, r := range sm[i] {
			rates[j] = r.rate()
			pages = append(pages, r.pagesPerCommit())
			bytes = append(bytes, r.bytesPerMessage())
			cpu = append(cpu, r.CPUSeconds/float64(r.Messages)*1e6)
			snd = append(snd, float64(r.SenderCommits)/float64(r.Messages))
			rcv = append(rcv, float64(r.ReceiverCommits)/float64(r.Messages))
		}
		s, rc := median(snd), median(rcv)
		fmt.Printf("  %-62s %s msg/s   CPU %4.0f µs/msg   commits/msg: senders %.2f receiver %.2f pair %.2f (fdatasync/msg = 2x: %.1f)   pages/commit %.1f, bytes written/msg %.0f\n", f.name, minMedMax(rates, "%7.0f"), median(cpu), s, rc, s+rc, 2*(s+rc), median(pages), median(bytes))
	}
	for i, f := range jsFlows {
		rates := make([]float64, len(jr[i]))
		var cpu []float64
		for j, r := range jr[i] {
			rates[j] = r.Rate
			cpu = append(cpu, r.CPUSeconds/float64(r.Messages)*1e6)
		}
		fmt.Printf("  %-62s %s msg/s   CPU %4.0f µs/msg\n", f.name, minMedMax(rates, "%7.0f"), median(cpu))
	}
	// Ratios per trial (the two sides of a ratio ran next to each other).
	ratio := func(a []smResult, b func(int) float64) []float64 {
		out := make([]float64, len(a))
		for j := range a {
			out[j] = a[j].rate() / b(j)
		}
		return out
	}
	fmt.Printf("  ratio 1 pair 64 in flight / JetStream SyncAlways sync publish   %s   (target >= 1.5)\n",
		minMedMax(ratio(sm[0], func(j int) float64 { return jr[0][j].Rate }), "%5.2f"))
	fmt.Printf("  ratio 1 pair 64 in flight / JetStream SyncAlways async publish  %s\n",
		minMedMax(ratio(sm[0], func(j int) float64 { return jr[1][j].Rate }), "%5.2f"))
	fmt.Printf("  ratio group / one at a time (1 pair 64 in flight / 1 pair one at a time) %s   (target >= 5)\n",
		minMedMax(ratio(sm[0], func(j int) float64 { return sm[1][j].rate() }), "%5.2f"))
	fmt.Printf("  pair read-write commits per message: 64 in flight %.2f (target <= 0.25), one at a time %.2f (target <= 4)\n",
		pairCommits(sm[0]), pairCommits(sm[1]))
	if *deliveryProfile != "" {
		pn := *deliveryProfileN
		if pn <= 0 {
			pn = n
		}
		if err := profileFlows(ctx, *deliveryProfile, pn); err != nil {
			return err
		}
	}
	if straceN > 0 {
		return straceReport(js, straceN)
	}
	return nil
}

// profileFlows runs every syncmesh flow once under a CPU profile of its
// own (prefix + flow index + .pprof); the CPU per message it prints is of
// that profiled run.
func profileFlows(ctx context.Context, prefix string, n int) error {
	for i, f := range smFlows {
		if *deliveryProfileF != "" && !strings.Contains(","+*deliveryProfileF+",", ","+strconv.Itoa(i)+",") {
			continue
		}
		path := fmt.Sprintf("%s%d.pprof", prefix, i)
		stop, err := startProfile(path)
		if err != nil {
			return err
		}
		r, err := smTrial(ctx, f, n)
		stop()
		if err != nil {
			return fmt.Errorf("delivery: profile %s: %w", f.name, err)
		}
		// The allocations of the whole process so far (alloc_space), beside
		// the CPU profile: GC is a large share of the CPU per message.
		mp, err := os.Create(fmt.Sprintf("%s%d.mem.pprof", prefix, i))
		if err != nil {
			return err
		}
		err = pprof.Lookup("allocs").WriteTo(mp, 0)
		mp.Close()
		if err != nil {
			return err
		}
		fmt.Printf("  CPU profile of %s (untimed run of %d messages; the profile covers its setup too; its timed part: %.0f msg/s, %.0f µs CPU/msg, read-write commits/msg of the pair %.2f, delivery pages/commit %.1f, bytes written/msg %.0f): %s\n", f.name, r.Messages, r.rate(), r.CPUSeconds/float64(r.Messages)*1e6, float64(r.SenderCommits+r.ReceiverCommits)/float64(r.Messages), r.pagesPerCommit(), r.bytesPerMessage(), path)
	}
	return nil
}

func pairCommits(rs []smResult) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = float64(r.SenderCommits+r.ReceiverCommits) / float64(r.Messages)
	}
	return median(v)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func minMedMax(v []float64, f string) string {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return fmt.Sprintf(f+" / "+f+" / "+f, s[0], s[len(s)/2], s[len(s)-1])
}

// buildJetStream returns the JetStream child binary, building it from its
// own module unless -jetstream-bin names one.
func buildJetStream() (string, func(), error) {
	if *jetstreamBin != "" {
		return *jetstreamBin, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", "syncmesh-bench-js-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(tmp, "jetstream")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = *jetstreamSrc
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("delivery: build the JetStream peer in %s: %w\n%s", *jetstreamSrc, err, out)
	}
	return bin, func() { os.RemoveAll(tmp) }, nil
}

func jsArgs(f jsFlow, n int) []string {
	return []string{"-n", strconv.Itoa(n), "-size", strconv.Itoa(deliveryBodySize), "-sync", f.sync, "-publish", f.publish, "-inflight", "64", "-batch", "64"}
}

// jsTrial runs one JetStream trial in a fresh child process and store.
func jsTrial(bin string, f jsFlow, n int) (jsResult, error) {
	out, err := exec.Command(bin, jsArgs(f, n)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return jsResult{}, fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return jsResult{}, err
	}
	var r jsResult
	if err := json.Unmarshal(out, &r); err != nil {
		return jsResult{}, fmt.Errorf("jetstream output %q: %w", out, err)
	}
	if r.Messages != n {
		return jsResult{}, fmt.Errorf("jetstream ran %d messages, want %d", r.Messages, n)
	}
	return r, nil
}

// benchNet is the in-process device transport of the syncmesh trials,
// built like runtime.Network's: one ordered queue per (from, to) link,
// drained by one goroutine that pipelines the link as the runtime
// transports do — it hands each envelope to the receiver's
// ReceiveEnvelopeAsync, in order, with up to benchLinkWindow of them
// decided and not yet durable at once, so consecutive envelopes of a link
// share the receiver's transactions. It also reports each ACK that
// cleared a sender's pending entry — the moment a message counts.
type benchNet struct {
	mu      sync.Mutex
	nodes   map[runtime.DeviceAddress]*runtime.Node
	links   map[[2]runtime.DeviceAddress]*benchLink
	waiters map[ackKey]chan struct{}
	failed  atomic.Pointer[error]
	drains  sync.WaitGroup // drainers and envelopes in flight at a receiver
}

// benchLinkWindow is the runtime transports' per-link window.
const benchLinkWindow = 64

type ackKey struct {
	sender runtime.DeviceAddress
	id     runtime.MessageID
}

type benchLink struct {
	queue   [][]byte
	running bool
	window  chan struct{} // one token per envelope in flight at the receiver
}

func newBenchNet() *benchNet {
	return &benchNet{nodes: map[runtime.DeviceAddress]*runtime.Node{}, links: map[[2]runtime.DeviceAddress]*benchLink{}, waiters: map[ackKey]chan struct{}{}}
}

func (b *benchNet) fail(err error) { b.failed.CompareAndSwap(nil, &err) }

func (b *benchNet) add(n *runtime.Node) {
	b.mu.Lock()
	b.nodes[n.DeviceAddress()] = n
	b.mu.Unlock()
}

// expect registers the wait for the ACK of (sender, id), before the send.
func (b *benchNet) expect(sender runtime.DeviceAddress, id runtime.MessageID) chan struct{} {
	ch := make(chan struct{})
	b.mu.Lock()
	b.waiters[ackKey{sender, id}] = ch
	b.mu.Unlock()
	return ch
}

func (b *benchNet) transport(self runtime.DeviceAddress) runtime.DeviceTransport {
	return &benchTransport{b: b, self: self}
}

type benchTransport struct {
	b    *benchNet
	self runtime.DeviceAddress
}

func (t *benchTransport) node(peer runtime.DeviceAddress) (*runtime.Node, error) {
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	n := t.b.nodes[peer]
	if n == nil {
		return nil, fmt.Errorf("bench: no device %s", peer)
	}
	return n, nil
}

func (t *benchTransport) FetchBundle(ctx context.Context, peer runtime.DeviceAddress) (*messages.PrekeyBundle, error) {
	n, err := t.node(peer)
	if err != nil {
		return nil, err
	}
	bu, err := n.Bundle(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := messages.EncodePrekeyBundle(bu) // as on a wire: a copy
	if err != nil {
		return nil, err
	}
	return messages.DecodePrekeyBundle(raw)
}

var _ runtime.OrderedDeviceTransport = (*benchTransport)(nil)

func (t *benchTransport) Send(_ context.Context, peer runtime.DeviceAddress, envelope []byte) error {
	return t.Enqueue(peer, append([]byte(nil), envelope...))
}

// Enqueue queues envelope on its link (the ordered hand-off, as the
// runtime transports do): the sender's committer calls it in chain order.
func (t *benchTransport) Enqueue(peer runtime.DeviceAddress, envelope []byte) error {
	to, err := t.node(peer)
	if err != nil {
		return err
	}
	k := [2]runtime.DeviceAddress{t.self, peer}
	b := t.b
	b.mu.Lock()
	l := b.links[k]
	if l == nil {
		l = &benchLink{window: make(chan struct{}, benchLinkWindow)}
		b.links[k] = l
	}
	l.queue = append(l.queue, envelope)
	start := !l.running
	l.running = true
	if start {
		b.drains.Add(1)
	}
	b.mu.Unlock()
	if start {
		go t.drain(l, to)
	}
	return nil
}

// drain hands the link's envelopes to the receiver in queue order until
// the queue is empty, each as soon as the window has room.
func (t *benchTransport) drain(l *benchLink, to *runtime.Node) {
	b := t.b
	defer b.drains.Done()
	for {
		b.mu.Lock()
		if len(l.queue) == 0 {
			l.running = false
			b.mu.Unlock()
			return
		}
		env := l.queue[0]
		l.queue = l.queue[1:]
		b.mu.Unlock()
		l.window <- struct{}{}
		b.drains.Add(1)
		err := to.ReceiveEnvelopeAsync(context.Background(), t.self, env, func(res runtime.ReceiveResult, err error) {
			defer func() { <-l.window; b.drains.Done() }()
			t.received(to, res, err)
		})
		if err != nil {
			<-l.window
			b.drains.Done()
			t.received(to, runtime.ReceiveResult{}, err)
		}
	}
}

// received handles one envelope's outcome at the receiver to (called
// from its goroutines: it must not block).
func (t *benchTransport) received(to *runtime.Node, res runtime.ReceiveResult, err error) {
	b := t.b
	if err != nil {
		if !errors.Is(err, runtime.ErrClosed) {
			b.fail(fmt.Errorf("%s receiving from %s: %w", to.DeviceAddress(), t.self, err))
		}
		return
	}
	if res.Kind == runtime.Acknowledgement && res.Cleared {
		k := ackKey{to.DeviceAddress(), res.ID}
		b.mu.Lock()
		ch := b.waiters[k]
		delete(b.waiters, k)
		b.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	}
}

// eachSender runs fn(0..n-1) at once (setup, untimed) and returns the
// first error.
func eachSender(n int, fn func(int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func benchAddr(user string) runtime.DeviceAddress {
	return runtime.DeviceAddress{User: user, Device: 1}
}

// smTrial opens a receiver and f.senders senders (fresh bbolt files, fsync
// on), establishes each session with one acknowledged message (untimed),
// then times n messages (rounded down to a multiple of f.senders; 0: the
// setup only): each sender keeps f.window in flight.
func smTrial(ctx context.Context, f smFlow, n int) (smResult, error) {
	dir, err := os.MkdirTemp("", "syncmesh-bench-delivery-")
	if err != nil {
		return smResult{}, err
	}
	defer os.RemoveAll(dir)
	net := newBenchNet()
	var nodes []*runtime.Node
	var nodesMu sync.Mutex
	defer func() {
		for _, nd := range nodes {
			_ = nd.Close()
		}
		net.drains.Wait()
	}()
	var recv atomic.Pointer[runtime.Node]
	var committed atomic.Int64
	sem := make(chan struct{}, 64)
	var commits sync.WaitGroup
	defer commits.Wait()
	open := func(user string, handler func(context.Context, runtime.ReceivedMessage)) (*runtime.Node, error) {
		a := benchAddr(user)
		nd, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(dir, user), MeshID: mesh, Name: user, SyncInterval: -1,
			Device: &runtime.DeviceConfig{Address: a, Transport: net.transport(a), Handler: handler}})
		if err != nil {
			return nil, err
		}
		nodesMu.Lock()
		nodes = append(nodes, nd)
		nodesMu.Unlock()
		net.add(nd)
		return nd, nil
	}
	// The application: commit each message as it arrives, up to 64
	// commits at once (the Handler is called one message at a time; the
	// commits run beside it so that the store can group them).
	r, err := open("receiver", func(ctx context.Context, m runtime.ReceivedMessage) {
		sem <- struct{}{}
		commits.Add(1)
		go func() {
			defer func() { <-sem; commits.Done() }()
			res, err := recv.Load().CommitMessage(ctx, m)
			switch {
			case err != nil:
				if !errors.Is(err, runtime.ErrClosed) {
					net.fail(fmt.Errorf("commit: %w", err))
				}
			case res.Status == runtime.Committed:
				committed.Add(1)
			}
		}()
	})
	if err != nil {
		return smResult{}, err
	}
	recv.Store(r)
	senders := make([]*runtime.Node, f.senders)
	if err := eachSender(f.senders, func(i int) (err error) {
		senders[i], err = open(fmt.Sprintf("sender%02d", i), nil)
		return err
	}); err != nil {
		return smResult{}, err
	}
	body := make([]byte, deliveryBodySize)
	send := func(s *runtime.Node) error {
		// The library's ids, as Send would draw them (time-ordered).
		id, err := runtime.NewMessageID()
		if *deliveryRandIDs {
			_, err = rand.Read(id[:])
		}
		if err != nil {
			return err
		}
		acked := net.expect(s.DeviceAddress(), id)
		if _, err := s.SendWithID(ctx, r.DeviceAddress(), id, body); err != nil {
			return err
		}
		select {
		case <-acked:
			return nil
		case <-time.After(2 * time.Minute):
			if p := net.failed.Load(); p != nil {
				return *p
			}
			return fmt.Errorf("no ACK for %s within 2 minutes", id)
		}
	}
	// Establish every session (the first message carries the X3DH
	// initiation; the ACK completes the session): untimed.
	if err := eachSender(f.senders, func(i int) error { return send(senders[i]) }); err != nil {
		return smResult{}, fmt.Errorf("establish: %w", err)
	}
	commitsOf := func(ns []*runtime.Node) uint64 {
		var c uint64
		for _, nd := range ns {
			sc := nd.StoreCommits()
			c += sc.Sync + sc.Delivery
		}
		return c
	}
	writesOf := func() (w runtime.StoreWrites) {
		for _, nd := range append([]*runtime.Node{r}, senders...) {
			x := nd.DeliveryStoreWrites()
			w.Commits, w.Pages, w.Bytes = w.Commits+x.Commits, w.Pages+x.Pages, w.Bytes+x.Bytes
		}
		return w
	}
	before := committed.Load()
	s0, r0 := commitsOf(senders), commitsOf([]*runtime.Node{r})
	w0 := writesOf()
	per := n / f.senders
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	start, cpu0 := time.Now(), cpuTime()
	for _, s := range senders {
		var left atomic.Int64
		left.Store(int64(per))
		for w := 0; w < f.window; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for first.Load() == nil && left.Add(-1) >= 0 {
					if err := send(s); err != nil {
						first.CompareAndSwap(nil, &err)
					}
				}
			}()
		}
	}
	wg.Wait()
	el, cpu := time.Since(start), cpuTime()-cpu0
	if p := first.Load(); p != nil {
		return smResult{}, *p
	}
	if p := net.failed.Load(); p != nil {
		return smResult{}, *p
	}
	res := smResult{Messages: per * f.senders, Seconds: el.Seconds(), SenderCommits: commitsOf(senders) - s0, ReceiverCommits: commitsOf([]*runtime.Node{r}) - r0, CPUSeconds: cpu}
	w1 := writesOf()
	res.Writes = runtime.StoreWrites{Commits: w1.Commits - w0.Commits, Pages: w1.Pages - w0.Pages, Bytes: w1.Bytes - w0.Bytes}
	// An ACK leaves the receiver (queued by its committer) before the
	// CommitMessage call that produced it returns to its goroutine, so the
	// last commits' counts may still be on their way: wait for them
	// (outside the timed part) instead of reading the counter too early.
	deadline := time.Now().Add(time.Minute)
	for committed.Load()-before < int64(res.Messages) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := committed.Load() - before; got != int64(res.Messages) {
		return smResult{}, fmt.Errorf("%d messages committed, want %d", got, res.Messages)
	}
	if c, err := r.PendingReceivedMessageCount(ctx, nil); err != nil || c != 0 {
		return smResult{}, fmt.Errorf("receiver: %d pending after the run (%v)", c, err)
	}
	for _, s := range senders {
		if n, err := countPendingSent(ctx, s); err != nil || n != 0 {
			return smResult{}, fmt.Errorf("%s: %d sent messages still pending after the run (%v)", s.DeviceAddress(), n, err)
		}
	}
	return res, nil
}

// The strace counts: durable-write calls of a whole process (every
// thread: strace -f), in a run of m messages minus a run of none (the
// setup: opening stores, establishing sessions), divided by m. The
// syncmesh flow runs in a child re-executed from this binary
// (deliveryChildEnv), sender and receiver in that one process, so its
// count is the pair's; the split per side comes from the commit counters
// above. strace slows the processes down: these runs are not timed.

const deliveryChildEnv = "SYNCMESH_BENCH_DELIVERY_CHILD"

type deliveryChildSpec struct {
	Flow int `json:"flow"`
	N    int `json:"n"`
}

func init() {
	raw := os.Getenv(deliveryChildEnv)
	if raw == "" {
		return
	}
	// A child of straceReport: run one trial, print it, exit.
	var spec deliveryChildSpec
	err := json.Unmarshal([]byte(raw), &spec)
	var r smResult
	if err == nil && (spec.Flow < 0 || spec.Flow >= len(smFlows)) {
		err = fmt.Errorf("flow %d", spec.Flow)
	}
	if err == nil {
		r, err = smTrial(context.Background(), smFlows[spec.Flow], spec.N)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "delivery child:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

// syncCalls counts a process's durable-write system calls: fsync,
// fdatasync, and files opened with O_SYNC or O_DSYNC (nats-server writes
// its state files that way under SyncAlways: each such write is a device
// flush that no fsync call shows).
type syncCalls struct{ fsync, fdatasync, osync int }

func (c syncCalls) total() int { return c.fsync + c.fdatasync + c.osync }

func (c syncCalls) minus(d syncCalls) syncCalls {
	return syncCalls{c.fsync - d.fsync, c.fdatasync - d.fdatasync, c.osync - d.osync}
}

// straceCalls runs argv under strace -f (every thread) tracing fsync,
// fdatasync and openat, and counts them.
func straceCalls(env []string, argv ...string) (syncCalls, error) {
	out, err := os.CreateTemp("", "syncmesh-strace-")
	if err != nil {
		return syncCalls{}, err
	}
	out.Close()
	defer os.Remove(out.Name())
	cmd := exec.Command("strace", append([]string{"-f", "--seccomp-bpf", "-e", "trace=fsync,fdatasync,openat", "-o", out.Name()}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return syncCalls{}, fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, b)
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return syncCalls{}, err
	}
	return parseStrace(string(b)), nil
}

// parseStrace counts the calls in strace -f output: one per call start
// (a "<... resumed>" line continues a call already counted).
func parseStrace(trace string) syncCalls {
	var c syncCalls
	for _, line := range strings.Split(trace, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		call := f[1] // f[0] is the thread id
		switch {
		case strings.HasPrefix(call, "fsync("):
			c.fsync++
		case strings.HasPrefix(call, "fdatasync("):
			c.fdatasync++
		case strings.HasPrefix(call, "openat(") && (strings.Contains(line, "O_SYNC") || strings.Contains(line, "O_DSYNC")):
			c.osync++
		}
	}
	return c
}

func straceReport(js string, m int) error {
	if _, err := exec.LookPath("strace"); err != nil {
		fmt.Println("  durable syncs per message: strace not installed (apt-get install strace); skipped")
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("  durable syncs per message, counted by strace -f (fsync + fdatasync + O_SYNC file writes; a run of %d messages minus a run of 0, untimed):\n", m)
	show := func(name, who string, c [2]syncCalls) {
		d := c[1].minus(c[0])
		fmt.Printf("    %-62s %5.2f per message (%s: fsync %.2f, fdatasync %.2f, O_SYNC writes %.2f)\n", name, float64(d.total())/float64(m), who,
			float64(d.fsync)/float64(m), float64(d.fdatasync)/float64(m), float64(d.osync)/float64(m))
	}
	for i, f := range smFlows {
		var c [2]syncCalls
		for j, k := range []int{0, m} {
			spec, _ := json.Marshal(deliveryChildSpec{Flow: i, N: k})
			if c[j], err = straceCalls([]string{deliveryChildEnv + "=" + string(spec)}, self); err != nil {
				return err
			}
		}
		show(f.name, "senders + receiver", c)
	}
	for _, f := range jsFlows {
		var c [2]syncCalls
		for j, k := range []int{0, m} {
			if c[j], err = straceCalls(nil, append([]string{js}, jsArgs(f, k)...)...); err != nil {
				return err
			}
		}
		show(f.name, "the server", c)
	}
	return nil
}

// countPendingSent counts n's sent messages still waiting for their ACK.
func countPendingSent(ctx context.Context, n *runtime.Node) (int, error) {
	c := 0
	for _, err := range n.PendingSent(ctx, 0, nil) {
		if err != nil {
			return c, err
		}
		c++
	}
	return c, nil
}
