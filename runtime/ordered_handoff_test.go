package runtime

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// orderRecorder is the Network's transport with a record of the ratchet
// headers of the envelopes it was asked to queue, in that order.
type orderRecorder struct {
	OrderedDeviceTransport
	mu   sync.Mutex
	hdrs []messages.RatchetHeader
}

func (o *orderRecorder) Enqueue(peer messages.DeviceAddress, env []byte) error {
	e, err := messages.DecodeEnvelope(env)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.hdrs = append(o.hdrs, e.Header)
	o.mu.Unlock()
	return o.OrderedDeviceTransport.Enqueue(peer, env)
}

func (o *orderRecorder) take() []messages.RatchetHeader {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.hdrs
	o.hdrs = nil
	return h
}

// checkConsecutive fails unless hdrs are consecutive messages of one chain.
func checkConsecutive(t *testing.T, what string, hdrs []messages.RatchetHeader, n int) {
	t.Helper()
	if len(hdrs) != n {
		t.Fatalf("%s: %d envelopes queued, want %d", what, len(hdrs), n)
	}
	for i, h := range hdrs {
		if h.DH != hdrs[0].DH || h.N != hdrs[0].N+uint32(i) {
			t.Fatalf("%s: envelope %d queued is message %d (same chain: %v), want %d", what, i, h.N, h.DH == hdrs[0].DH, hdrs[0].N+uint32(i))
		}
	}
}

// The Network's device transport is an ordered hand-off: a node hands a
// peer's envelopes to it from the device's committer in chain order —
// concurrent sends, and the ACKs of concurrent commits — so the receiver
// decrypts each on its current chain. Nothing here waits for a receiver:
// every send returns before its envelope is delivered.
func TestNetworkGetsOnePeersEnvelopesInChainOrder(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	at, ok := net.DeviceTransport("alice", aAddr).(OrderedDeviceTransport)
	if !ok {
		t.Fatal("the Network's device transport is not an OrderedDeviceTransport")
	}
	bt := net.DeviceTransport("bob", bAddr).(OrderedDeviceTransport)
	ar, br := &orderRecorder{OrderedDeviceTransport: at}, &orderRecorder{OrderedDeviceTransport: bt}
	const n = 64
	alice := openTestNode(t, Config{Name: "alice", SyncInterval: -1, Device: &DeviceConfig{Address: aAddr, Transport: ar}})
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr, Transport: br, Buffer: 2 * n}})
	for _, nd := range []*testNode{alice, bob} {
		net.RegisterDevice(nd.Name(), nd.Node)
	}
	next := func() ReceivedMessage {
		t.Helper()
		select {
		case m := <-bob.Messages():
			return m
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery")
		}
		return ReceivedMessage{}
	}
	// The session, established by one message and its ACK.
	if _, err := alice.Send(ctx, bAddr, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if res, err := bob.CommitMessage(ctx, next()); err != nil || !res.AckSent {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ar.take()
	br.take()

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := alice.Send(ctx, bAddr, []byte("m")); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	checkConsecutive(t, "alice's messages", ar.take(), n)
	ms := make([]ReceivedMessage, n)
	for i := range ms {
		ms[i] = next()
	}
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := bob.CommitMessage(ctx, m)
			if err == nil && !res.AckSent {
				err = fmt.Errorf("commit of %s: ACK not handed over", m.ID)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkConsecutive(t, "bob's ACKs", br.take(), n)
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if p, err := alice.PendingSentMessages(ctx, 0, 10, nil); err != nil || len(p.Messages) != 0 {
		t.Fatalf("after the ACKs alice still has %d pending sent (%v)", len(p.Messages), err)
	}
}
