package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// heldCounter sums the samples of the counter family name in reg whose
// labels include want.
func heldCounter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	sample:
		for _, m := range mf.GetMetric() {
			for k, w := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == w {
						found = true
					}
				}
				if !found {
					continue sample
				}
			}
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

// TestSlowCommitReceiverIsNotResentOnTheShortSchedule: a receiver whose
// application holds a message for 3 s before committing answers the
// sender's first copy with a held receipt, and the sender stops resending
// on its short schedule (100 ms ×1.5, cap 400 ms: about nine copies in
// 3 s otherwise) until the ACK clears the message.
func TestSlowCommitReceiverIsNotResentOnTheShortSchedule(t *testing.T) {
	const hold = 3 * time.Second
	ctx := context.Background()
	net := NewNetwork(11)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	aReg, bReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	alice, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "alice", SyncInterval: -1, Registerer: aReg,
		Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr),
			Retry: RetryPolicy{Interval: 100 * time.Millisecond, Backoff: 1.5, MaxInterval: 400 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alice.Close() })
	bob, err := Open(ctx, Config{InMemory: true, MeshID: testMesh, Name: "bob", SyncInterval: -1, Registerer: bReg,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bob.Close() })
	for _, n := range []*Node{alice, bob} {
		net.RegisterDevice(n.Name(), n)
	}
	sent, err := alice.Send(ctx, bAddr, []byte("slow"))
	if err != nil {
		t.Fatal(err)
	}
	var m ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	time.Sleep(hold) // the application has not committed yet
	pendingSent := func() (n, attempts int) {
		t.Helper()
		for p, err := range alice.PendingSent(ctx, 0, &bAddr) {
			if err != nil {
				t.Fatal(err)
			}
			n++
			if p.ID == sent.ID {
				attempts = p.Attempts
			}
		}
		return n, attempts
	}
	_, attempts := pendingSent()
	t.Logf("resends of the held message in %v before the commit: %d", hold, attempts-1)
	if resends := attempts - 1; resends < 0 || resends > 2 {
		t.Fatalf("the sender resent the held message %d times in %v before the commit, want at most 2", resends, hold)
	}
	if n := heldCounter(t, bReg, "syncmesh_delivery_held_receipts_sent_total", nil); n < 1 {
		t.Fatalf("receiver sent %v held receipts, want at least 1", n)
	}
	if n := heldCounter(t, aReg, "syncmesh_delivery_held_receipts_total", map[string]string{"verdict": "held"}); n < 1 {
		t.Fatalf("sender counted %v held receipts with verdict held, want at least 1", n)
	}
	// Still pending at the sender: a held receipt is never an ACK.
	if c, _ := pendingSent(); c != 1 {
		t.Fatalf("sender has %d pending before the commit, want 1", c)
	}
	if res, err := bob.CommitMessage(ctx, m); err != nil || res.Status != Committed {
		t.Fatalf("commit: %+v %v", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, _ := pendingSent(); c == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ACK did not clear the held message")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
