package main

// The held section (-only held): resends per message to a receiver whose
// application holds each message before committing it, with held
// receipts (the default) and without (SessionConfig.NoHeldReceipts: what
// every build did before the receipt existed). Alice sends a burst of
// messages to bob on the retry schedule 1 s ×1.5, cap 10 s, jitter 0.2;
// bob's handler commits each message -held-hold after it was handed over.
// A resend is an envelope alice hands her transport beyond the first of
// each message. The two arms are interleaved, trial after trial
// (internal/ab), each on fresh in-memory nodes.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

var (
	heldMessages = flag.Int("held-messages", 50, "held: messages alice sends in one burst per trial and arm")
	heldHold     = flag.Duration("held-hold", 10*time.Second, "held: how long bob's application holds each message before committing it")
	heldTrials   = flag.Int("held-trials", 3, "held: interleaved trials")
)

// heldRun is what one arm of one trial measured.
type heldRun struct {
	Resends  int           // envelopes alice sent beyond one per message
	Receipts int           // held receipts bob sent
	Drained  time.Duration // from the burst to the last ACK
}

// countingTransport counts the envelopes a device hands its transport.
type countingTransport struct {
	runtime.DeviceTransport
	sent atomic.Int64
}

func (c *countingTransport) Send(ctx context.Context, peer runtime.DeviceAddress, env []byte) error {
	c.sent.Add(1)
	return c.DeviceTransport.Send(ctx, peer, env)
}

func heldReport(n int, hold time.Duration, trials int) error {
	fmt.Printf("\n== held: resends per message to a receiver that commits each message %v after it was handed over (%d messages in one burst; retry 1 s x1.5, cap 10 s, jitter 0.2; %d interleaved trials)\n",
		hold, n, trials)
	ctx := context.Background()
	var runs [2][]heldRun
	arm := func(i int, receipts bool) func(int) (float64, error) {
		return func(int) (float64, error) {
			r, err := heldTrial(ctx, n, hold, receipts)
			if err != nil {
				return 0, err
			}
			runs[i] = append(runs[i], r)
			return float64(r.Resends) / float64(n), nil
		}
	}
	s, err := ab.Run(trials, ab.Arm{Name: "receipts", Run: arm(0, true)}, ab.Arm{Name: "none", Run: arm(1, false)})
	if err != nil {
		return err
	}
	drained := func(rs []heldRun) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = r.Drained.Seconds()
		}
		return out
	}
	receipts := func(rs []heldRun) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = float64(r.Receipts) / float64(n)
		}
		return out
	}
	fmt.Print(ab.Table([][2]string{
		{"resends per message, held receipts", s.Stats("receipts").Format("%.2f")},
		{"resends per message, no receipts (before)", s.Stats("none").Format("%.2f")},
		{"held receipts sent per message", ab.Summarize(receipts(runs[0])).Format("%.2f")},
		{"burst to last ACK, receipts / none (s)", ab.Summarize(drained(runs[0])).Format("%.1f") + " / " + ab.Summarize(drained(runs[1])).Format("%.1f")},
	}))
	return nil
}

// heldTrial opens alice and bob in memory on one Network, sends n
// messages at once and waits until every ACK cleared them.
func heldTrial(ctx context.Context, n int, hold time.Duration, receipts bool) (heldRun, error) {
	net := runtime.NewNetwork(1)
	aAddr, bAddr := benchAddr("alice"), benchAddr("bob")
	tr := &countingTransport{DeviceTransport: net.DeviceTransport("alice", aAddr)}
	bt := &countingTransport{DeviceTransport: net.DeviceTransport("bob", bAddr)}
	alice, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: mesh, Name: "alice", SyncInterval: -1,
		Device: &runtime.DeviceConfig{Address: aAddr, Transport: tr,
			Retry: runtime.RetryPolicy{Interval: time.Second, Backoff: 1.5, MaxInterval: 10 * time.Second, Jitter: 0.2}}})
	if err != nil {
		return heldRun{}, err
	}
	defer alice.Close()
	var bob atomic.Pointer[runtime.Node]
	var commits sync.WaitGroup
	defer commits.Wait()
	stop := make(chan struct{})
	defer close(stop)
	var failed atomic.Pointer[error]
	handed := map[messages.LogicalMessageID]bool{}
	var mu sync.Mutex
	b, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: mesh, Name: "bob", SyncInterval: -1,
		Device: &runtime.DeviceConfig{Address: bAddr, Transport: bt, Session: &runtime.SessionConfig{NoHeldReceipts: !receipts},
			Handler: func(ctx context.Context, m runtime.ReceivedMessage) {
				mu.Lock()
				again := handed[m.ID]
				handed[m.ID] = true
				mu.Unlock()
				if again {
					return // the application holds it already
				}
				commits.Add(1)
				go func() {
					defer commits.Done()
					select {
					case <-time.After(hold):
					case <-stop:
						return
					}
					if _, err := bob.Load().CommitMessage(ctx, m); err != nil && !errors.Is(err, runtime.ErrClosed) {
						failed.CompareAndSwap(nil, &err)
					}
				}()
			}}})
	if err != nil {
		return heldRun{}, err
	}
	defer b.Close()
	bob.Store(b)
	net.RegisterDevice("alice", alice)
	net.RegisterDevice("bob", b)
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := alice.Send(ctx, bAddr, make([]byte, 256)); err != nil {
			return heldRun{}, err
		}
	}
	deadline := start.Add(hold + 2*time.Minute)
	for {
		if p := failed.Load(); p != nil {
			return heldRun{}, *p
		}
		left := 0
		for _, err := range alice.PendingSent(ctx, 0, nil) {
			if err != nil {
				return heldRun{}, err
			}
			left++
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return heldRun{}, fmt.Errorf("held: %d messages still pending after %v", left, time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Bob's envelopes are one ACK per message and the held receipts.
	return heldRun{Resends: int(tr.sent.Load()) - n, Receipts: int(bt.sent.Load()) - n, Drained: time.Since(start)}, nil
}
