package device_test

import (
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
)

// Concurrency (docs/protocol.md, commit boundary, "Transactions": the receive and
// commit steps are serialized, here by the sender's peer actor's mailbox). Run
// with -race; each test repeats its race many times.

const raceIterations = 25

// Concurrent duplicate receives converge on one pending row.
func TestConcurrentDuplicateReceivesConvergeOnOnePendingRow(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			ms := newMesh(t)
			a := ms.add(aliceAddr, nil)
			var b *dev
			if store == "bolt" {
				b = ms.addBolt(bobAddr, nil)
			} else {
				b = ms.add(bobAddr, nil)
			}
			// Establish the session first so copies are ordinary messages.
			a.send(b, "hello")
			b.mustRecv(b.takeOne())
			const copies = 6
			for it := 0; it < raceIterations; it++ {
				sm := a.send(b, "dup")
				for i := 1; i < copies; i++ {
					a.resend(b, sm.ID)
				}
				envs := b.take()
				if len(envs) != copies {
					t.Fatalf("%d envelopes", len(envs))
				}
				results := make([]device.ReceiveResult, copies)
				errs := make([]error, copies)
				var wg sync.WaitGroup
				for i := range envs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results[i], errs[i] = b.recv(envs[i])
					}()
				}
				wg.Wait()
				var seq uint64
				for i := range results {
					if errs[i] != nil {
						t.Fatalf("iteration %d copy %d: %v", it, i, errs[i])
					}
					r := results[i]
					if r.Kind != device.Delivery || r.Message.ID != sm.ID || string(r.Message.Plaintext) != "dup" {
						t.Fatalf("copy %d = %+v", i, r)
					}
					if seq == 0 {
						seq = r.Message.Sequence
					} else if r.Message.Sequence != seq {
						t.Fatalf("copies got sequences %d and %d: two rows", seq, r.Message.Sequence)
					}
				}
				if n := b.pendingCount(); n != it+2 {
					t.Fatalf("iteration %d: %d pending, want %d", it, n, it+2)
				}
				if len(acksOf(a.pump())) != 0 {
					t.Fatal("a pending copy was ACKed")
				}
			}
		})
	}
}

// Two concurrent commits give exactly one COMMITTED and one
// ALREADY_COMMITTED.
func TestConcurrentCommitsOneCommittedOneAlreadyCommitted(t *testing.T) {
	_, a, b := pair(t)
	for it := 0; it < raceIterations*2; it++ {
		sm := a.send(b, "c")
		b.mustRecv(b.takeOne())
		var res [2]device.CommitResult
		var errs [2]error
		var wg sync.WaitGroup
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = b.d.CommitReceivedMessage(bg, a.addr, sm.ID)
			}()
		}
		wg.Wait()
		counts := map[device.Outcome]int{}
		for i := range res {
			if errs[i] != nil {
				t.Fatalf("commit %d: %v", i, errs[i])
			}
			counts[res[i].Status]++
		}
		if counts[device.Committed] != 1 || counts[device.AlreadyCommitted] != 1 {
			t.Fatalf("iteration %d: statuses %v, want one COMMITTED and one ALREADY_COMMITTED", it, counts)
		}
		acks := a.pump()
		if len(acks) != 2 {
			t.Fatalf("%d ACKs, want 2", len(acks))
		}
	}
	if n := b.pendingCount(); n != 0 {
		t.Fatalf("%d pending", n)
	}
}

// A commit racing a sender retry ends in one of the two outcomes the spec
// allows: "redelivered, then ACK by the commit" (the retry is a Delivery,
// one ACK) or "ACK only" (the retry is AlreadyCommitted and ACKed too).
func TestCommitRacingRetryEndsInAnAllowedOutcome(t *testing.T) {
	_, a, b := pair(t)
	seen := map[device.Outcome]int{}
	for it := 0; it < raceIterations*2; it++ {
		sm := a.send(b, "r")
		first := b.mustRecv(b.takeOne())
		a.resend(b, sm.ID)
		retry := b.takeOne()
		var c device.CommitResult
		var r device.ReceiveResult
		var cerr, rerr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); c, cerr = b.d.CommitReceivedMessage(bg, a.addr, sm.ID) }()
		go func() { defer wg.Done(); r, rerr = b.recv(retry) }()
		wg.Wait()
		if cerr != nil || rerr != nil {
			t.Fatalf("commit %v, retry %v", cerr, rerr)
		}
		if c.Status != device.Committed || !c.AckSent {
			t.Fatalf("commit = %+v", c)
		}
		acks := acksOf(a.pump())
		switch r.Kind {
		case device.Delivery: // redelivered, then ACK by the commit
			if r.Message.Sequence != first.Message.Sequence || r.AckSent || len(acks) != 1 {
				t.Fatalf("redelivered branch: %+v, %d ACKs", r, len(acks))
			}
		case device.AlreadyCommitted: // ACK only
			if !r.AckSent || len(acks) != 2 {
				t.Fatalf("ACK-only branch: %+v, %d ACKs", r, len(acks))
			}
		default:
			t.Fatalf("retry = %+v: not an allowed outcome", r)
		}
		seen[r.Kind]++
		if !acks[0].Cleared {
			t.Fatal("the first ACK did not clear the sender's pending message")
		}
		if b.pendingCount() != 0 {
			t.Fatal("message still pending after the commit")
		}
	}
	t.Logf("outcomes over %d races: %v", raceIterations*2, seen)
}
