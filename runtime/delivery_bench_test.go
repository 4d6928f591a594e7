package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// BenchmarkDeliveryPair measures committed-and-acknowledged messages/s
// between two devices on bbolt files with fsync on, through the public
// API (runtime.Open with Config.Device, Send, Handler, CommitMessage):
// 256-byte bodies; the receiver's handler commits each message as it
// arrives, up to 64 at once; a message counts once the sender's pending
// entry is cleared by the ACK.
//
//   - one-at-a-time: the next message is sent after the previous one was
//     acknowledged;
//   - inflight=64: 64 messages are sent concurrently, then the run waits
//     until all 64 are acknowledged (windows of 64: a lower bound of a
//     sliding window's rate).
//
// Run both in one process and compare (group/serial); timings are never
// asserted in tests.
func BenchmarkDeliveryPair(b *testing.B) {
	for _, inflight := range []int{1, 64} {
		name := "one-at-a-time"
		if inflight > 1 {
			name = fmt.Sprintf("inflight=%d", inflight)
		}
		b.Run(name, func(b *testing.B) { benchPair(b, inflight) })
	}
}

func benchPair(b *testing.B, inflight int) {
	ctx := context.Background()
	dir := b.TempDir()
	net := runtime.NewNetwork(1)
	aAddr, bAddr := runtime.DeviceAddress{User: "alice", Device: 1}, runtime.DeviceAddress{User: "bob", Device: 1}
	var bob *runtime.Node
	sem := make(chan struct{}, 64)
	var commits sync.WaitGroup
	open := func(name string, addr runtime.DeviceAddress, handler func(context.Context, runtime.ReceivedMessage)) *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(dir, name), MeshID: []byte("bench-mesh"), Name: name, SyncInterval: -1,
			Device: &runtime.DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Handler: handler}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = n.Close() })
		net.Register(name, n)
		net.RegisterDevice(name, n)
		return n
	}
	alice := open("alice", aAddr, nil)
	bob = open("bob", bAddr, func(_ context.Context, m runtime.ReceivedMessage) {
		sem <- struct{}{}
		commits.Add(1)
		go func() {
			defer commits.Done()
			defer func() { <-sem }()
			if _, err := bob.CommitMessage(ctx, m); err != nil {
				b.Error(err)
			}
		}()
	})
	body := make([]byte, 256)
	acked := func() {
		for {
			p, err := alice.PendingSentMessages(ctx, 0, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			if len(p.Messages) == 0 {
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	// Establish the session (bundle fetch, initiation) outside the timing.
	if _, err := alice.Send(ctx, bAddr, body); err != nil {
		b.Fatal(err)
	}
	acked()
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		k := min(inflight, b.N-sent)
		var wg sync.WaitGroup
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := alice.Send(ctx, bAddr, body); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		acked()
		sent += k
	}
	b.StopTimer()
	commits.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
