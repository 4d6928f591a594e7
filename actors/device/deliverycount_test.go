package device_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
)

// TestDeliveryCountPersistsAcrossRetriesAndRestarts: on both stores, each
// hand-off of a pending message to the Handler carries the persisted
// count: 1 on receipt, 2 on the sender's retry (counted in the receive's
// transaction), 3 and 4 on the redeliveries of the next two Opens; the
// stored pending entry says the same, and a commit ends it.
func TestDeliveryCountPersistsAcrossRetriesAndRestarts(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			ms := newMesh(t)
			a := ms.add(aliceAddr, nil)
			b, h := bobCountingDeliveries(ms, store)
			seen := func(n int) string {
				t.Helper()
				waitFor(t, func() bool { return h.count() == n }, fmt.Sprintf("%d hand-offs", n))
				return h.String()
			}
			stored := func() int {
				t.Helper()
				p := b.pendingAll()
				if len(p) != 1 {
					t.Fatalf("%d pending, want 1", len(p))
				}
				return p[0].Deliveries
			}
			sm := a.send(b, "one")
			if r := b.pump(); len(r) != 1 || r[0].Message == nil || r[0].Message.Deliveries != 1 {
				t.Fatalf("receive: %+v", r)
			}
			if s := seen(1); s != "[1]" || stored() != 1 {
				t.Fatalf("after receipt: handed %s, stored %d", s, stored())
			}
			// Past RedeliverAfter: the copy is handed again.
			ms.clock.Advance(device.DefaultRedeliverAfter)
			a.resend(b, sm.ID)
			b.pump()
			if s := seen(2); s != "[1 2]" || stored() != 2 {
				t.Fatalf("after the sender's retry: handed %s, stored %d", s, stored())
			}
			b.restart()
			if s := seen(3); s != "[1 2 3]" || stored() != 3 {
				t.Fatalf("after a restart: handed %s, stored %d", s, stored())
			}
			b.restart()
			if s := seen(4); s != "[1 2 3 4]" || stored() != 4 {
				t.Fatalf("after a second restart: handed %s, stored %d", s, stored())
			}
			if r := b.commit(a, sm.ID); r.Status != device.Committed {
				t.Fatalf("commit: %+v", r)
			}
			if n := b.pendingCount(); n != 0 {
				t.Fatalf("%d pending after the commit", n)
			}
		})
	}
}

// A message received while the redelivery pass of Open has not read the
// store yet is counted once, by its receive, and handed once with that
// count: the pass covers only what was pending before Open's receives
// began (it used to page the new message too, count a second hand-off and
// hand it with Deliveries 2).
func TestReceiveDuringOpenRedeliveryIsCountedOnce(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(release) }) }
			restore := device.SetBeforeRedelivery(func() { <-release })
			defer restore()
			defer open()
			ms := newMesh(t)
			a := ms.add(aliceAddr, nil)
			b, h := bobCountingDeliveries(ms, store)
			a.send(b, "one")
			if r := b.pump(); len(r) != 1 || r[0].Message == nil || r[0].Message.Deliveries != 1 {
				t.Fatalf("receive: %+v", r)
			}
			open() // the pass reads the store now, the message in it
			waitFor(t, func() bool { return h.count() >= 1 }, "a hand-off")
			if p := b.pendingAll(); h.String() != "[1]" || len(p) != 1 || p[0].Deliveries != 1 {
				t.Fatalf("handed %s, stored %+v; want [1] and 1", h, p)
			}
		})
	}
}

// handed records the delivery count of every hand-off to bob's handler.
type handed struct {
	mu  sync.Mutex
	got []int
}

func (h *handed) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.got) }

func (h *handed) String() string { h.mu.Lock(); defer h.mu.Unlock(); return fmt.Sprint(h.got) }

// bobCountingDeliveries adds bob on store ("memory" or "bolt") with a
// handler that records each hand-off's delivery count.
func bobCountingDeliveries(ms *mesh, store string) (*dev, *handed) {
	h := &handed{}
	tweak := func(c *device.Config) {
		c.Handler = func(_ context.Context, m device.ReceivedMessage) {
			h.mu.Lock()
			h.got = append(h.got, m.Deliveries)
			h.mu.Unlock()
		}
	}
	if store == "bolt" {
		return ms.addBolt(bobAddr, tweak), h
	}
	return ms.add(bobAddr, tweak), h
}
