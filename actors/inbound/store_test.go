package inbound

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

var bg = context.Background()

// gatedStore counts Updates; while gate is set, the first Update blocks
// until it is closed (so requests pile up in the actor's mailbox), and
// failCommit makes Update fail after fn succeeded (a failed commit).
type gatedStore struct {
	persistence.DeliveryStore
	updates    atomic.Int32
	gate       chan struct{}
	entered    chan struct{}
	failCommit atomic.Bool
}

func (s *gatedStore) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	if s.updates.Add(1) == 1 && s.gate != nil {
		close(s.entered)
		<-s.gate
	}
	return s.DeliveryStore.Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := fn(tx); err != nil {
			return err
		}
		if s.failCommit.Load() {
			return persistence.ErrInjected
		}
		return nil
	})
}

// fakeStep is a ratchet step: Persist writes a session marker.
type fakeStep struct {
	peer      messages.DeviceAddress
	fail      error
	committed atomic.Int32
	aborted   atomic.Int32
}

func (f *fakeStep) Persist(tx persistence.DeliveryTx) error {
	if err := tx.PutSession(f.peer, []byte("stepped")); err != nil {
		return err
	}
	return f.fail
}
func (f *fakeStep) Committed() { f.committed.Add(1) }
func (f *fakeStep) Abort()     { f.aborted.Add(1) }

func (f *fakeStep) released(t *testing.T, committed bool) {
	t.Helper()
	c, a := f.committed.Load(), f.aborted.Load()
	if c+a != 1 || (c == 1) != committed {
		t.Fatalf("step released committed=%d aborted=%d, want exactly one (committed %v)", c, a, committed)
	}
}

func appPayload(id messages.LogicalMessageID, body string) (*messages.SecurePayload, []byte) {
	p := &messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: id, Body: []byte(body)}
	f, err := messages.EncodeSecurePayload(p)
	if err != nil {
		panic(err)
	}
	return p, f
}

func newStore(t *testing.T, gs *gatedStore, tweak func(*Config)) *Store {
	cfg := Config{Store: gs, Now: func() time.Time { return time.UnixMilli(5000) }}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(actortest.System(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func peer(i int) messages.DeviceAddress {
	return messages.DeviceAddress{User: "peer", Device: uint32(i)}
}

// The actor drains its mailbox into one transaction: while the first
// transaction is blocked, every request that arrives is committed by the
// second, and each caller is answered only after it.
func TestGroupCommitDrainsMailboxIntoOneTransaction(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}
	s := newStore(t, gs, nil)
	const n = 40
	steps := make([]*fakeStep, n+1)
	results := make([]ReceiveResult, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	run := func(i int) {
		defer wg.Done()
		steps[i] = &fakeStep{peer: peer(i)}
		p, f := appPayload(messages.LogicalMessageID{byte(i)}, "b")
		results[i], errs[i] = s.Receive(bg, peer(i), p, f, steps[i])
	}
	wg.Add(1)
	go run(0)
	<-gs.entered
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go run(i)
	}
	// Let the requests reach the mailbox, then release the first tx.
	time.Sleep(50 * time.Millisecond)
	close(gs.gate)
	wg.Wait()
	for i := range results {
		if errs[i] != nil || results[i].Outcome != OutcomeDelivery || !results[i].New {
			t.Fatalf("request %d: %+v %v", i, results[i], errs[i])
		}
		steps[i].released(t, true)
	}
	if u := gs.updates.Load(); u > 3 {
		t.Fatalf("%d transactions for %d requests: no group commit", u, n+1)
	}
	seqs := map[uint64]bool{}
	for _, r := range results {
		if seqs[r.Message.Sequence] {
			t.Fatal("duplicate sequence")
		}
		seqs[r.Message.Sequence] = true
	}
}

// A request whose write fails is answered with its error and its step is
// aborted; the other requests of the batch commit without it.
func TestFailedItemIsDroppedAndTheBatchRetried(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}
	s := newStore(t, gs, nil)
	boom := errors.New("boom")
	good := []*fakeStep{{peer: peer(1)}, {peer: peer(3)}}
	bad := &fakeStep{peer: peer(2), fail: boom}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	// Request 0 occupies the first transaction; 1, 2, 3 share the next.
	first := &fakeStep{peer: peer(0)}
	wg.Add(1)
	go func() {
		defer wg.Done()
		p, f := appPayload(messages.LogicalMessageID{0}, "b")
		_, errs[0] = s.Receive(bg, peer(0), p, f, first)
	}()
	<-gs.entered
	for i, st := range []*fakeStep{good[0], bad, good[1]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, f := appPayload(messages.LogicalMessageID{byte(i + 1)}, "b")
			_, errs[i+1] = s.Receive(bg, st.peer, p, f, st)
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(gs.gate)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.Is(errs[2], boom) {
		t.Fatalf("errors %v", errs)
	}
	first.released(t, true)
	good[0].released(t, true)
	good[1].released(t, true)
	bad.released(t, false)
	_ = gs.DeliveryStore.View(bg, func(r persistence.DeliveryReader) error {
		if _, ok, _ := r.PendingInbound(peer(2), messages.LogicalMessageID{2}); ok {
			t.Fatal("the failed request's row was committed")
		}
		if _, ok, _ := r.Session(peer(2)); ok {
			t.Fatal("the failed request's step was committed")
		}
		if n, _ := r.PendingInboundCount(nil); n != 3 {
			t.Fatalf("%d pending, want 3", n)
		}
		return nil
	})
}

// A failed commit fails every request of the batch and aborts every step:
// the message stays as it was (atomicity).
func TestFailedCommitFailsBatchAndAbortsSteps(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery()}
	s := newStore(t, gs, nil)
	p, f := appPayload(mid, "b")
	if _, err := s.Receive(bg, alice, p, f, nil); err != nil {
		t.Fatal(err)
	}
	gs.failCommit.Store(true)
	if _, err := s.Commit(bg, alice, mid); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("commit with a failing transaction: %v", err)
	}
	st := &fakeStep{peer: alice}
	if _, err := s.Receive(bg, alice, p, f, st); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("receive with a failing transaction: %v", err)
	}
	st.released(t, false)
	gs.failCommit.Store(false)
	page, err := s.Pending(bg, 0, 10, nil)
	if err != nil || len(page.Messages) != 1 {
		t.Fatalf("pending after failed commit: %+v %v", page, err)
	}
	if r, err := s.Commit(bg, alice, mid); err != nil || r.Outcome != OutcomeCommitted {
		t.Fatalf("commit = %+v %v", r, err)
	}
}

