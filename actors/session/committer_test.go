package session

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// gatedStore counts Updates; while gate is set the first Update blocks
// until it is closed (so items pile up in the committer's mailbox), and
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

func startCommitter(t *testing.T, st persistence.DeliveryStore) (*actor.ActorSystem, *actor.PID) {
	sys := actortest.System(t)
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &committer{store: st, maxBatch: DefaultMaxBatch, logger: slog.New(slog.DiscardHandler)}
	}))
	t.Cleanup(func() { _ = sys.Root.PoisonFuture(pid).Wait() })
	return sys, pid
}

func peerN(i int) messages.DeviceAddress {
	return messages.DeviceAddress{User: "peer", Device: uint32(i)}
}

// putItem writes a session marker for peer i; fail makes its writes fail.
func putItem(i int, ch *chain, fail error, res chan<- error) *item {
	return &item{chain: ch, apply: func(tx persistence.DeliveryTx, _ *Stats) error {
		if err := tx.PutSession(peerN(i), []byte{byte(i)}); err != nil {
			return err
		}
		return fail
	}, done: func(err error) { res <- err }}
}

func stored(t *testing.T, st persistence.DeliveryStore, i int) bool {
	t.Helper()
	var ok bool
	if err := st.View(context.Background(), func(r persistence.DeliveryReader) error {
		var err error
		_, ok, err = r.Session(peerN(i))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ok
}

// The committer drains its mailbox into one transaction: while the first
// transaction is held, every item that arrives is committed by the
// second, and each is answered only after it.
func TestCommitterDrainsMailboxIntoOneTransaction(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}
	sys, pid := startCommitter(t, gs)
	const n = 40
	res := make([]chan error, n+1)
	for i := range res {
		res[i] = make(chan error, 1)
	}
	sys.Root.Send(pid, putItem(0, nil, nil, res[0]))
	<-gs.entered
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); sys.Root.Send(pid, putItem(i, &chain{}, nil, res[i])) }()
	}
	wg.Wait()
	close(gs.gate)
	for i := range res {
		if err := <-res[i]; err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		if !stored(t, gs, i) {
			t.Fatalf("item %d answered before its write was stored", i)
		}
	}
	if u := gs.updates.Load(); u != 2 {
		t.Fatalf("%d transactions for %d items, want 2 (the held one and one for the rest)", u, n+1)
	}
}

// An item whose write fails is answered with its error; the later items
// of its chain (decided on top of it) are refused with ErrStaleState and
// write nothing; every other item commits without it.
func TestCommitterFailedItemBreaksItsChainOnly(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}
	sys, pid := startCommitter(t, gs)
	boom := errors.New("boom")
	mine, other := &chain{}, &chain{}
	res := make([]chan error, 5)
	for i := range res {
		res[i] = make(chan error, 1)
	}
	sys.Root.Send(pid, putItem(0, nil, nil, res[0]))
	<-gs.entered
	sys.Root.Send(pid, putItem(1, mine, nil, res[1]))  // before the failure: commits
	sys.Root.Send(pid, putItem(2, mine, boom, res[2])) // fails
	sys.Root.Send(pid, putItem(3, other, nil, res[3])) // another peer: commits
	sys.Root.Send(pid, putItem(4, mine, nil, res[4]))  // decided on top of 2: refused
	time.Sleep(20 * time.Millisecond)
	close(gs.gate)
	errs := make([]error, len(res))
	for i := range res {
		errs[i] = <-res[i]
	}
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.Is(errs[2], boom) || !errors.Is(errs[4], ErrStaleState) {
		t.Fatalf("errors %v", errs)
	}
	for i, want := range []bool{true, true, false, true, false} {
		if got := stored(t, gs, i); got != want {
			t.Fatalf("item %d stored = %v, want %v", i, got, want)
		}
	}
}

// A failed commit fails every item of the transaction and breaks every
// chain in it: nothing is written, and nothing decided on top of it is.
func TestCommitterFailedCommitFailsEveryItem(t *testing.T) {
	gs := &gatedStore{DeliveryStore: memory.NewDelivery()}
	sys, pid := startCommitter(t, gs)
	gs.failCommit.Store(true)
	ch := &chain{}
	r1 := make(chan error, 1)
	sys.Root.Send(pid, putItem(1, ch, nil, r1))
	if err := <-r1; !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("failed commit: %v", err)
	}
	gs.failCommit.Store(false)
	r2, r3 := make(chan error, 1), make(chan error, 1)
	sys.Root.Send(pid, putItem(2, ch, nil, r2))
	sys.Root.Send(pid, putItem(3, &chain{}, nil, r3))
	if err := <-r2; !errors.Is(err, ErrStaleState) {
		t.Fatalf("item of a broken chain: %v", err)
	}
	if err := <-r3; err != nil {
		t.Fatal(err)
	}
	if stored(t, gs, 1) || stored(t, gs, 2) || !stored(t, gs, 3) {
		t.Fatal("a failed or refused item was written")
	}
}

