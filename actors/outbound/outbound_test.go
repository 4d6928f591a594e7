package outbound

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var (
	bg  = context.Background()
	bob = messages.DeviceAddress{User: "bob", Device: 1}
)

func TestDelayBackoffAndCap(t *testing.T) {
	p := RetryPolicy{Interval: time.Second, Backoff: 3, MaxInterval: 10 * time.Second}
	for attempts, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 3 * time.Second, 3: 9 * time.Second, 4: 10 * time.Second, 200: 10 * time.Second} {
		if got := p.Delay(attempts); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempts, got, want)
		}
	}
	if got := (RetryPolicy{Interval: time.Second}).Delay(3); got != 4*time.Second {
		t.Errorf("default backoff 2: Delay(3) = %v", got)
	}
	if (RetryPolicy{}).Enabled() {
		t.Error("zero policy enabled")
	}
}

// put stores a pending outbound row as the session layer's committer
// does (the Outbox only reads).
func put(t *testing.T, st persistence.DeliveryStore, id messages.LogicalMessageID, body string, at int64) {
	t.Helper()
	if err := st.Update(bg, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: bob, ID: id, CreatedAt: at, Attempts: 1, LastAttemptAt: at, Body: []byte(body)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func markAttempt(st persistence.DeliveryStore, id messages.LogicalMessageID, at int64) error {
	return st.Update(bg, func(tx persistence.DeliveryTx) error {
		_, err := tx.MarkOutboundAttempt(bob, id, at)
		return err
	})
}

func TestPendingPagesGetAndCount(t *testing.T) {
	st := memory.NewDelivery()
	o, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	id1, id2 := messages.LogicalMessageID{1}, messages.LogicalMessageID{2}
	put(t, st, id1, "one", 1000)
	put(t, st, id2, "", 1000)
	page, err := o.Pending(bg, 0, 1, nil)
	if err != nil || len(page.Messages) != 1 || !page.More || page.Messages[0].ID != id1 || page.Messages[0].Attempts != 1 ||
		!page.Messages[0].LastAttemptAt.Equal(time.UnixMilli(1000)) || string(page.Messages[0].Body) != "one" {
		t.Fatalf("page 1 = %+v %v", page, err)
	}
	page, err = o.Pending(bg, page.Next, 10, nil)
	if err != nil || len(page.Messages) != 1 || page.More || page.Messages[0].ID != id2 || page.Messages[0].Body == nil {
		t.Fatalf("page 2 = %+v %v", page, err)
	}
	if _, err := o.Pending(bg, 0, 0, nil); !errors.Is(err, ErrInvalidLimit) {
		t.Fatal(err)
	}
	if m, ok, err := o.Get(bg, bob, id1); err != nil || !ok || string(m.Body) != "one" {
		t.Fatalf("Get = %+v %v %v", m, ok, err)
	}
	if n, _ := o.Count(bg); n != 2 {
		t.Fatalf("Count = %d", n)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	// The Close rule (persistence.ErrClosed): a second Close returns nil;
	// other calls after Close return ErrClosed.
	if err := o.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := o.Get(bg, bob, id1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}

func TestRetryDueResendsWithBackoffAndReportsExhaustedOnce(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0))
	var o *Outbox
	var resent []messages.LogicalMessageID
	var exhausted []SentMessage
	st := memory.NewDelivery()
	o, err := New(Config{
		Store: st, Now: c.Now,
		// An interval far longer than the test: the loop never fires; the
		// test runs the passes itself.
		Retry: RetryPolicy{Interval: time.Hour, Backoff: 2, MaxAttempts: 3},
		Resend: func(ctx context.Context, m SentMessage) error {
			resent = append(resent, m.ID)
			return markAttempt(st, m.ID, persistence.UnixMilli(c.Now()))
		},
		OnExhausted: func(m SentMessage) { exhausted = append(exhausted, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	id := messages.LogicalMessageID{7}
	put(t, st, id, "x", 0)
	pass := func() (int, int) {
		n, ex, err := o.RetryDue(bg)
		if err != nil {
			t.Fatal(err)
		}
		return n, len(ex)
	}
	if n, _ := pass(); n != 0 {
		t.Fatal("resent before the interval")
	}
	c.Advance(time.Hour)
	if n, _ := pass(); n != 1 {
		t.Fatal("not resent after the interval")
	}
	c.Advance(time.Hour) // attempts 2: delay 2h
	if n, _ := pass(); n != 0 {
		t.Fatal("resent before the backoff delay")
	}
	c.Advance(time.Hour)
	if n, _ := pass(); n != 1 {
		t.Fatal("not resent after the backoff delay")
	}
	c.Advance(24 * time.Hour)
	if n, ex := pass(); n != 0 || ex != 1 {
		t.Fatalf("at the cap: resent %d, exhausted %d", n, ex)
	}
	if _, ex := pass(); ex != 0 || len(exhausted) != 1 {
		t.Fatal("exhausted reported twice")
	}
	if m, ok, _ := o.Get(bg, bob, id); !ok || m.Attempts != 3 {
		t.Fatalf("message at the cap: %+v %v (stays pending)", m, ok)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Store: memory.NewDelivery(), Retry: RetryPolicy{Interval: time.Second}},
		{Store: memory.NewDelivery(), Retry: RetryPolicy{Interval: -1}},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if (RetryPolicy{}).Enabled() {
		t.Fatal("retry on by default")
	}
}

// TestRetryDueAfterClockSteppedBack: a message whose last attempt was
// stored by a clock later than today's (the node restarted with its wall
// clock set back) is due now, not after the step: the stored time is of
// the old clock.
func TestRetryDueAfterClockSteppedBack(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0).Add(10 * time.Minute))
	st := memory.NewDelivery()
	var resent []messages.LogicalMessageID
	o, err := New(Config{
		Store: st, Now: c.Now,
		Retry: RetryPolicy{Interval: time.Hour, Backoff: 2, MaxInterval: 10 * time.Second},
		Resend: func(ctx context.Context, m SentMessage) error {
			resent = append(resent, m.ID)
			return markAttempt(st, m.ID, persistence.UnixMilli(c.Now()))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	id := messages.LogicalMessageID{9}
	// Last attempt two minutes after the clock's now.
	put(t, st, id, "x", persistence.UnixMilli(c.Now().Add(2*time.Minute)))
	if n, _, err := o.RetryDue(bg); err != nil || n != 1 {
		t.Fatalf("RetryDue with the last attempt 2m in the future: resent %d (%v), want 1", n, err)
	}
	// The resend stored today's clock: the schedule is back to normal.
	if n, _, err := o.RetryDue(bg); err != nil || n != 0 {
		t.Fatalf("second pass: resent %d (%v), want 0", n, err)
	}
	c.Advance(10 * time.Second)
	if n, _, err := o.RetryDue(bg); err != nil || n != 1 {
		t.Fatalf("after the capped interval: resent %d (%v), want 1", n, err)
	}
}
