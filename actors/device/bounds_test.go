package device_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/messages"
)

// TestAttackRedeliveriesHoldOneQueuedCopy: the
// application does not read while the sender retries one pending 256 KiB
// message 200 times. Every retry is a Delivery of the same pending message
// (same sequence); the delivery queue holds it once, not 200 times, so
// what the application sees before the next message is the first
// delivery, the one the dispatcher holds, and at most one queued copy.
func TestAttackRedeliveriesHoldOneQueuedCopy(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Buffer = 1 })
	big := bytes.Repeat([]byte{7}, 256<<10)
	sm, err := a.d.Send(bg, b.addr, big)
	if err != nil {
		t.Fatal(err)
	}
	if r := b.pump(); len(r) != 1 || r[0].Kind != device.Delivery {
		t.Fatalf("first delivery: %+v", r)
	}
	for i := 0; i < 200; i++ {
		a.resend(b, sm.ID)
		if r := b.pump(); len(r) != 1 || r[0].Kind != device.Delivery || r[0].Message.Sequence != 1 {
			t.Fatalf("redelivery %d: %+v", i, r)
		}
	}
	a.send(b, "next")
	b.pump()
	copies := 0
	for m := range b.d.Messages() {
		if string(m.Plaintext) == "next" {
			break
		}
		if m.ID != sm.ID {
			t.Fatalf("unexpected delivery %s", m.ID)
		}
		copies++
	}
	if copies < 1 || copies > 3 {
		t.Fatalf("the application got %d copies of the retried message before the next one, want 1..3 (one queued copy)", copies)
	}
}

// TestDeliveryQueuePastItsBoundPagesFromTheStore: with
// a queue bound of 4 and an application that reads only after 20 new
// messages arrived, the queue never holds more than 4 and the application
// still gets every message, in sequence order, paged from the store.
func TestDeliveryQueuePastItsBoundPagesFromTheStore(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Buffer = 1; c.MaxQueued = 4 })
	for i := 0; i < 20; i++ {
		a.send(b, fmt.Sprint(i))
	}
	b.pump()
	if q := b.d.Queued(); q > 4 {
		t.Fatalf("delivery queue holds %d, bound 4", q)
	}
	seen := map[string]bool{}
	var last uint64
	for m := range b.d.Messages() {
		if m.Sequence < last {
			t.Fatalf("sequence %d after %d", m.Sequence, last)
		}
		last = m.Sequence
		seen[string(m.Plaintext)] = true
		if len(seen) == 20 {
			break
		}
	}
}

// TestGlobalPendingCapBoundsManySenders: 30 new
// addresses with a per-sender cap of 10 would make 300 pending messages;
// the global cap (MaxPending 100) holds them at 100, refusing the rest
// with ErrBacklogFull before their ratchet step, and a commit makes room.
func TestGlobalPendingCapBoundsManySenders(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, func(c *device.Config) { c.MaxPendingPerSender = 10; c.MaxPending = 100 })
	var senders []*dev
	for i := 0; i < 30; i++ {
		senders = append(senders, ms.add(messages.DeviceAddress{User: fmt.Sprintf("s%02d", i), Device: 1}, nil))
	}
	refused := 0
	for _, s := range senders {
		for j := 0; j < 11; j++ {
			s.send(b, fmt.Sprint(j))
		}
		for _, e := range b.take() {
			if _, err := b.recv(e); err != nil {
				if !errors.Is(err, inbound.ErrSenderBacklogFull) && !errors.Is(err, inbound.ErrBacklogFull) {
					t.Fatalf("receive from %s: %v", e.From, err)
				}
				refused++
			}
		}
	}
	if n := b.pendingCount(); n != 100 {
		t.Fatalf("%d pending, want the global cap 100", n)
	}
	if refused != 330-100 {
		t.Fatalf("%d refused, want 230", refused)
	}
}
