package device_test

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
)

// TestNoHandOffAfterFinalizationThroughMessages: with Messages, a message
// can sit in the channel longer than RedeliverAfter; a sender's copy
// arriving then is not put in the channel beside it, so once the
// application took the message and its commit or discard returned, the
// channel never hands it again (the next message is the next hand-off).
// On both stores, with envelopes received by Receive and by ReceiveAsync.
func TestNoHandOffAfterFinalizationThroughMessages(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		for _, finalize := range []string{"commit", "discard"} {
			for _, async := range []bool{false, true} {
				name := store + "/" + finalize
				if async {
					name += "/async"
				}
				t.Run(name, func(t *testing.T) { noHandOffAfterFinalizationThroughMessages(t, store, finalize, async) })
			}
		}
	}
}

// pumpAsync receives every envelope queued for v by ReceiveAsync and
// waits for each answer.
func (v *dev) pumpAsync() []device.ReceiveResult {
	v.ms.tb.Helper()
	var out []device.ReceiveResult
	for _, e := range v.take() {
		done := make(chan device.ReceiveResult, 1)
		if err := v.d.ReceiveAsync(bg, e.From, e.Envelope, func(r device.ReceiveResult, err error) {
			if err != nil {
				v.ms.tb.Errorf("%s ReceiveAsync from %s: %v", v.addr, e.From, err)
			}
			done <- r
		}); err != nil {
			v.ms.tb.Fatalf("%s ReceiveAsync from %s: %v", v.addr, e.From, err)
		}
		out = append(out, <-done)
	}
	return out
}

func noHandOffAfterFinalizationThroughMessages(t *testing.T, store, finalize string, async bool) {
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
	pump := b.pump
	if async {
		pump = b.pumpAsync
	}
	sm := a.send(b, "one")
	pump()
	waitFor(t, func() bool { return len(feed) == 1 }, "one in the channel")
	ms.clock.Advance(time.Minute)
	a.resend(b, sm.ID)
	if r := pump(); len(r) != 1 || r[0].Kind != device.Delivery {
		t.Fatalf("copy: %+v", r)
	}
	a.send(b, "two")
	pump()
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
	pump()
	a.send(b, "three")
	pump()
	if next := <-feed; string(next.Plaintext) != "three" {
		t.Fatalf("after the %s the application was handed %q", finalize, next.Plaintext)
	}
}

// TestMessagesRedeliverAfterCountsFromTake: a copy arriving while the
// message waits in the channel, and one arriving right after the
// application took it (however long it waited), are not handed; one
// arriving RedeliverAfter after the take is (at-least-once until the
// commit).
func TestMessagesRedeliverAfterCountsFromTake(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Buffer = 4 })
	feed := b.d.Messages()
	sm := a.send(b, "one")
	b.pump()
	waitFor(t, func() bool { return len(feed) == 1 }, "one in the channel")
	ms.clock.Advance(time.Minute)
	a.resend(b, sm.ID)
	b.pump()
	if m := <-feed; string(m.Plaintext) != "one" {
		t.Fatalf("first hand-off %q", m.Plaintext)
	}
	a.resend(b, sm.ID)
	b.pump()
	a.send(b, "two")
	b.pump()
	if m := <-feed; string(m.Plaintext) != "two" {
		t.Fatalf("handed %q (Deliveries %d): a copy was handed again although the application took the message just now", m.Plaintext, m.Deliveries)
	}
	ms.clock.Advance(time.Minute)
	a.resend(b, sm.ID)
	b.pump()
	if m := <-feed; string(m.Plaintext) != "one" {
		t.Fatalf("handed %q, want the copy of one after RedeliverAfter", m.Plaintext)
	}
}

// TestMessagesNeverAfterCommitModel: random sends, sender retries, clock
// moves and takes from a small Messages channel; the application commits
// or discards what it takes before it takes the next. No message is ever
// received again after its finalization returned, and every message is
// received (and finalized) in the end.
func TestMessagesNeverAfterCommitModel(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	checks := 0
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		buffer := rapid.IntRange(1, 3).Draw(rt, "buffer")
		b := ms.add(messages.DeviceAddress{User: fmt.Sprint("bob", checks), Device: 1}, func(c *device.Config) {
			c.Buffer = buffer
			c.Session = func(sc *session.Config) {
				sc.RefreshInterval = -1
				sc.Prekeys = ratchet.PrekeyConfig{RotationInterval: 7 * 24 * time.Hour, GracePeriod: 30 * 24 * time.Hour,
					OneTimeBatch: 4, OneTimeThreshold: 1, MaxOneTime: 8}
			}
		})
		defer func() { _ = b.d.Close() }()
		feed := b.d.Messages()
		var sent []messages.LogicalMessageID
		finalized := map[messages.LogicalMessageID]bool{}
		take := func(m device.ReceivedMessage) {
			if finalized[m.ID] {
				rt.Fatalf("%q received again (Deliveries %d) after its finalization returned", m.Plaintext, m.Deliveries)
			}
			var err error
			if rapid.Bool().Draw(rt, "commit") {
				_, err = b.d.CommitReceivedMessage(bg, aliceAddr, m.ID)
			} else {
				_, err = b.d.DiscardReceivedMessage(bg, aliceAddr, m.ID, device.DiscardReason(1))
			}
			if err != nil {
				rt.Fatalf("finalize %q: %v", m.Plaintext, err)
			}
			finalized[m.ID] = true
		}
		steps := rapid.IntRange(1, 30).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0:
				sent = append(sent, a.send(b, fmt.Sprint("m", len(sent))).ID)
				b.pump()
			case 1:
				if len(sent) > 0 {
					a.resend(b, sent[rapid.IntRange(0, len(sent)-1).Draw(rt, "which")])
					b.pump()
				}
			case 2:
				ms.clock.Advance(time.Duration(rapid.IntRange(0, 60).Draw(rt, "seconds")) * time.Second)
			case 3:
				select {
				case m := <-feed:
					take(m)
				default:
				}
			}
		}
		// Every message sent reaches the application: its first receive
		// was queued, and nothing else keeps it out of the channel.
		for len(finalized) < len(sent) {
			select {
			case m := <-feed:
				take(m)
			case <-time.After(30 * time.Second):
				rt.Fatalf("%d of %d messages finalized; the rest never reached the channel", len(finalized), len(sent))
			}
		}
		// Copies of finalized messages, now and after RedeliverAfter, are
		// not handed.
		ms.clock.Advance(time.Minute)
		for _, id := range sent {
			a.resend(b, id)
		}
		b.pump()
		last := a.send(b, "last")
		b.pump()
		if m := <-feed; m.ID != last.ID {
			rt.Fatalf("%q received again (Deliveries %d) after its finalization returned", m.Plaintext, m.Deliveries)
		}
	})
}
