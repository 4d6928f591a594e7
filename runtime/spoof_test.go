package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
)

// TestAttackSpoofedAddressesLeaveBoundedState: 20 000
// envelopes, each under a different spoofed From, reach bob. None
// authenticates, so nothing of them may stay: once they are delivered,
// the network keeps no per-(from, to) link and bob no peer actor for any
// of them (idle link state is evicted; an address bob holds no pin or
// session for keeps no actor).
func TestAttackSpoofedAddressesLeaveBoundedState(t *testing.T) {
	const spoofed = 20000
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	net := NewNetwork(1)
	// Idle peer actors passivate only after an hour here: what goes away
	// goes away because it holds nothing, not because time passed.
	_, bob := twoDevices(t, net, func(c *DeviceConfig) {
		c.Session = &SessionConfig{IdleTimeout: time.Hour}
	})
	for i := 0; i < spoofed; i++ {
		from := DeviceAddress{User: fmt.Sprintf("spoof%05d", i), Device: 1}
		if err := net.DeviceTransport("mallory", from).Send(ctx, bob.DeviceAddress(), []byte{0x82, 0x01, 0x02}); err != nil {
			t.Fatal(err)
		}
	}
	if err := net.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Delivered: the drainers and the peer actors finish on their own
	// goroutines; wait for them to let go (no fixed sleep).
	links, live := -1, -1
	for ctx.Err() == nil {
		net.mu.Lock()
		links = len(net.links)
		net.mu.Unlock()
		live = bob.device.Sessions().LiveSessions()
		if links == 0 && live == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if links != 0 || live != 0 {
		t.Fatalf("after %d spoofed addresses: %d links and %d peer actors kept", spoofed, links, live)
	}
	if n, err := bob.PendingReceivedMessageCount(ctx, nil); err != nil || n != 0 {
		t.Fatalf("%d pending (%v)", n, err)
	}
}

// TestUndecryptableEnvelopesRaiseANoticeAndAMetric:
// an envelope bob cannot decrypt is not silent: a notice names the
// authenticated sender and the reason, and the reason-labelled counter
// moves.
func TestUndecryptableEnvelopesRaiseANoticeAndAMetric(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	net := NewNetwork(1)
	alice, bob := twoDevices(t, net, nil)
	got := make(chan messages.UndecryptableEnvelope, 4)
	stop := bob.Subscribe(func(n messages.Notice) {
		if u, ok := n.(messages.UndecryptableEnvelope); ok {
			got <- u
		}
	})
	defer stop()
	if err := net.DeviceTransport("alice", alice.DeviceAddress()).Send(ctx, bob.DeviceAddress(), []byte{0x82, 0x01, 0x02}); err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-got:
		if u.From != alice.DeviceAddress() || u.Reason != session.ReasonMalformed || u.Err == "" {
			t.Fatalf("notice %+v", u)
		}
	case <-ctx.Done():
		t.Fatal("no notice for an undecryptable envelope")
	}
	mfs, err := bob.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_delivery_undecryptable_envelopes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == session.ReasonMalformed && m.GetCounter().GetValue() >= 1 {
				found = true
			}
		}
	}
	if !found {
		t.Fatal("syncmesh_delivery_undecryptable_envelopes_total{reason=\"malformed\"} not counted")
	}
}
