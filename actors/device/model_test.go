package device_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestReceiverMatchesModel drives a receiving device with random receives
// (copies, conflicting bodies, new ids) from two senders, commits,
// discards, prunes, clock moves (also backwards) and restarts, and checks
// every result and, after every step, the pending pages and counts against
// a plain model of the lifecycle table (docs/protocol.md, commit boundary). Every
// decision is the sender's peer actor's, every write the committer's.
func TestReceiverMatchesModel(t *testing.T) {
	type key struct {
		s  int
		id byte
	}
	type pend struct {
		body string
		seq  uint64
		at   int64
	}
	type proc struct {
		fin  persistence.Finalization
		at   int64
		body string
	}
	// The senders live across the checks (creating a device's identity
	// and prekeys is the expensive part); each check gets a receiver of
	// its own, under a fresh address.
	ms := newMesh(t)
	senders := []*dev{ms.add(messages.DeviceAddress{User: "alice", Device: 1}, nil), ms.add(messages.DeviceAddress{User: "carol", Device: 2}, nil)}
	checks := 0
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		limit := rapid.IntRange(0, 3).Draw(rt, "cap")
		r := ms.add(messages.DeviceAddress{User: fmt.Sprint("bob", checks), Device: 1}, func(c *device.Config) {
			c.MaxPendingPerSender = limit
			// A small prekey store: generating it is most of a check's cost.
			c.Session = func(sc *session.Config) {
				sc.RefreshInterval = -1
				sc.Prekeys = ratchet.PrekeyConfig{RotationInterval: 7 * 24 * time.Hour, GracePeriod: 30 * 24 * time.Hour,
					OneTimeBatch: 4, OneTimeThreshold: 1, MaxOneTime: 8}
			}
		})
		defer func() { _ = r.d.Close() }()
		now := func() int64 { return ms.clock.Now().UnixMilli() }
		pending := map[key]pend{}
		processed := map[key]proc{}
		var lastSeq uint64
		countOf := func(sender int) int {
			n := 0
			for k := range pending {
				if k.s == sender {
					n++
				}
			}
			return n
		}
		for step := 0; step < 30; step++ {
			k := key{rapid.IntRange(0, 1).Draw(rt, "s"), byte(rapid.IntRange(0, 3).Draw(rt, "id"))}
			from, id := senders[k.s], messages.LogicalMessageID{k.id}
			from.take() // ACKs are not the point here
			switch op := rapid.IntRange(0, 6).Draw(rt, "op"); op {
			case 0, 1: // receive
				body := rapid.SampledFrom([]string{"x", "y"}).Draw(rt, "body")
				from.sendRaw(r, id, body)
				res, err := r.recv(r.takeOne())
				if pr, ok := processed[k]; ok {
					want := device.AlreadyCommitted
					if pr.fin == persistence.FinalizationDiscarded {
						want = device.AlreadyDiscarded
					}
					if pr.body != body {
						if !errors.Is(err, inbound.ErrLogicalMessageConflict) {
							rt.Fatalf("processed conflict: %+v %v", res, err)
						}
					} else if err != nil || res.Kind != want || !res.AckSent || res.Message != nil {
						rt.Fatalf("processed copy: %+v %v", res, err)
					}
				} else if pe, ok := pending[k]; ok {
					if pe.body != body {
						if !errors.Is(err, inbound.ErrLogicalMessageConflict) {
							rt.Fatalf("pending conflict: %+v %v", res, err)
						}
					} else if err != nil || res.Kind != device.Delivery || res.AckSent || res.Message.Sequence != pe.seq || res.Message.ReceivedAt.UnixMilli() != pe.at {
						rt.Fatalf("pending copy: %+v %v (model %+v)", res, err, pe)
					}
				} else if limit > 0 && countOf(k.s) >= limit {
					if !errors.Is(err, inbound.ErrSenderBacklogFull) {
						rt.Fatalf("past the cap: %+v %v", res, err)
					}
				} else {
					if err != nil || res.Kind != device.Delivery || res.Message.Sequence <= lastSeq || string(res.Message.Plaintext) != body {
						rt.Fatalf("new: %+v %v (last seq %d)", res, err, lastSeq)
					}
					lastSeq = res.Message.Sequence
					pending[k] = pend{body: body, seq: lastSeq, at: now()}
				}
			case 2, 3: // commit or discard
				fin := persistence.FinalizationCommitted
				var c device.CommitResult
				var err error
				if op == 3 {
					fin = persistence.FinalizationDiscarded
					c, err = r.d.DiscardReceivedMessage(bg, from.addr, id, persistence.DiscardOther)
				} else {
					c, err = r.d.CommitReceivedMessage(bg, from.addr, id)
				}
				if pr, ok := processed[k]; ok {
					want := device.AlreadyCommitted
					if pr.fin == persistence.FinalizationDiscarded {
						want = device.AlreadyDiscarded
					}
					if err != nil || c.Status != want || !c.AckSent {
						rt.Fatalf("finalize of finalized: %+v %v", c, err)
					}
				} else if pe, ok := pending[k]; ok {
					want := device.Committed
					if op == 3 {
						want = device.Discarded
					}
					if err != nil || c.Status != want || !c.AckSent {
						rt.Fatalf("finalize: %+v %v", c, err)
					}
					delete(pending, k)
					processed[k] = proc{fin: fin, at: now(), body: pe.body}
				} else if !errors.Is(err, inbound.ErrReceivedMessageNotPending) {
					rt.Fatalf("finalize of unknown: %+v %v", c, err)
				}
			case 4: // prune
				age := time.Duration(rapid.IntRange(1, 5).Draw(rt, "age")) * time.Millisecond
				n, err := r.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: age})
				want := 0
				for pk, pr := range processed {
					if pr.at <= now()-int64(age/time.Millisecond) {
						delete(processed, pk)
						want++
					}
				}
				if err != nil || n != want {
					rt.Fatalf("prune %v: %d %v, want %d", age, n, err, want)
				}
			case 5: // the clock moves (also backwards)
				ms.clock.Advance(time.Duration(rapid.IntRange(-2, 4).Draw(rt, "dt")) * time.Millisecond)
			case 6: // restart
				r.restart()
			}
			// Invariants after every step: the pages are the model.
			page, err := r.d.PendingReceivedMessages(bg, 0, device.MaxPageSize, nil)
			if err != nil || len(page.Messages) != len(pending) {
				rt.Fatalf("page %d messages (%v), model %d", len(page.Messages), err, len(pending))
			}
			for i, m := range page.Messages {
				pe := pending[key{int(m.Sender.Device) - 1, m.ID[0]}]
				if m.Sequence != pe.seq || string(m.Plaintext) != pe.body || (i > 0 && m.Sequence <= page.Messages[i-1].Sequence) {
					rt.Fatalf("page entry %+v, model %+v", m, pe)
				}
			}
			for si := range senders {
				if n, err := r.d.PendingReceivedMessageCount(bg, &senders[si].addr); err != nil || n != countOf(si) {
					rt.Fatalf("count of %d = %d %v, model %d", si, n, err, countOf(si))
				}
			}
		}
	})
}
