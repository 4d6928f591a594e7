package apply

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// The pool runs every job of every caller exactly once before that
// caller's run returns, never more than its limit at once.
func TestVerifyPoolRunsEveryJobOnceWithinTheLimit(t *testing.T) {
	for _, limit := range []int{1, 2, 0} {
		p := &verifyPool{limit: limit}
		want := limit
		if want == 0 {
			want = runtime.GOMAXPROCS(0)
		}
		var running, peak atomic.Int64
		const callers, jobs = 8, 50
		counts := make([][jobs]atomic.Int64, callers)
		var wg sync.WaitGroup
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				js := make([]func(), jobs)
				for i := range js {
					js[i] = func() {
						n := running.Add(1)
						for {
							old := peak.Load()
							if n <= old || peak.CompareAndSwap(old, n) {
								break
							}
						}
						counts[c][i].Add(1)
						running.Add(-1)
					}
				}
				p.run(js)
				for i := range js {
					if got := counts[c][i].Load(); got != 1 {
						t.Errorf("limit %d: caller %d job %d ran %d times before run returned", limit, c, i, got)
					}
				}
			}()
		}
		wg.Wait()
		if got := peak.Load(); got > int64(want) || got < 1 {
			t.Fatalf("limit %d: %d jobs ran at once, want 1..%d", limit, got, want)
		}
	}
}

// Jobs run in arrival order: a caller queued behind another runs only
// after every job queued before it started (one worker makes the order
// observable).
func TestVerifyPoolIsFirstComeFirstServed(t *testing.T) {
	p := &verifyPool{limit: 1}
	var mu sync.Mutex
	var order []string
	log := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	release := make(chan struct{})
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		p.run([]func(){
			func() { <-release; log("a0") },
			func() { log("a1") },
			func() { log("a2") },
		})
	}()
	// Wait until a0 holds the only worker and a1, a2 are queued.
	for {
		p.mu.Lock()
		queued := len(p.queue) - p.head
		p.mu.Unlock()
		if queued == 2 {
			break
		}
		runtime.Gosched()
	}
	secondDone := make(chan struct{})
	go func() {
		defer close(secondDone)
		p.run([]func(){func() { log("b0") }, func() { log("b1") }})
	}()
	for {
		p.mu.Lock()
		queued := len(p.queue) - p.head
		p.mu.Unlock()
		if queued == 4 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	<-firstDone
	<-secondDone
	if want := []string{"a0", "a1", "a2", "b0", "b1"}; !slices.Equal(order, want) {
		t.Fatalf("ran %v, want %v", order, want)
	}
}

// While the writer commits the pool runs one job fewer than its limit
// (never none), so the single writer keeps a core; once it is done every
// worker runs again. No job is lost or stalled either way.
func TestVerifyPoolLeavesTheWriterACore(t *testing.T) {
	for _, limit := range []int{1, 2, 3} {
		p := &verifyPool{limit: limit}
		p.setWriting(true)
		var running, peak atomic.Int64
		const callers, jobs = 4, 40
		var wg sync.WaitGroup
		var ran atomic.Int64
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				js := make([]func(), jobs)
				for i := range js {
					js[i] = func() {
						n := running.Add(1)
						for {
							old := peak.Load()
							if n <= old || peak.CompareAndSwap(old, n) {
								break
							}
						}
						runtime.Gosched()
						ran.Add(1)
						running.Add(-1)
					}
				}
				p.run(js)
			}()
		}
		wg.Wait() // every job ran while the writer was busy
		if want := int64(max(1, limit-1)); peak.Load() > want || ran.Load() != callers*jobs {
			t.Fatalf("limit %d, writer busy: %d jobs at once (want at most %d), %d of %d ran", limit, peak.Load(), want, ran.Load(), callers*jobs)
		}
		// The writer done: the full limit again (the bound only; the
		// scheduler decides whether it is reached).
		p.setWriting(false)
		peak.Store(0)
		release := make(chan struct{})
		started := make(chan struct{}, limit)
		done := make(chan struct{})
		go func() {
			defer close(done)
			js := make([]func(), limit)
			for i := range js {
				js[i] = func() { started <- struct{}{}; <-release }
			}
			p.run(js)
		}()
		// All limit jobs start together: none waits for another to end.
		for i := 0; i < limit; i++ {
			<-started
		}
		close(release)
		<-done
	}
}