func TestStepAbortedOnDecisionErrorAndCommittedOnDuplicate(t *testing.T) {
	s := newStore(t, &gatedStore{DeliveryStore: memory.NewDelivery()}, nil)
	p, f := appPayload(mid, "b")
	st1 := &fakeStep{peer: alice}
	if _, err := s.Receive(bg, alice, p, f, st1); err != nil {
		t.Fatal(err)
	}
	st1.released(t, true)
	st2 := &fakeStep{peer: alice}
	if r, err := s.Receive(bg, alice, p, f, st2); err != nil || r.New {
		t.Fatalf("duplicate = %+v %v", r, err)
	}
	st2.released(t, true) // a duplicate still advances the ratchet
	q, g := appPayload(mid, "other")
	st3 := &fakeStep{peer: alice}
	if _, err := s.Receive(bg, alice, q, g, st3); !errors.Is(err, ErrLogicalMessageConflict) {
		t.Fatalf("conflict: %v", err)
	}
	st3.released(t, false)
	st4 := &fakeStep{peer: alice}
	if _, err := s.Receive(bg, alice, &messages.SecurePayload{Type: 9}, nil, st4); !errors.Is(err, ErrNotApplicationMessage) {
		t.Fatalf("unknown frame: %v", err)
	}
	st4.released(t, false)
}

func TestAckFrameClearsPendingOutbound(t *testing.T) {
	ms := memory.NewDelivery()
	s := newStore(t, &gatedStore{DeliveryStore: ms}, nil)
	if err := ms.Update(bg, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: alice, ID: mid, Body: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ack := &messages.SecurePayload{Type: messages.PayloadAck, ID: mid}
	st := &fakeStep{peer: alice}
	r, err := s.Receive(bg, alice, ack, nil, st)
	if err != nil || r.Outcome != OutcomeAcknowledgement || !r.Cleared || r.AckDue {
		t.Fatalf("ack = %+v %v", r, err)
	}
	st.released(t, true)
	r, err = s.Receive(bg, alice, ack, nil, nil)
	if err != nil || r.Cleared {
		t.Fatalf("second ack = %+v %v", r, err)
	}
}

func TestCancelledContextSkipsRequest(t *testing.T) {
	s := newStore(t, &gatedStore{DeliveryStore: memory.NewDelivery()}, nil)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	st := &fakeStep{peer: alice}
	p, f := appPayload(mid, "b")
	if _, err := s.Receive(ctx, alice, p, f, st); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled receive: %v", err)
	}
	st.released(t, false)
	if n, _ := s.PendingCount(bg, nil); n != 0 {
		t.Fatal("cancelled receive stored a row")
	}
}

func TestCloseAnswersQueuedRequestsThenRefuses(t *testing.T) {
	s, err := New(actortest.System(t), Config{Store: memory.NewDelivery()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, f := appPayload(messages.LogicalMessageID{byte(i)}, "b")
			_, errs[i] = s.Receive(bg, alice, p, f, nil)
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if _, err := s.PendingCount(bg, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestInvalidInputs(t *testing.T) {
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal(err)
	}
	s := newStore(t, &gatedStore{DeliveryStore: memory.NewDelivery()}, nil)
	if _, err := s.Discard(bg, alice, mid, 0); !errors.Is(err, ErrInvalidDiscardReason) {
		t.Fatal(err)
	}
	if _, err := s.Pending(bg, 0, MaxPageSize+1, nil); !errors.Is(err, ErrInvalidLimit) {
		t.Fatal(err)
	}
	if _, err := s.Commit(bg, messages.DeviceAddress{}, mid); err == nil {
		t.Fatal("invalid sender accepted")
	}
	if _, err := s.Prune(bg, RetentionPolicy{}); !errors.Is(err, ErrInvalidRetention) {
		t.Fatal(err)
	}
}
