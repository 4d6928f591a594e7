package device_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/messages"
)

func TestPendingReceivedMessagesPagesInSequenceOrderWithCursorAndFilter(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	c := ms.add(carolAddr, nil)
	for i := 0; i < 7; i++ {
		from := a
		if i%3 == 0 {
			from = c
		}
		from.send(b, fmt.Sprint("m", i))
		ms.clock.Advance(time.Millisecond)
	}
	b.pump()
	p1, err := b.d.PendingReceivedMessages(bg, 0, 3, nil)
	if err != nil || len(p1.Messages) != 3 || !p1.More || p1.Next != p1.Messages[2].Sequence {
		t.Fatalf("first page = %+v, %v", p1, err)
	}
	p2, err := b.d.PendingReceivedMessages(bg, p1.Next, 100, nil)
	if err != nil || len(p2.Messages) != 4 || p2.More {
		t.Fatalf("second page = %+v, %v", p2, err)
	}
	all := append(p1.Messages, p2.Messages...)
	for i := range all {
		if want := fmt.Sprint("m", i); string(all[i].Plaintext) != want {
			t.Fatalf("message %d = %q, want %q (acceptance order)", i, all[i].Plaintext, want)
		}
		if i > 0 && all[i].Sequence <= all[i-1].Sequence {
			t.Fatal("sequences not strictly increasing")
		}
	}
	onlyC, err := b.d.PendingReceivedMessages(bg, 0, 100, &c.addr)
	if err != nil || len(onlyC.Messages) != 3 {
		t.Fatalf("sender filter = %+v, %v", onlyC, err)
	}
	if n, _ := b.d.PendingReceivedMessageCount(bg, &c.addr); n != 3 {
		t.Fatalf("count of carol = %d", n)
	}
	if n := b.pendingCount(); n != 7 {
		t.Fatalf("count = %d", n)
	}
	empty, err := b.d.PendingReceivedMessages(bg, all[6].Sequence, 10, nil)
	if err != nil || len(empty.Messages) != 0 || empty.Next != all[6].Sequence || empty.More {
		t.Fatalf("page after the last = %+v, %v", empty, err)
	}
	for _, limit := range []int{0, -1, device.MaxPageSize + 1} {
		if _, err := b.d.PendingReceivedMessages(bg, 0, limit, nil); !errors.Is(err, inbound.ErrInvalidLimit) {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	// Returned plaintext is a copy.
	all[0].Plaintext[0] = 'X'
	again, _ := b.d.PendingReceivedMessages(bg, 0, 1, nil)
	if string(again.Messages[0].Plaintext) != "m0" {
		t.Fatal("plaintext aliases the store")
	}
	// Sequences are never reused: commit the last, receive a new one.
	if _, err := b.d.CommitMessage(bg, all[6]); err != nil {
		t.Fatal(err)
	}
	a.send(b, "new")
	r := b.pump()[0]
	if r.Message.Sequence <= all[6].Sequence {
		t.Fatalf("new message got sequence %d ≤ %d", r.Message.Sequence, all[6].Sequence)
	}
}

// "Processed-ID retention": entries with finalizedAt ≤ now − maxAge go,
// maxAge rounded up to whole milliseconds; an age equal to maxAge is
// pruned, one millisecond less is kept; INFINITE prunes nothing; maxAge ≤
// 0 is an error; pending messages are never pruned; nothing prunes
// implicitly.
func TestPruneProcessedMessagesBoundaries(t *testing.T) {
	ms, a, b := pair(t)
	ids := make([]messages.LogicalMessageID, 2)
	for i := range ids {
		ids[i] = a.send(b, "x").ID
		b.pump()
		b.commit(a, ids[i])
		ms.clock.Advance(time.Millisecond)
	}
	a.send(b, "stays pending")
	b.pump()
	// ids[0] finalized at T, ids[1] at T+1ms; now = T+2ms.
	for _, bad := range []time.Duration{0, -time.Second} {
		if _, err := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: bad}); !errors.Is(err, inbound.ErrInvalidRetention) {
			t.Fatalf("maxAge %v: %v", bad, err)
		}
	}
	if n, err := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: device.RetentionInfinite}); n != 0 || err != nil {
		t.Fatalf("INFINITE pruned %d, %v", n, err)
	}
	// maxAge 1.5ms rounds up to 2ms: cutoff T → ids[0] (age 2ms = maxAge) pruned.
	n, err := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: 1500 * time.Microsecond})
	if err != nil || n != 1 {
		t.Fatalf("prune 1.5ms = %d, %v; want 1", n, err)
	}
	if _, ok := b.processed(a, ids[0]); ok {
		t.Fatal("entry whose age equals maxAge was kept")
	}
	if _, ok := b.processed(a, ids[1]); !ok {
		t.Fatal("entry one millisecond younger than maxAge was pruned")
	}
	// A clock set back prunes less: nothing.
	ms.clock.Advance(-time.Hour)
	if n, _ := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: time.Millisecond}); n != 0 {
		t.Fatalf("clock set back pruned %d", n)
	}
	ms.clock.Advance(2 * time.Hour)
	if n, _ := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: time.Millisecond}); n != 1 {
		t.Fatalf("prune everything processed = %d", n)
	}
	if b.pendingCount() != 1 {
		t.Fatal("prune removed a pending message")
	}
}

