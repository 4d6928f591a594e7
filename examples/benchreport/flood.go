package main

// The flood section (-only flood): alice's p99
// delivery latency to bob with and without a flood at bob. Alice sends
// her messages one at a time; a message's latency runs from her Send to
// the ACK of bob's commit clearing her pending entry (fsync on at both
// sides). In the flood arm, from her first Send on, a third device
// (mallory.1) hands bob 200 forged prekey envelopes — each, when
// decrypted, the whole PQXDH agreement before its AEAD fails — and 1 100
// bundle requests arrive from 16 requesters at once. The two arms are
// interleaved, trial after trial (internal/ab), each on fresh stores, and
// the report prints each arm's p99 and the per-trial ratio flood / quiet
// as median (min, max) against the target of 2.
//
// Over the remote, the stream guard rate-limits bundle requests per
// requester (runtime.DefaultBundleBurst at once, DefaultBundlesPerSecond
// after) and refuses the rest before the device sees them. In process
// there is no guard, so the flood arm applies that same budget to the
// flooder, one requester (as a third process over the remote) sending 16 requests
// at once (a refused request costs bob nothing), and a third arm
// ("flood, unthrottled") hands all 1 100 to bob — harsher than anything
// the remote lets through; its ratio is printed without a target.

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	floodMessages = flag.Int("flood-messages", 100, "flood: alice's messages per trial and arm (one at a time)")
	floodTrials   = flag.Int("flood-trials", 5, "flood: interleaved trials")
	floodForged   = flag.Int("flood-forged", 200, "flood: forged prekey envelopes per flood")
	floodBundles  = flag.Int("flood-bundles", 1100, "flood: bundle requests per flood (16 at once)")
)

// floodRun is what one arm of one trial measured.
type floodRun struct {
	P99, Median   time.Duration
	Forged        int // forged envelopes bob decided (all refused or failed)
	Bundles       int // bundle requests served
	FloodFinished bool
}

func floodReport(n, trials int) error {
	fmt.Printf("\n== flood: alice's delivery latency to bob, quiet and under a flood (%d messages one at a time, %d forged initiations + %d bundle requests; %d interleaved trials)\n",
		n, *floodForged, *floodBundles, trials)
	ctx := context.Background()
	var runs [3][]floodRun
	arm := func(i int, flood, throttle bool) func(int) (float64, error) {
		return func(int) (float64, error) {
			r, err := floodTrial(ctx, n, flood, throttle, *floodForged, *floodBundles)
			if err != nil {
				return 0, err
			}
			runs[i] = append(runs[i], r)
			return r.P99.Seconds() * 1e3, nil
		}
	}
	s, err := ab.Run(trials, ab.Arm{Name: "quiet", Run: arm(0, false, false)}, ab.Arm{Name: "flood", Run: arm(1, true, true)},
		ab.Arm{Name: "unthrottled", Run: arm(2, true, false)})
	if err != nil {
		return err
	}
	medians := func(rs []floodRun) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = r.Median.Seconds() * 1e3
		}
		return out
	}
	ratio := s.Ratio("flood", "quiet")
	fmt.Print(ab.Table([][2]string{
		{"alice p99 latency, quiet (ms)", s.Stats("quiet").Format("%.1f")},
		{"alice p99 latency, flood (ms)", s.Stats("flood").Format("%.1f")},
		{"alice median latency, quiet / flood (ms)", ab.Summarize(medians(runs[0])).Format("%.1f") + " / " + ab.Summarize(medians(runs[1])).Format("%.1f")},
		{"p99 flood / quiet, per trial", ratio.String() + "  " + ratio.Verdict(2, false)},
		{"alice p99 latency, flood with bundles unthrottled (ms)", s.Stats("unthrottled").Format("%.1f")},
		{"p99 unthrottled flood / quiet, per trial (no target)", s.Ratio("unthrottled", "quiet").String()},
	}))
	for i, r := range runs[1] {
		fmt.Printf("  flood trial %d: %d forged envelopes decided, %d bundles served (the rest refused by the requester's budget), flood over before alice's last ACK: %v\n", i, r.Forged, r.Bundles, r.FloodFinished)
	}
	for i, r := range runs[2] {
		fmt.Printf("  unthrottled trial %d: %d forged envelopes decided, %d bundles served, flood over before alice's last ACK: %v\n", i, r.Forged, r.Bundles, r.FloodFinished)
	}
	return nil
}

