package device_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
)

// handOffs records what the application was handed, in order; the first
// hand-off waits for release (an application busy with it).
type handOffs struct {
	mu      sync.Mutex
	got     []string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHandOffs(block bool) *handOffs {
	h := &handOffs{entered: make(chan struct{}), release: make(chan struct{})}
	if !block {
		close(h.release)
	}
	return h
}

func (h *handOffs) handler(_ context.Context, m device.ReceivedMessage) {
	h.mu.Lock()
	h.got = append(h.got, string(m.Plaintext))
	h.mu.Unlock()
	h.once.Do(func() { close(h.entered) })
	<-h.release
}

func (h *handOffs) list() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprint(h.got)
}

func (h *handOffs) waitLast(t *testing.T, body string) string {
	t.Helper()
	waitFor(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.got) > 0 && h.got[len(h.got)-1] == body
	}, "the hand-off of "+body)
	return h.list()
}

// TestNoHandOffAfterFinalization: a sender's copy of a pending message is
// queued while the application is busy with that message; the application
// commits it (COMMITTED), and the queued copy is removed: once the commit
// returned, the message is never handed over again (the next message is
// the next hand-off). The copy comes after RedeliverAfter, so it is queued.
func TestNoHandOffAfterFinalization(t *testing.T) {
	for _, finalize := range []string{"commit", "discard"} {
		t.Run(finalize, func(t *testing.T) {
			ms := newMesh(t)
			a := ms.add(aliceAddr, nil)
			h := newHandOffs(true)
			b := ms.add(bobAddr, func(c *device.Config) { c.Handler = h.handler })
			sm := a.send(b, "one")
			b.pump()
			<-h.entered
			ms.clock.Advance(time.Minute)
			a.resend(b, sm.ID)
			if r := b.pump(); len(r) != 1 || r[0].Kind != device.Delivery {
				t.Fatalf("copy: %+v", r)
			}
			a.send(b, "two")
			b.pump()
			var err error
			var r device.CommitResult
			if finalize == "commit" {
				r, err = b.d.CommitReceivedMessage(bg, aliceAddr, sm.ID)
			} else {
				r, err = b.d.DiscardReceivedMessage(bg, aliceAddr, sm.ID, device.DiscardReason(1))
			}
			if err != nil || (r.Status != device.Committed && r.Status != device.Discarded) {
				t.Fatalf("%s: %+v %v", finalize, r, err)
			}
			close(h.release)
			if got := h.waitLast(t, "two"); got != "[one two]" {
				t.Fatalf("handed %s: the message was handed again after its %s returned", got, finalize)
			}
		})
	}
}

// TestCopyOfAHandedMessageIsNotHandedAgainSoon: a sender's retry of a
// message the application holds (handed over, not finalized) is received
// (its count goes up) but not handed again within RedeliverAfter; a copy
// after it is (at-least-once until the commit).
func TestCopyOfAHandedMessageIsNotHandedAgainSoon(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	h := newHandOffs(false)
	b := ms.add(bobAddr, func(c *device.Config) { c.Handler = h.handler })
	sm := a.send(b, "one")
	b.pump()
	h.waitLast(t, "one")
	for i := 0; i < 3; i++ {
		a.resend(b, sm.ID)
		if r := b.pump(); len(r) != 1 || r[0].Kind != device.Delivery {
			t.Fatalf("copy %d: %+v", i, r)
		}
	}
	a.send(b, "two")
	b.pump()
	if got := h.waitLast(t, "two"); got != "[one two]" {
		t.Fatalf("handed %s: copies of a message the application holds were handed again at once", got)
	}
	ms.clock.Advance(time.Minute)
	a.resend(b, sm.ID)
	b.pump()
	if got := h.waitLast(t, "one"); got != "[one two one]" {
		t.Fatalf("handed %s after RedeliverAfter", got)
	}
}
