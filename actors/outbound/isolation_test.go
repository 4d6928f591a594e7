package outbound

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var silent = messages.DeviceAddress{User: "silent", Device: 1}

func putFor(t *testing.T, st persistence.DeliveryStore, to messages.DeviceAddress, id messages.LogicalMessageID, at int64) {
	t.Helper()
	if err := st.Update(bg, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: to, ID: id, CreatedAt: at, Attempts: 1, LastAttemptAt: at, Body: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestSilentRecipientDoesNotStallTheOthers: three messages to a host that
// accepts and never answers (its resend blocks) come first in send order;
// bob's due message is still resent while the silent host's first resend
// is blocked, and a later pass does not start a second worker for the
// silent host.
func TestSilentRecipientDoesNotStallTheOthers(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0))
	st := memory.NewDelivery()
	release := make(chan struct{})
	var blocked, silentTries atomic.Int32
	var bobResent atomic.Bool
	o, err := New(Config{
		Store: st, Now: c.Now,
		Retry: RetryPolicy{Interval: time.Hour},
		Resend: func(ctx context.Context, m SentMessage) error {
			if m.Recipient == silent {
				silentTries.Add(1)
				blocked.Add(1)
				defer blocked.Add(-1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return errors.New("silent host: no answer")
			}
			bobResent.Store(true)
			return markAttempt(st, m.ID, persistence.UnixMilli(c.Now()))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	for i := byte(1); i <= 3; i++ {
		putFor(t, st, silent, messages.LogicalMessageID{i}, 0)
	}
	putFor(t, st, bob, messages.LogicalMessageID{9}, 0)
	c.Advance(time.Hour)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, _ = o.RetryDue(bg)
	}()
	eventually(t, bobResent.Load, "bob's resend")
	if blocked.Load() != 1 {
		t.Fatalf("bob was resent to with %d silent resends blocked, want 1 (the silent host's first, still waiting)", blocked.Load())
	}
	// A second pass while the silent worker runs skips that recipient.
	if _, _, err := o.RetryDue(bg); err != nil {
		t.Fatal(err)
	}
	if n := silentTries.Load(); n != 1 {
		t.Fatalf("%d tries to the silent host while its worker still ran, want 1", n)
	}
	close(release)
	wg.Wait()
	// The failed try ended the silent host's turn: its two other
	// messages wait for a later pass instead of each waiting in turn.
	if n := silentTries.Load(); n != 1 {
		t.Fatalf("%d tries to the silent host in one pass, want 1", n)
	}
}

// TestFailedTriesCountAsAttempts: a resend that fails before anything is
// stored (the bundle request timed out) counts as an attempt, so the
// backoff grows and MaxAttempts ends the retries.
func TestFailedTriesCountAsAttempts(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0))
	st := memory.NewDelivery()
	var tries atomic.Int32
	var exhausted []SentMessage
	o, err := New(Config{
		Store: st, Now: c.Now,
		Retry: RetryPolicy{Interval: time.Hour, Backoff: 2, MaxAttempts: 3},
		Resend: func(ctx context.Context, m SentMessage) error {
			tries.Add(1)
			return context.DeadlineExceeded
		},
		OnExhausted: func(m SentMessage) { exhausted = append(exhausted, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	putFor(t, st, silent, messages.LogicalMessageID{1}, 0)
	pass := func() {
		t.Helper()
		if _, _, err := o.RetryDue(bg); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(time.Hour)
	pass() // try 2 fails
	if tries.Load() != 1 {
		t.Fatalf("tries %d", tries.Load())
	}
	c.Advance(time.Hour) // 2 attempts: due 2 h after the failed try
	pass()
	if tries.Load() != 1 {
		t.Fatal("the failed try did not count: resent before its backoff")
	}
	c.Advance(time.Hour)
	pass() // try 3 fails: at the cap
	c.Advance(24 * time.Hour)
	pass()
	if tries.Load() != 2 || len(exhausted) != 1 || exhausted[0].Attempts != 3 {
		t.Fatalf("tries %d, exhausted %+v: MaxAttempts not honoured for failed tries", tries.Load(), exhausted)
	}
}

// TestJitterSpreadsABurstWithinItsBound: with Jitter 0.2 every message's
// delay is within [0.8·Delay, Delay], the same on every look (a pass that
// looks again draws the same), and a burst's delays are spread out.
func TestJitterSpreadsABurstWithinItsBound(t *testing.T) {
	p := RetryPolicy{Interval: 10 * time.Second, Backoff: 2, Jitter: 0.2}
	distinct := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		id := messages.LogicalMessageID{byte(i), byte(i >> 8), 1}
		d := p.DelayOf(bob, id, 2)
		if d < 16*time.Second || d > 20*time.Second {
			t.Fatalf("DelayOf = %v, want within [16s, 20s]", d)
		}
		if again := p.DelayOf(bob, id, 2); again != d {
			t.Fatalf("DelayOf drew %v then %v", d, again)
		}
		distinct[d.Truncate(100*time.Millisecond)] = true
	}
	if len(distinct) < 20 {
		t.Fatalf("200 messages' delays fall in %d buckets of 100 ms: not spread", len(distinct))
	}
	if d := (RetryPolicy{Interval: time.Second}).DelayOf(bob, messages.LogicalMessageID{1}, 1); d != time.Second {
		t.Fatalf("no jitter: %v", d)
	}
	if _, err := New(Config{Store: memory.NewDelivery(), Retry: RetryPolicy{Interval: time.Second, Jitter: 1.5},
		Resend: func(context.Context, SentMessage) error { return nil }}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("jitter 1.5: %v", err)
	}
}
