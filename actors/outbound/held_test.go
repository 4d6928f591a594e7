package outbound

import (
	"context"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

func TestDecideReceipt(t *testing.T) {
	row := &persistence.PendingOutbound{Recipient: bob, ID: messages.LogicalMessageID{1}, Body: []byte("body")}
	for _, c := range []struct {
		name    string
		pending *persistence.PendingOutbound
		receipt [32]byte
		want    ReceiptVerdict
	}{
		{"pending, same body", row, digest.ApplicationMessage([]byte("body")), ReceiptHeld},
		{"pending, other body", row, digest.ApplicationMessage([]byte("other")), ReceiptMismatch},
		{"pending, zero digest", row, [32]byte{}, ReceiptMismatch},
		{"not pending", nil, digest.ApplicationMessage([]byte("body")), ReceiptStale},
		{"empty body", &persistence.PendingOutbound{Body: []byte{}}, digest.ApplicationMessage(nil), ReceiptHeld},
	} {
		if got := DecideReceipt(c.pending, c.receipt); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestNextDueTable is the sender's schedule as a pure function: the short
// schedule until a held receipt, then HeldInterval after the later of the
// last attempt and the receipt, whatever the attempt count.
func TestNextDueTable(t *testing.T) {
	id := messages.LogicalMessageID{2}
	p := RetryPolicy{Interval: time.Second, Backoff: 1.5, MaxInterval: 10 * time.Second, HeldInterval: time.Minute}
	t0 := time.UnixMilli(1_000_000)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, c := range []struct {
		name     string
		policy   RetryPolicy
		attempts int
		last     time.Time
		heldAt   time.Time
		want     time.Time
	}{
		{"first send, not held", p, 1, t0, time.Time{}, at(time.Second)},
		{"third attempt, not held", p, 3, t0, time.Time{}, at(2250 * time.Millisecond)},
		{"many attempts, capped", p, 40, t0, time.Time{}, at(10 * time.Second)},
		{"held after the attempt", p, 2, t0, at(20 * time.Millisecond), at(time.Minute + 20*time.Millisecond)},
		{"held before a later safety resend", p, 3, at(time.Minute), at(20 * time.Millisecond), at(2 * time.Minute)},
		{"held, many attempts", p, 40, t0, at(time.Second), at(time.Minute + time.Second)},
		{"held, default interval", RetryPolicy{Interval: time.Second}, 1, t0, t0, at(DefaultHeldInterval)},
	} {
		if got := c.policy.NextDue(bob, id, c.attempts, c.last, c.heldAt); !got.Equal(c.want) {
			t.Errorf("%s: due %v, want %v", c.name, got.Sub(t0), c.want.Sub(t0))
		}
	}
}

// TestHeldMessageWaitsForTheLongInterval runs the Outbox's schedule: a
// held message is not resent on the short schedule, is resent once after
// HeldInterval, and a mark of a message no longer pending is dropped.
func TestHeldMessageWaitsForTheLongInterval(t *testing.T) {
	c := actortest.NewClock(time.UnixMilli(0))
	st := memory.NewDelivery()
	var resent int
	o, err := New(Config{Store: st, Now: c.Now,
		Retry: RetryPolicy{Interval: time.Hour, MaxInterval: time.Hour, HeldInterval: 10 * time.Hour},
		Resend: func(ctx context.Context, m SentMessage) error {
			resent++
			return markAttempt(st, m.ID, persistence.UnixMilli(c.Now()))
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	held, free := messages.LogicalMessageID{1}, messages.LogicalMessageID{2}
	put(t, st, held, "a", 0)
	put(t, st, free, "b", 0)
	o.Held(bob, held)
	pass := func() int {
		t.Helper()
		resent = 0
		if _, _, err := o.RetryDue(bg); err != nil {
			t.Fatal(err)
		}
		return resent
	}
	for i := 0; i < 9; i++ {
		c.Advance(time.Hour)
		if n := pass(); n != 1 {
			t.Fatalf("hour %d: %d resent, want only the message not held", i+1, n)
		}
	}
	c.Advance(time.Hour)
	if n := pass(); n != 2 {
		t.Fatalf("after HeldInterval: %d resent, want both", n)
	}
	if err := st.Update(bg, func(tx persistence.DeliveryTx) error {
		_, err := tx.DeletePendingOutbound(bob, held)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pass()
	if n := o.HeldCount(); n != 0 {
		t.Fatalf("%d held marks after the ACK, want 0", n)
	}
}
