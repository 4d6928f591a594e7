package outbound

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
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

func TestStoreMarkAbandonPage(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(1000))
	var counts []int
	var mu sync.Mutex
	o, err := New(actortest.System(t), Config{Store: memory.NewDelivery(), Now: c.Now, OnChange: func(n int, _ time.Time) { mu.Lock(); counts = append(counts, n); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	id1, id2 := messages.LogicalMessageID{1}, messages.LogicalMessageID{2}
	m1, err := o.Store(bg, bob, id1, []byte("one"))
	if err != nil || m1.Attempts != 1 || !m1.LastAttemptAt.Equal(time.UnixMilli(1000)) || m1.Sequence == 0 {
		t.Fatalf("Store = %+v %v", m1, err)
	}
	if _, err := o.Store(bg, bob, id1, []byte("one")); !errors.Is(err, ErrAlreadyPending) {
		t.Fatalf("duplicate Store: %v", err)
	}
	if _, err := o.Store(bg, bob, id2, nil); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Second)
	m, err := o.MarkAttempt(bg, bob, id1)
	if err != nil || m.Attempts != 2 || string(m.Body) != "one" || !m.LastAttemptAt.Equal(time.UnixMilli(2000)) {
		t.Fatalf("MarkAttempt = %+v %v", m, err)
	}
	page, err := o.Pending(bg, 0, 1, nil)
	if err != nil || len(page.Messages) != 1 || !page.More || page.Messages[0].ID != id1 {
		t.Fatalf("page 1 = %+v %v", page, err)
	}
	page, err = o.Pending(bg, page.Next, 10, nil)
	if err != nil || len(page.Messages) != 1 || page.More || page.Messages[0].ID != id2 || page.Messages[0].Body == nil {
		t.Fatalf("page 2 = %+v %v", page, err)
	}
	if _, err := o.Pending(bg, 0, 0, nil); !errors.Is(err, ErrInvalidLimit) {
		t.Fatal(err)
	}
	if ok, err := o.Abandon(bg, bob, id1); !ok || err != nil {
		t.Fatalf("Abandon = %v %v", ok, err)
	}
	if _, err := o.MarkAttempt(bg, bob, id1); !errors.Is(err, ErrNotPending) {
		t.Fatalf("MarkAttempt after Abandon: %v", err)
	}
	if n, _ := o.Count(bg); n != 1 {
		t.Fatalf("Count = %d", n)
	}
	mu.Lock()
	if last := counts[len(counts)-1]; last != 1 {
		t.Fatalf("OnChange saw %v", counts)
	}
	mu.Unlock()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Store(bg, bob, id1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestRetryDueResendsWithBackoffAndReportsExhaustedOnce(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0))
	var o *Outbox
	var resent []messages.LogicalMessageID
	var exhausted []SentMessage
	o, err := New(actortest.System(t), Config{
		Store: memory.NewDelivery(), Now: c.Now,
		// An interval far longer than the test: the loop never fires; the
		// test runs the passes itself.
		Retry: RetryPolicy{Interval: time.Hour, Backoff: 2, MaxAttempts: 3},
		Resend: func(ctx context.Context, m SentMessage) error {
			resent = append(resent, m.ID)
			_, err := o.MarkAttempt(ctx, m.Recipient, m.ID)
			return err
		},
		OnExhausted: func(m SentMessage) { exhausted = append(exhausted, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	id := messages.LogicalMessageID{7}
	if _, err := o.Store(bg, bob, id, []byte("x")); err != nil {
		t.Fatal(err)
	}
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
	sys := actortest.System(t)
	for _, cfg := range []Config{
		{},
		{Store: memory.NewDelivery(), Retry: RetryPolicy{Interval: time.Second}},
		{Store: memory.NewDelivery(), Retry: RetryPolicy{Interval: -1}},
	} {
		if _, err := New(sys, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if (RetryPolicy{}).Enabled() {
		t.Fatal("retry on by default")
	}
}
