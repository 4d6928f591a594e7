package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// silentHostTransport is alice's transport with one recipient whose host
// accepts connections and never answers: its bundle request waits until
// the caller gives up.
type silentHostTransport struct {
	OrderedDeviceTransport
	silent  DeviceAddress
	blocked atomic.Int32 // bundle requests to the silent host waiting now
	tries   atomic.Int32
}

func (s *silentHostTransport) FetchBundle(ctx context.Context, peer DeviceAddress) (*messages.PrekeyBundle, error) {
	if peer != s.silent {
		return s.OrderedDeviceTransport.FetchBundle(ctx, peer)
	}
	s.tries.Add(1)
	s.blocked.Add(1)
	defer s.blocked.Add(-1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestSilentHostCostsOtherRecipientsNothing: alice holds three messages
// pending to a silent host (sent first) and one to bob that was not
// handed over (bob was not reachable yet). Her retry schedule delivers
// bob's message while a resend to the silent host is still blocked in
// its bundle request: one recipient's stall does not hold the others.
func TestSilentHostCostsOtherRecipientsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	net := NewNetwork(5)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	tr := &silentHostTransport{OrderedDeviceTransport: net.DeviceTransport("alice", aAddr).(OrderedDeviceTransport), silent: DeviceAddress{User: "silent", Device: 1}}
	alice, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "alice", SyncInterval: -1,
		Device: &DeviceConfig{Address: aAddr, Transport: tr, Retry: RetryPolicy{Interval: 100 * time.Millisecond, Backoff: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Close() })
	got := &committedSet{ids: map[MessageID]bool{}}
	var bob *Node
	bob, err = Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "bob", SyncInterval: -1,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Handler: got.handler(func() *Node { return bob })}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { got.wg.Wait(); _ = bob.Close() })
	net.RegisterDevice("alice", alice)
	for i := 0; i < 3; i++ {
		sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := alice.Send(sctx, tr.silent, []byte("to the silent host"))
		scancel()
		// The bundle request gave up: the message is stored pending
		// (the caller may have given up first).
		if !errors.Is(err, ErrNotHandedOff) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send to the silent host: %v", err)
		}
	}
	for {
		n := 0
		for _, err := range alice.PendingSent(ctx, 0, &tr.silent) {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n == 3 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d messages pending to the silent host, want 3", n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := alice.Send(ctx, bAddr, []byte("to bob")); !errors.Is(err, ErrNotHandedOff) {
		t.Fatalf("send to bob before he is reachable: %v", err)
	}
	// The stall first: a scheduled resend to the silent host is blocked
	// in its bundle request (for up to outbound.TryTimeout) before bob
	// becomes reachable, however late the schedule's goroutines run.
	for tr.blocked.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("no resend to the silent host blocked (%d tries)", tr.tries.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	net.RegisterDevice("bob", bob)
	for got.count() == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("bob's message never committed (silent host: %d tries, %d blocked)", tr.tries.Load(), tr.blocked.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if tr.blocked.Load() == 0 {
		t.Fatalf("bob's message was delivered, but no resend to the silent host was blocked then (%d tries): the test did not exercise a stall", tr.tries.Load())
	}
}
