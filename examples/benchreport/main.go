// Command benchreport prints syncmesh's benchmark report (`make bench`):
// each throughput beside a ceiling or a peer measured in the same run, as
// a ratio, because the machines it runs on are small and noisy.
//
// Every ratio of the sync sections comes from the interleaved harness
// (internal/ab): A and B alternate in one process, trial after trial, and
// the report prints the per-trial ratio as median (min, max). One core is
// a child process started with GOMAXPROCS=1.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	mesh        = []byte("bench-mesh")
	cpuprofile  = flag.String("cpuprofile", "", "write a CPU profile of the one-core child (all its arms) here")
	storeCache  = flag.String("store-cache", "", "keep the sync section's preloaded store in this directory and copy it on later runs")
	traceTrials = flag.Bool("trace-trials", false, "sync: print every one-core trial (rate, CPU, GC cycles and minor page faults per event) on standard error, to see what moved a figure")
	syncArms    = flag.String("sync-arms", "", "sync: run only these comma-separated one-core arms (ed25519, go-cose, single, batch, apply, push-valid, push-one, push-every, vbatch-every, vsingle-every) and the two-core section only if the list names scale; for profiling and quick A/B runs (default: all)")
)

// benchRows is the workload's row count (makeEvents): fixed, so a
// ratio cannot be moved by changing keys.
const benchRows = 5000

func main() {
	ab.Main() // a child process runs its section here and exits
	events := flag.Int("events", 20000, "signed events per apply trial")
	writers := flag.Int("writers", 4, "concurrent ApplySignedBatch callers")
	batch := flag.Int("batch", 2000, "events per ApplySignedBatch call")
	sites := flag.Int("sites", 4, "signing sites (one sync group each)")
	trials := flag.Int("trials", 5, "interleaved trials per comparison")
	pushes := flag.Int("pushes", pushesPerTrial, "pushes of 1 000 events per trial and arm in the forgery comparison")
	preload := flag.Int("preload", 100000, "events of history on the SAME rows the measured events write (untimed) in the apply store; the targets are set at 1 000 000")
	only := flag.String("only", "", "run one section only: sync, catchup, sessions, hosting, delivery, flood, held, tables, watch, queries, reconcile or replication (default: all)")
	catchupEvents := flag.String("catchup-events", "100000", "comma-separated store sizes a joining node catches up on from genesis (the first is the reference of the growth ratios)")
	catchupTrials := flag.Int("catchup-trials", 5, "interleaved trials per catch-up size (the ratio is their median)")
	pushBatch := flag.Int("push-batch", 2000, "events per push in the catch-up run")
	rounds := flag.Int("session-rounds", 20000, "round trips per sessions measurement")
	idle := flag.Int("idle-sessions", 100000, "idle sessions measured (persisted and live)")
	hostingDevices := flag.Int("hosting-devices", 10000, "device nodes hosted on one actor system (even)")
	hostingMessages := flag.Int("hosting-messages", 20000, "messages the hosted devices exchange (a multiple of -hosting-devices)")
	reconEvents := flag.Int("reconcile-events", 100000, "events each of the two reconciling nodes holds (the targets are set at 1 000 000: make bench-1m)")
	reconTrials := flag.Int("reconcile-trials", 5, "reconciliations measured at d = 0")
	flag.Parse()
	sections := []struct {
		name string
		run  func() error
	}{
		{"sync", func() error {
			return syncReport(syncParams{Events: *events, Writers: *writers, Batch: *batch, Sites: *sites, Trials: *trials, Preload: *preload, Pushes: *pushes, Profile: *cpuprofile, StoreCache: *storeCache, Arms: splitList(*syncArms), Trace: *traceTrials})
		}},
		{"catchup", func() error {
			sizes, err := parseSizes(*catchupEvents)
			if err != nil {
				return err
			}
			return catchupReport(catchupParams{Sizes: sizes, Sites: *sites, Writers: *writers, Batch: *batch, PushBatch: *pushBatch, Trials: *catchupTrials})
		}},
		{"sessions", func() error { return sessionsReport(*rounds, *idle) }},
		{"hosting", func() error { return hostingReport(*hostingDevices, *hostingMessages) }},
		{"delivery", func() error { return deliveryReport(*deliveryMessages, *deliveryTrials, *deliveryStrace) }},
		{"flood", func() error { return floodReport(*floodMessages, *floodTrials) }},
		{"held", func() error { return heldReport(*heldMessages, *heldHold, *heldTrials) }},
		{"tables", func() error { return tablesReport(*tablesRows, *tablesBatch, *tablesTrials) }},
		{"watch", func() error { return watchReport(*watchPreload, *watchCommits, *watchTrials) }},
		{"queries", func() error { return queriesReport(*queriesRows, *queriesN, *queriesEvents, *queriesTrials) }},
		{"reconcile", func() error {
			return reconcileReport(reconcileParams{Events: *reconEvents, Sites: *sites, Batch: *batch, Trials: *reconTrials, StoreCache: *storeCache})
		}},
		{"replication", replicationReport},
	}
	known := false
	for _, s := range sections {
		known = known || s.name == *only
	}
	if *only != "" && !known {
		fmt.Fprintf(os.Stderr, "benchreport: -only %q: want sync, catchup, sessions, hosting, delivery, flood, held, tables, watch, queries, reconcile or replication\n", *only)
		os.Exit(2)
	}
	for _, s := range sections {
		if *only != "" && *only != s.name {
			continue
		}
		if err := s.run(); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
	}
}

