package device_test

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
)

// TestNoHandOffAfterFinalizationThroughMessages: with Messages, a message
// can sit in the channel longer than RedeliverAfter; a sender's copy
// arriving then is not put in the channel beside it, so once the
// application took the message and its commit or discard returned, the
// channel never hands it again (the next message is the next hand-off).
// On both stores.
func TestNoHandOffAfterFinalizationThroughMessages(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		for _, finalize := range []string{"commit", "discard"} {
			t.Run(store+"/"+finalize, func(t *testing.T) {
				ms := newMesh(t)
				a := ms.add(aliceAddr, nil)
				tweak := func(c *device.Config) { c.Buffer = 16 }
				var b *dev
				if store == "bolt" {
					b = ms.addBolt(bobAddr, tweak)
				} else {
					b = ms.add(bobAddr, tweak)
				}
				feed := b.d.Messages()
				sm := a.send(b, "one")
				b.pump()
				waitFor(t, func() bool { return len(feed) == 1 }, "one in the channel")
				ms.clock.Advance(time.Minute)
				a.resend(b, sm.ID)
				if r := b.pump(); len(r) != 1 || r[0].Kind != device.Delivery {
					t.Fatalf("copy: %+v", r)
				}
				a.send(b, "two")
				b.pump()
				waitFor(t, func() bool { return len(feed) >= 2 }, "two in the channel")
				first := <-feed
				var r device.CommitResult
				var err error
				if finalize == "commit" {
					r, err = b.d.CommitReceivedMessage(bg, aliceAddr, first.ID)
				} else {
					r, err = b.d.DiscardReceivedMessage(bg, aliceAddr, first.ID, device.DiscardReason(1))
				}
				if err != nil || (r.Status != device.Committed && r.Status != device.Discarded) {
					t.Fatalf("%s: %+v %v", finalize, r, err)
				}
				if next := <-feed; string(next.Plaintext) != "two" {
					t.Fatalf("after the %s of %q returned %v the application was handed %q (Deliveries %d)", finalize, first.Plaintext, r.Status, next.Plaintext, next.Deliveries)
				}
				// A later copy of the finalized message is not handed either.
				ms.clock.Advance(time.Minute)
				a.resend(b, sm.ID)
				b.pump()
				a.send(b, "three")
				b.pump()
				if next := <-feed; string(next.Plaintext) != "three" {
					t.Fatalf("after the %s the application was handed %q", finalize, next.Plaintext)
				}
			})
		}
	}
}
