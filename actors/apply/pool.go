package apply

import (
	"runtime"
	"sync"
)

// verifyPool runs the pure checks of every caller of one chokepoint in
// arrival order, on at most GOMAXPROCS goroutines at a time.
//
// Without it each caller verified its own batch on GOMAXPROCS goroutines
// of its own: callers arriving together (a sender's window of pushes, or
// concurrent ApplySignedBatch callers) shared the cores and all finished
// verifying at about the same time, so their storage work reached the
// single committer together, and while it committed nothing was left to
// verify — verification and storage took turns instead of overlapping.
// In arrival order the first caller's sub-batches get every core and its
// events reach the committer while the next caller's are still being
// verified.
//
// Workers are started on demand and exit when the queue is empty: the
// pool holds no goroutine while idle and needs no shutdown.
type verifyPool struct {
	// limit is the most workers at once (0: GOMAXPROCS).
	limit   int
	mu      sync.Mutex
	queue   []func()
	head    int
	workers int
}

// run queues jobs (in order, behind every job queued before) and returns
// once all of them ran.
func (p *verifyPool) run(jobs []func()) {
	var wg sync.WaitGroup
	wg.Add(len(jobs))
	p.mu.Lock()
	for _, j := range jobs {
		p.queue = append(p.queue, func() { defer wg.Done(); j() })
	}
	limit := p.limit
	if limit <= 0 {
		limit = runtime.GOMAXPROCS(0)
	}
	for start := min(limit, len(p.queue)-p.head) - p.workers; start > 0; start-- {
		p.workers++
		go p.work()
	}
	p.mu.Unlock()
	wg.Wait()
}

func (p *verifyPool) work() {
	for {
		p.mu.Lock()
		if p.head == len(p.queue) {
			p.queue, p.head = p.queue[:0], 0
			p.workers--
			p.mu.Unlock()
			return
		}
		j := p.queue[p.head]
		p.queue[p.head] = nil
		p.head++
		p.mu.Unlock()
		j()
	}
}
