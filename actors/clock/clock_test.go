package clock

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

type fakeWall struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeWall) now() time.Time  { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeWall) set(t time.Time) { f.mu.Lock(); f.t = t; f.mu.Unlock() }

type store struct {
	mu  sync.Mutex
	hw  messages.HLC
	n   int
	err error
}

func (s *store) persist(h messages.HLC) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.hw, s.n = h, s.n+1
	return nil
}

func TestTickIsStrictlyIncreasingAndFollowsWall(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, time.Second)
	a, _ := c.Now()
	b, _ := c.Now()
	if b <= a || a.Physical() != 1_000_000 || b.Logical() != 1 {
		t.Fatalf("a=%v b=%v", a, b)
	}
	w.set(time.UnixMilli(1_000_500))
	d, _ := c.Now()
	if d.Physical() != 1_000_500 || d.Logical() != 0 {
		t.Fatalf("d=%v", d)
	}
}

func TestObserveMovesNextTickAbove(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	c := New(w.now, 0, (&store{}).persist, 0)
	remote, _ := messages.NewHLC(1_200_000, 7)
	c.Observe(remote)
	n, _ := c.Now()
	if n <= remote {
		t.Fatalf("next %v not above observed %v", n, remote)
	}
}

func TestWallBackwardsNeverReissues(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(5_000_000)}
	c := New(w.now, 0, (&store{}).persist, 0)
	prev, _ := c.Now()
	w.set(time.UnixMilli(4_000_000))
	for i := 0; i < 100; i++ {
		n, _ := c.Now()
		if n <= prev {
			t.Fatalf("issued %v after %v", n, prev)
		}
		prev = n
	}
}

// Restart (crash: nothing but the persisted high-water survives) with the
// wall clock set back: every value issued after is above every value
// issued before.
func TestRestartNeverReissues(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(9_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, 2*time.Second)
	var maxIssued messages.HLC
	for i := 0; i < 50; i++ {
		n, err := c.Now()
		if err != nil {
			t.Fatal(err)
		}
		maxIssued = n
		w.set(w.now().Add(100 * time.Millisecond)) // 5 s of issued time: crosses the lease
	}
	if s.n < 2 {
		t.Fatalf("expected the high-water to be re-persisted across leases, got %d writes", s.n)
	}
	w.set(time.UnixMilli(1_000)) // the wall clock went far backwards
	c2 := New(w.now, s.hw, s.persist, 2*time.Second)
	n, _ := c2.Now()
	if n <= maxIssued {
		t.Fatalf("after restart issued %v <= %v issued before", n, maxIssued)
	}
}

func TestPersistFailureIssuesNothing(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	boom := errors.New("disk full")
	s := &store{err: boom}
	c := New(w.now, 0, s.persist, 0)
	if _, err := c.Now(); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if c.Last() != 0 {
		t.Fatalf("a value was issued without a durable high-water")
	}
}

func TestConcurrentTicksUnique(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	c := New(w.now, 0, (&store{}).persist, 0)
	var mu sync.Mutex
	seen := map[messages.HLC]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				n, err := c.Now()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[n] {
					t.Errorf("duplicate %v", n)
				}
				seen[n] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func TestReserveIsDurableAndNeverReissued(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, time.Second)
	chosen, _ := messages.NewHLC(1_500_000, 3) // a caller-chosen HLC ahead of the wall clock
	if err := c.Reserve(chosen); err != nil {
		t.Fatal(err)
	}
	if s.hw < chosen {
		t.Fatalf("high-water %v not above reserved %v", s.hw, chosen)
	}
	c2 := New(w.now, s.hw, s.persist, time.Second) // crash + restart
	if n, _ := c2.Now(); n <= chosen {
		t.Fatalf("issued %v, not above reserved %v", n, chosen)
	}
}

// A held clock issues nothing (Now and Reserve fail with ErrHeld) while
// Observe still raises it, so the first value after Release is above
// everything observed during the hold (SSP/1 §13.5 restore).
func TestHeldClockIssuesNothingUntilReleased(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, time.Second)
	select {
	case <-c.Released():
	default:
		t.Fatal("a clock never held is not released")
	}
	c.Hold()
	if _, err := c.Now(); !errors.Is(err, ErrHeld) {
		t.Fatalf("Now while held: %v", err)
	}
	if err := c.Reserve(5); !errors.Is(err, ErrHeld) {
		t.Fatalf("Reserve while held: %v", err)
	}
	seen := messages.HLC(2_000_000 << 16)
	c.Observe(seen)
	done := c.Released()
	select {
	case <-done:
		t.Fatal("released before Release")
	default:
	}
	c.Release()
	c.Release() // idempotent
	<-done
	h, err := c.Now()
	if err != nil || h <= seen {
		t.Fatalf("first value after release %v (%v), not above the observed %v", h, err, seen)
	}
	if s.n != 1 {
		t.Fatalf("%d persists, want 1 (nothing persisted while held)", s.n)
	}
}

// TestClockIsReadableWhileAMarkIsPersisted: persisting a mark waits for
// the store's writer, and the writer's transaction reads the clock (Last,
// Observe) while it applies received events. A clock that held its lock
// across the persist deadlocked the two (the mesh -join soak and
// TestSyncCyclesRunOnTheirOwn hung that way).
func TestClockIsReadableWhileAMarkIsPersisted(t *testing.T) {
	var c *Clock
	persist := func(messages.HLC) error {
		done := make(chan struct{})
		go func() { // the writer's transaction, running while we wait for it
			c.Observe(c.Last() + 1)
			close(done)
		}()
		select {
		case <-done:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("the clock was locked while its mark was persisted")
		}
	}
	wall := time.UnixMilli(1_800_000_000_000)
	c = New(func() time.Time { return wall }, 0, persist, time.Second)
	prev := messages.HLC(0)
	for i := range 3 {
		h, err := c.Now()
		if err != nil {
			t.Fatal(err)
		}
		if h <= prev {
			t.Fatalf("issue %d: %v not above %v", i, h, prev)
		}
		prev = h
		wall = wall.Add(2 * time.Second) // past the lease: the next Now persists again
	}
	if err := c.Reserve(prev + messages.HLC(uint64(5*time.Second.Milliseconds())<<16)); err != nil {
		t.Fatal(err)
	}
}

// Stop ends issuing and returns a mark below the leased one that is still
// above everything issued or observed, so a clock resumed from it never
// reissues and does not start a lease ahead of the wall clock.
func TestStopReturnsTheLastValueAndIssuesNothing(t *testing.T) {
	w := &fakeWall{t: time.UnixMilli(9_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, 10*time.Second)
	var issued messages.HLC
	for range 3 {
		var err error
		if issued, err = c.Now(); err != nil {
			t.Fatal(err)
		}
	}
	c.Observe(issued + 5)
	h := c.Stop()
	if h != issued+5 || h >= s.hw {
		t.Fatalf("Stop = %v, want %v (the last observed) below the leased mark %v", h, issued+5, s.hw)
	}
	if _, err := c.Now(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Now after Stop: %v, want ErrStopped", err)
	}
	if err := c.Reserve(h + 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("Reserve after Stop: %v, want ErrStopped", err)
	}
	c2 := New(w.now, h, s.persist, 10*time.Second)
	n, err := c2.Now()
	if err != nil {
		t.Fatal(err)
	}
	if n != h+1 {
		t.Fatalf("resumed from the stopped value: issued %v, want %v", n, h+1)
	}
}