// splitList splits a comma-separated flag value (nil for "").
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("-catchup-events %q: want positive sizes separated by commas", s)
		}
		out = append(out, n)
	}
	return out, nil
}

type peer struct {
	signer *sign.Signer
}

// benchPeers returns the signing sites of the workload. Their keys derive
// from fixed seeds, so a child process trusts the same keys as the parent
// that signed its events.
func benchPeers(sites int) []*peer {
	peers := make([]*peer, sites)
	for i := range peers {
		seed := sha256.Sum256([]byte(fmt.Sprintf("syncmesh benchreport site %d", i)))
		priv := ed25519.NewKeyFromSeed(seed[:])
		peers[i] = &peer{signer: sign.NewSigner(messages.SiteID{byte(i + 1), 0xbe}, priv)}
	}
	return peers
}

// benchEpoch is the wall time events of epoch 0 start at: far enough in
// the past that no epoch reaches the skew bound, recent enough to be a
// plausible history.
var benchEpoch = uint64(time.Now().Add(-3 * time.Hour).UnixMilli())

// makeEvents is the workload: n events signed round-robin by sites sites,
// writing rows i % 5000 of bench.t.
func makeEvents(n, sites int) ([]*peer, [][]byte, error) {
	peers := benchPeers(sites)
	raws, err := makeEventsAt(peers, n, 0)
	return peers, raws, err
}

// makeEventsAt signs the workload's n events in epoch e: the same rows,
// HLCs one minute later per epoch, so every epoch's events are new events
// (fresh ids) of the same rows.
func makeEventsAt(peers []*peer, n, e int) ([][]byte, error) { return makeEventsRange(peers, 0, n, e) }

// writeEvents stores raws in path (uvarint length, bytes; repeated), for
// a child process to read.
func writeEvents(path string, raws [][]byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var lb [binary.MaxVarintLen64]byte
	buf := make([]byte, 0, 1<<20)
	for _, r := range raws {
		buf = append(buf, lb[:binary.PutUvarint(lb[:], uint64(len(r)))]...)
		buf = append(buf, r...)
		if len(buf) > 1<<20-8<<10 {
			if _, err := f.Write(buf); err != nil {
				f.Close()
				return err
			}
			buf = buf[:0]
		}
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readEvents(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for len(b) > 0 {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			return nil, fmt.Errorf("%s: truncated", path)
		}
		out = append(out, b[w:w+int(n)])
		b = b[w+int(n):]
	}
	return out, nil
}

var benchTable = runtime.TableDef{Schema: "bench", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}

// openApplyNode opens (or reopens) a bbolt node in dir that trusts peers.
func openApplyNode(ctx context.Context, dir string, peers []*peer) (*runtime.Node, error) {
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh})
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

// applyAll applies raws with writers concurrent ApplySignedBatch callers of
// batch events each and returns events per second; every outcome must be
// want (Applied for fresh events).
func applyAll(ctx context.Context, n *runtime.Node, raws [][]byte, writers, batch int) (float64, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(int64(batch))) - batch
				if i >= len(raws) {
					return
				}
				outs, err := n.ApplySignedBatch(ctx, raws[i:min(i+batch, len(raws))])
				if err == nil {
					for j, out := range outs {
						if out.Kind != messages.Applied {
							err = fmt.Errorf("event %d: %v", i+j, out)
							break
						}
					}
				}
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if f := failed.Load(); f != nil {
		return 0, *f
	}
	return float64(len(raws)) / el.Seconds(), nil
}

// preloadStore applies history events (epoch 0, the same rows as the
// measured events) to a fresh store in dir, untimed, on every core.
func preloadStore(ctx context.Context, dir string, peers []*peer, history, batch int) error {
	n, err := openApplyNode(ctx, dir, peers)
	if err != nil {
		return err
	}
	defer n.Close()
	const chunk = 100_000
	for done := 0; done < history; done += chunk {
		raws, err := makeEventsRange(peers, done, min(done+chunk, history), 0)
		if err != nil {
			return err
		}
		if _, err := applyAll(ctx, n, raws, 4, batch); err != nil {
			return err
		}
	}
	return n.Close()
}

// makeEventsRange signs events [from, to) of epoch e's workload on every
// core (the preload signs its history in chunks).
func makeEventsRange(peers []*peer, from, to, e int) ([][]byte, error) {
	sites := len(peers)
	base := benchEpoch + uint64(e)*60_000
	raws := make([][]byte, to-from)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for w := 0; w < goruntime.NumCPU(); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1)) - 1
				if j >= len(raws) {
					return
				}
				i := from + j
				p := peers[i%sites]
				seq := i / sites
				h, _ := messages.NewHLC(base+uint64(seq>>16), uint16(seq))
				ev := &messages.Event{Site: p.signer.Site(), HLC: h, Schema: "bench", Table: "t",
					Key:     messages.Columns{"id": messages.MustValue(i % benchRows)},
					Payload: messages.Columns{"a": messages.MustValue(fmt.Sprintf("value-%d", i)), "b": messages.MustValue(i)}}
				raw, err := p.signer.Sign(ev, mesh)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				raws[j] = raw
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f != nil {
		return nil, *f
	}
	return raws, nil
}

func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	// The allocations of the same process go beside it (path.allocs):
	// what the garbage collector's share of the profile comes from.
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if a, err := os.Create(path + ".allocs"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			a.Close()
		}
	}, nil
}

func eventFile(dir, name string) string { return filepath.Join(dir, name+".ev") }