// Flow control: past the per-sender cap a new message is refused before
// its ratchet step is persisted; the sender keeps it pending and its
// retry is accepted once there is room. Other senders are unaffected,
// and a copy of an already pending message is still delivered.
func TestMaxPendingPerSenderRefusesBeforeRatchetStep(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	c := ms.add(carolAddr, nil)
	b := ms.add(bobAddr, func(cfg *device.Config) { cfg.MaxPendingPerSender = 2 })
	m1 := a.send(b, "1")
	a.send(b, "2")
	b.pump()
	before := b.session(a.addr)
	m3 := a.send(b, "3")
	_, err := b.recv(b.takeOne())
	var bf *inbound.BacklogFullError
	if !errors.Is(err, inbound.ErrSenderBacklogFull) || !errors.As(err, &bf) || bf.Limit != 2 {
		t.Fatalf("third message: %v, want ErrSenderBacklogFull", err)
	}
	if string(before) != string(b.session(a.addr)) {
		t.Fatal("the refused message's ratchet step was persisted")
	}
	if b.pendingCount() != 2 {
		t.Fatal("refused message stored")
	}
	a.resend(b, m1.ID) // a copy of a pending one is still delivered
	if r := b.pump(); r[0].Kind != device.Delivery {
		t.Fatalf("copy of a pending message past the cap = %+v", r[0])
	}
	c.send(b, "other sender")
	if r := b.pump(); r[0].Kind != device.Delivery {
		t.Fatal("another sender was refused")
	}
	b.commit(a, m1.ID)
	a.pump()
	a.resend(b, m3.ID)
	if r := b.pump(); r[0].Kind != device.Delivery || string(r[0].Message.Plaintext) != "3" {
		t.Fatalf("retry after room = %+v", r[0])
	}
}

func TestHandlerGetsDeliveriesAndPendingOnOpen(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	var mu sync.Mutex
	var got []string
	b := ms.add(bobAddr, func(c *device.Config) {
		c.Handler = func(_ context.Context, m device.ReceivedMessage) {
			mu.Lock()
			got = append(got, string(m.Plaintext))
			mu.Unlock()
		}
	})
	a.send(b, "one")
	a.send(b, "two")
	b.pump()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 }, "two deliveries")
	b.restart()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 4 }, "redelivery on Open")
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != "one,two,one,two" {
		t.Fatalf("handler saw %v", got)
	}
}

