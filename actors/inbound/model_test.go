package inbound

import (
	"errors"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// TestStoreMatchesModel drives the inbound store actor with random
// receives, commits, discards, prunes, clock moves, restarts and pages,
// and checks every result against a plain model of the lifecycle table.
func TestStoreMatchesModel(t *testing.T) {
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
	senders := []messages.DeviceAddress{{User: "a", Device: 1}, {User: "b", Device: 2}}
	sys := actortest.System(t)
	rapid.Check(t, func(rt *rapid.T) {
		var mu sync.Mutex
		now := int64(1000)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.UnixMilli(now) }
		ms := memory.NewDelivery()
		cap := rapid.IntRange(0, 3).Draw(rt, "cap")
		open := func() *Store {
			s, err := New(sys, Config{Store: ms, Now: clock, MaxPendingPerSender: cap})
			if err != nil {
				rt.Fatal(err)
			}
			return s
		}
		s := open()
		defer func() { _ = s.Close() }()
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
		for step := 0; step < 40; step++ {
			k := key{rapid.IntRange(0, 1).Draw(rt, "s"), byte(rapid.IntRange(0, 3).Draw(rt, "id"))}
			from, id := senders[k.s], messages.LogicalMessageID{k.id}
			switch op := rapid.IntRange(0, 6).Draw(rt, "op"); op {
			case 0, 1: // receive
				body := rapid.SampledFrom([]string{"x", "y"}).Draw(rt, "body")
				p, f := appPayload(id, body)
				r, err := s.Receive(bg, from, p, f, nil)
				if pr, ok := processed[k]; ok {
					want := OutcomeAlreadyCommitted
					if pr.fin == persistence.FinalizationDiscarded {
						want = OutcomeAlreadyDiscarded
					}
					if pr.body != body {
						if !errors.Is(err, ErrLogicalMessageConflict) {
							rt.Fatalf("processed conflict: %+v %v", r, err)
						}
					} else if err != nil || r.Outcome != want || !r.AckDue || r.Message != nil {
						rt.Fatalf("processed copy: %+v %v", r, err)
					}
				} else if pe, ok := pending[k]; ok {
					if pe.body != body {
						if !errors.Is(err, ErrLogicalMessageConflict) {
							rt.Fatalf("pending conflict: %+v %v", r, err)
						}
					} else if err != nil || r.Outcome != OutcomeDelivery || r.New || r.AckDue || r.Message.Sequence != pe.seq || r.Message.ReceivedAt.UnixMilli() != pe.at {
						rt.Fatalf("pending copy: %+v %v (model %+v)", r, err, pe)
					}
				} else if cap > 0 && countOf(k.s) >= cap {
					if !errors.Is(err, ErrSenderBacklogFull) {
						rt.Fatalf("past the cap: %+v %v", r, err)
					}
				} else {
					if err != nil || r.Outcome != OutcomeDelivery || !r.New || r.Message.Sequence <= lastSeq || string(r.Message.Plaintext) != body {
						rt.Fatalf("new: %+v %v (last seq %d)", r, err, lastSeq)
					}
					lastSeq = r.Message.Sequence
					pending[k] = pend{body: body, seq: lastSeq, at: now}
				}
			case 2, 3: // commit or discard
				fin := persistence.FinalizationCommitted
				var r FinalizeResult
				var err error
				if op == 3 {
					fin = persistence.FinalizationDiscarded
					r, err = s.Discard(bg, from, id, persistence.DiscardOther)
				} else {
					r, err = s.Commit(bg, from, id)
				}
				if pr, ok := processed[k]; ok {
					want := OutcomeAlreadyCommitted
					if pr.fin == persistence.FinalizationDiscarded {
						want = OutcomeAlreadyDiscarded
					}
					if err != nil || r.Outcome != want || !r.AckDue {
						rt.Fatalf("finalize of finalized: %+v %v", r, err)
					}
				} else if pe, ok := pending[k]; ok {
					want := OutcomeCommitted
					if op == 3 {
						want = OutcomeDiscarded
					}
					if err != nil || r.Outcome != want || !r.AckDue {
						rt.Fatalf("finalize: %+v %v", r, err)
					}
					delete(pending, k)
					processed[k] = proc{fin: fin, at: now, body: pe.body}
				} else if !errors.Is(err, ErrReceivedMessageNotPending) {
					rt.Fatalf("finalize of unknown: %+v %v", r, err)
				}
			case 4: // prune
				age := time.Duration(rapid.IntRange(1, 5).Draw(rt, "age")) * time.Millisecond
				n, err := s.Prune(bg, RetentionPolicy{MaxAge: age})
				want := 0
				for pk, pr := range processed {
					if pr.at <= now-int64(age/time.Millisecond) {
						delete(processed, pk)
						want++
					}
				}
				if err != nil || n != want {
					rt.Fatalf("prune %v: %d %v, want %d", age, n, err, want)
				}
			case 5: // the clock moves (also backwards)
				mu.Lock()
				now += int64(rapid.IntRange(-2, 4).Draw(rt, "dt"))
				mu.Unlock()
			case 6: // restart
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				ms = ms.Reopen()
				s = open()
			}
			// Invariants after every step: the pages are the model.
			page, err := s.Pending(bg, 0, MaxPageSize, nil)
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
				if n, err := s.PendingCount(bg, &senders[si]); err != nil || n != countOf(si) {
					rt.Fatalf("count of %d = %d %v, model %d", si, n, err, countOf(si))
				}
			}
		}
	})
}