// The committer answers on its replier goroutine and goes on meanwhile:
// while the answer of one transaction is still running (held here), the
// next transaction commits; the answers come in commit order, each after
// its own transaction is durable, and stopping the committer waits for
// every answer.
func TestCommitterCommitsWhileItsAnswersRun(t *testing.T) {
	st := memory.NewDelivery()
	sys, pid := startCommitter(t, st)
	hold, held := make(chan struct{}), make(chan struct{})
	var order []int
	var mu sync.Mutex
	answered := func(i int) {
		mu.Lock()
		order = append(order, i)
		mu.Unlock()
	}
	first := putItem(1, nil, nil, make(chan error, 1))
	first.done = func(err error) {
		close(held)
		<-hold
		answered(1)
	}
	sys.Root.Send(pid, first)
	<-held
	// The first answer is still running: the second item commits anyway.
	r2 := make(chan error, 1)
	second := putItem(2, nil, nil, r2)
	inner := second.done
	second.done = func(err error) { answered(2); inner(err) }
	sys.Root.Send(pid, second)
	deadline := time.Now().Add(20 * time.Second)
	for !stored(t, st, 2) {
		if time.Now().After(deadline) {
			close(hold)
			t.Fatal("the second transaction waited for the first one's answer")
		}
		runtime.Gosched()
	}
	mu.Lock()
	if len(order) != 0 {
		t.Fatalf("answers %v while the first one is held", order)
	}
	mu.Unlock()
	close(hold)
	if err := <-r2; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Fatalf("answers in order %v, want [1 2] (commit order)", order)
	}
}

// Stopping the committer waits until every answer ran.
func TestCommitterStopWaitsForItsAnswers(t *testing.T) {
	sys := actortest.System(t)
	st := memory.NewDelivery()
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &committer{store: st, maxBatch: DefaultMaxBatch, logger: slog.New(slog.DiscardHandler)}
	}))
	var answered atomic.Int32
	const n = 50
	for i := 0; i < n; i++ {
		it := putItem(i, nil, nil, make(chan error, 1))
		it.done = func(error) { answered.Add(1) }
		sys.Root.Send(pid, it)
	}
	if err := sys.Root.PoisonFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := answered.Load(); got != n {
		t.Fatalf("%d of %d items answered when the committer stopped", got, n)
	}
}

// fakeCache is a committer cache an item fills; drops signals each drop.
type fakeCache struct {
	full  bool // committer goroutine only
	drops chan struct{}
}

func (c *fakeCache) held() bool { return c.full }
func (c *fakeCache) drop() {
	c.full = false
	c.drops <- struct{}{}
}

// An idle device must not keep what its committer cached for a run of
// requests (the decoded prekey store is about 17 KiB per device): the cache
// is dropped once the committer has been idle, and filled again on use.
func TestCommitterDropsItsCacheWhenIdle(t *testing.T) {
	cache := &fakeCache{drops: make(chan struct{}, 4)}
	sys := actortest.System(t)
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &committer{store: memory.NewDelivery(), maxBatch: DefaultMaxBatch, logger: slog.New(slog.DiscardHandler),
			cache: cache, cacheIdle: 5 * time.Millisecond}
	}))
	t.Cleanup(func() { _ = sys.Root.PoisonFuture(pid).Wait() })
	fill := func() {
		res := make(chan error, 1)
		sys.Root.Send(pid, &item{
			apply: func(persistence.DeliveryTx, *Stats) error { cache.full = true; return nil },
			done:  func(err error) { res <- err },
		})
		if err := <-res; err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		fill()
		select {
		case <-cache.drops:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the filled cache was not dropped after the committer went idle", round)
		}
	}
	// Nothing held: nothing to drop, and an item that does not fill the
	// cache does not arm the timer.
	res := make(chan error, 1)
	sys.Root.Send(pid, &item{apply: func(persistence.DeliveryTx, *Stats) error { return nil }, done: func(err error) { res <- err }})
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	_ = sys.Root.PoisonFuture(pid).Wait()
	if n := len(cache.drops); n != 0 {
		t.Fatalf("%d drops of an empty cache", n)
	}
}

// The manager's decoded prekey store is that cache: a device that served a
// bundle drops it once idle, and the next bundle decodes the store again.
func TestManagerDropsDecodedPrekeysWhenIdle(t *testing.T) {
	sys := actortest.System(t)
	addr := messages.DeviceAddress{User: "bob", Device: 1}
	m, err := NewManager(context.Background(), sys, Config{Store: memory.NewDelivery(), Transport: NewInProcess().Endpoint(addr), Local: addr, RefreshInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	held := func() bool {
		res := make(chan bool, 1)
		if err := m.submitOwn(&item{
			apply: func(persistence.DeliveryTx, *Stats) error { res <- (*managerCache)(m).held(); return nil },
			done:  func(error) {},
		}); err != nil {
			t.Fatal(err)
		}
		return <-res
	}
	var first uint32
	for round := range 2 {
		b, err := m.Bundle(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if b.OneTimePrekey == nil {
			t.Fatalf("round %d: a bundle without a one-time prekey", round)
		}
		if round == 0 {
			first = b.OneTimePrekey.ID
		} else if b.OneTimePrekey.ID == first {
			t.Fatalf("the bundle after the cache was dropped reissued one-time prekey %d", first)
		}
		deadline := time.Now().Add(30 * time.Second)
		for held() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the decoded prekey store is still held after 30 s idle", round)
			}
			time.Sleep(2 * defaultCacheIdle)
		}
	}
}