func TestMessagesChannelAndCloseClosesIt(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Buffer = 4 })
	a.send(b, "via channel")
	b.pump()
	select {
	case m := <-b.d.Messages():
		if string(m.Plaintext) != "via channel" {
			t.Fatalf("got %q", m.Plaintext)
		}
		if c := b.commit(a, m.ID); c.Status != device.Committed {
			t.Fatal(c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery on the channel")
	}
	ch := b.d.Messages()
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed by Close")
	}
	// The Close rule (persistence.ErrClosed): a second Close returns nil.
	if err := b.d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.d.CommitReceivedMessage(bg, a.addr, messages.LogicalMessageID{}); !errors.Is(err, device.ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
}

// The opt-in retry schedule resends pending messages with backoff and
// reports the ones that reach the attempt cap.
func TestRetryScheduleResendsAndReportsExhausted(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, nil)
	exhausted := make(chan device.SentMessage, 4)
	a := ms.add(aliceAddr, func(c *device.Config) {
		c.Retry = device.RetryPolicy{Interval: 5 * time.Millisecond, Backoff: 1, MaxAttempts: 3}
		c.OnRetryExhausted = func(m device.SentMessage) { exhausted <- m }
	})
	sm := a.send(b, "retry me")
	b.take()
	// The schedule's clock is the test clock: advance it so retries are due.
	for i := 0; i < 2; i++ {
		ms.clock.Advance(time.Second)
		waitFor(t, func() bool { return len(b.ms.net.Take(b.addr)) == 1 }, "a scheduled resend")
	}
	ms.clock.Advance(time.Second)
	select {
	case m := <-exhausted:
		if m.ID != sm.ID || m.Attempts != 3 {
			t.Fatalf("exhausted %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exhausted message not reported")
	}
	if got := a.sentPending(); len(got) != 1 || got[0].Attempts != 3 {
		t.Fatalf("pending after the cap: %+v (stays pending)", got)
	}
}

func TestPruneScheduleIsOptIn(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) {
		c.Prune = device.PruneSchedule{Interval: 5 * time.Millisecond, Policy: device.RetentionPolicy{MaxAge: time.Minute}}
	})
	sm := a.send(b, "x")
	b.pump()
	b.commit(a, sm.ID)
	ms.clock.Advance(2 * time.Minute)
	waitFor(t, func() bool { _, ok := b.processed(a, sm.ID); return !ok }, "the scheduled prune")
	// Without a schedule nothing prunes implicitly.
	c := ms.add(carolAddr, nil)
	sm2 := a.send(c, "y")
	c.pump()
	c.commit(a, sm2.ID)
	ms.clock.Advance(24 * time.Hour)
	time.Sleep(20 * time.Millisecond)
	if _, ok := c.processed(a, sm2.ID); !ok {
		t.Fatal("a processed entry was pruned implicitly")
	}
}

func TestMetrics(t *testing.T) {
	ms := newMesh(t)
	reg := prometheus.NewRegistry()
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Registerer = reg })
	s1 := a.send(b, "1")
	s2 := a.send(b, "2")
	b.pump()
	if v := metric(t, reg, "syncmesh_delivery_pending_inbound_messages"); v != 2 {
		t.Fatalf("pending_inbound = %v", v)
	}
	b.commit(a, s1.ID)
	b.tr.fail.Store(true)
	if _, err := b.d.DiscardReceivedMessage(bg, a.addr, s2.ID, device.DiscardReason(5)); err != nil {
		t.Fatal(err)
	}
	b.tr.fail.Store(false)
	b.ms.clock.Advance(time.Hour)
	if n, err := b.d.PruneProcessedMessages(bg, device.RetentionPolicy{MaxAge: time.Minute}); err != nil || n != 2 {
		t.Fatalf("prune = %d, %v", n, err)
	}
	sentAt := b.ms.clock.Now()
	b.send(a, "out")
	b.ms.clock.Advance(time.Minute)
	b.send(a, "later")
	for name, want := range map[string]float64{
		"syncmesh_delivery_pending_inbound_messages":  0,
		"syncmesh_delivery_pending_outbound_messages": 2,
		"syncmesh_delivery_commits_total":             1,
		// The oldest waiting message's send time, not the latest's.
		"syncmesh_delivery_oldest_pending_outbound_created_timestamp_seconds": float64(sentAt.UnixMilli()) / 1000,
		"syncmesh_delivery_discards_total":                                    1,
		"syncmesh_delivery_processed_pruned_total":                            2,
		"syncmesh_delivery_acks_sent_total":                                   1,
		"syncmesh_delivery_acks_failed_total":                                 1,
	} {
		if got := metric(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// Devices sharing a registry add up in the pending gauges; a closed
// device no longer counts.
func TestPendingGaugesSumOverDevicesSharingARegistry(t *testing.T) {
	ms := newMesh(t)
	reg := prometheus.NewRegistry()
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, func(c *device.Config) { c.Registerer = reg })
	c := ms.add(carolAddr, func(c *device.Config) { c.Registerer = reg })
	a.send(b, "1")
	a.send(c, "2")
	a.send(c, "3")
	b.pump()
	c.pump()
	if v := metric(t, reg, "syncmesh_delivery_pending_inbound_messages"); v != 3 {
		t.Fatalf("pending_inbound = %v, want 3 (1 at bob + 2 at carol)", v)
	}
	if err := c.d.Close(); err != nil {
		t.Fatal(err)
	}
	if v := metric(t, reg, "syncmesh_delivery_pending_inbound_messages"); v != 1 {
		t.Fatalf("pending_inbound after carol closed = %v, want 1", v)
	}
}