// floodTrial opens bob and alice (fresh bbolt files, fsync on),
// establishes their session with one acknowledged message (untimed), then
// measures n of alice's messages one at a time, with the flood started at
// the first when flood is set.
func floodTrial(ctx context.Context, n int, flood, throttle bool, forgedN, bundlesN int) (floodRun, error) {
	dir, err := os.MkdirTemp("", "syncmesh-bench-flood-")
	if err != nil {
		return floodRun{}, err
	}
	defer os.RemoveAll(dir)
	net := newBenchNet()
	var nodes []*runtime.Node
	var floodWG sync.WaitGroup
	defer func() {
		floodWG.Wait()
		for _, nd := range nodes {
			_ = nd.Close()
		}
		net.drains.Wait()
	}()
	var bob atomic.Pointer[runtime.Node]
	var commits sync.WaitGroup
	defer commits.Wait()
	open := func(user string, handler func(context.Context, runtime.ReceivedMessage)) (*runtime.Node, error) {
		a := benchAddr(user)
		nd, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(dir, user), MeshID: mesh, Name: user, SyncInterval: -1,
			Device: &runtime.DeviceConfig{Address: a, Transport: net.transport(a), Handler: handler}})
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, nd)
		net.add(nd)
		return nd, nil
	}
	b, err := open("bob", func(ctx context.Context, m runtime.ReceivedMessage) {
		commits.Add(1)
		go func() {
			defer commits.Done()
			if _, err := bob.Load().CommitMessage(ctx, m); err != nil && !errors.Is(err, runtime.ErrClosed) {
				net.fail(fmt.Errorf("bob's commit: %w", err))
			}
		}()
	})
	if err != nil {
		return floodRun{}, err
	}
	bob.Store(b)
	alice, err := open("alice", nil)
	if err != nil {
		return floodRun{}, err
	}
	body := make([]byte, deliveryBodySize)
	send := func() (time.Duration, error) {
		var id runtime.MessageID
		if _, err := rand.Read(id[:]); err != nil {
			return 0, err
		}
		acked := net.expect(alice.DeviceAddress(), id)
		start := time.Now()
		if _, err := alice.SendWithID(ctx, b.DeviceAddress(), id, body); err != nil {
			return 0, err
		}
		select {
		case <-acked:
			return time.Since(start), nil
		case <-time.After(2 * time.Minute):
			if p := net.failed.Load(); p != nil {
				return 0, *p
			}
			return 0, fmt.Errorf("no ACK for %s within 2 minutes", id)
		}
	}
	if _, err := send(); err != nil {
		return floodRun{}, fmt.Errorf("establish: %w", err)
	}
	mallory := benchAddr("mallory")
	var forged []byte
	if flood {
		if forged, err = forgedInitiation(ctx, b, mallory); err != nil {
			return floodRun{}, err
		}
	}
	var decided, served atomic.Int64
	floodDone := make(chan struct{})
	if flood {
		floodWG.Add(2)
		go func() {
			defer floodWG.Done()
			var each sync.WaitGroup
			for range forgedN {
				each.Add(1)
				err := b.ReceiveEnvelopeAsync(ctx, mallory, forged, func(_ runtime.ReceiveResult, err error) {
					defer each.Done()
					if err != nil { // every forged envelope fails (budget or decrypt)
						decided.Add(1)
					}
				})
				if err != nil {
					each.Done()
					decided.Add(1)
				}
			}
			each.Wait()
		}()
		go func() {
			defer floodWG.Done()
			var next atomic.Int64
			var each sync.WaitGroup
			budget := newBundleBudget(runtime.DefaultBundleBurst, runtime.DefaultBundlesPerSecond)
			for range 16 {
				each.Add(1)
				go func() {
					defer each.Done()
					for next.Add(1) <= int64(bundlesN) {
						if throttle && !budget.take(time.Now()) {
							continue // refused by the guard: bob never sees it
						}
						if _, err := b.Bundle(ctx); err == nil {
							served.Add(1)
						}
					}
				}()
			}
			each.Wait()
		}()
		go func() { floodWG.Wait(); close(floodDone) }()
	}
	lat := make([]time.Duration, 0, n)
	for range n {
		d, err := send()
		if err != nil {
			return floodRun{}, err
		}
		lat = append(lat, d)
	}
	finished := false
	if flood {
		select {
		case <-floodDone:
			finished = true
		default:
		}
		floodWG.Wait()
		if int(decided.Load()) != forgedN {
			return floodRun{}, fmt.Errorf("bob decided %d of %d forged envelopes", decided.Load(), forgedN)
		}
	}
	if p := net.failed.Load(); p != nil {
		return floodRun{}, *p
	}
	if n, err := countPendingSent(ctx, alice); err != nil || n != 0 {
		return floodRun{}, fmt.Errorf("alice: %d sent messages still pending after the run (%v)", n, err)
	}
	slices.Sort(lat)
	return floodRun{P99: percentile(lat, 0.99), Median: percentile(lat, 0.5), Forged: int(decided.Load()), Bundles: int(served.Load()), FloodFinished: finished}, nil
}

// bundleBudget is one requester's bundle budget as the remote's guard
// keeps it: a token bucket of burst tokens refilled at rate a second.
type bundleBudget struct {
	mu                  sync.Mutex
	tokens, burst, rate float64
	at                  time.Time
}

func newBundleBudget(burst int, rate float64) *bundleBudget {
	return &bundleBudget{tokens: float64(burst), burst: float64(burst), rate: rate, at: time.Now()}
}

func (b *bundleBudget) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// forgedInitiation is a prekey envelope to bob from a throwaway identity
// claiming from, its ciphertext flipped: bob runs the agreement (several
// X25519, one ML-KEM decapsulation) before the AEAD fails.
func forgedInitiation(ctx context.Context, bob *runtime.Node, from runtime.DeviceAddress) ([]byte, error) {
	id, err := ratchet.NewIdentity()
	if err != nil {
		return nil, err
	}
	bundle, err := bob.Bundle(ctx)
	if err != nil {
		return nil, err
	}
	cfg := ratchet.DefaultConfig()
	rec, _, err := cfg.Initiate(ratchet.SessionRecord{}, id, bundle, ratchet.Route{From: from, To: bob.DeviceAddress()})
	if err != nil {
		return nil, err
	}
	_, env, err := cfg.Encrypt(rec, []byte("forged"))
	if err != nil {
		return nil, err
	}
	env[len(env)-1] ^= 0xff
	return env, nil
}
