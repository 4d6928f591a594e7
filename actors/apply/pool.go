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
// While the store's single writer commits (setWriting), the pool runs one
// job fewer than its limit (never fewer than one): the writer is the one
// stage that cannot be parallelized, and with every core verifying, the
// scheduler gave it only its share of the cores — on two cores a third
// of the time went to the verifiers, which then waited for it. Verifying
// batch k+1 on the cores the writer leaves while batch k commits is the
// pipeline; on one core nothing changes.
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
	// running counts the jobs running; writing is set while the writer
	// commits. wake (on mu) is signalled when writing ends.
	running int
	writing bool
	wake    *sync.Cond
}

func (p *verifyPool) max() int {
	if p.limit > 0 {
		return p.limit
	}
	return runtime.GOMAXPROCS(0)
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
	for start := min(p.max(), len(p.queue)-p.head) - p.workers; start > 0; start-- {
		p.workers++
		go p.work()
	}
	p.mu.Unlock()
	wg.Wait()
}

// setWriting records whether the store's writer is committing (the
// committer's hook: it never blocks).
func (p *verifyPool) setWriting(busy bool) {
	p.mu.Lock()
	p.writing = busy
	if !busy && p.wake != nil {
		p.wake.Broadcast()
	}
	p.mu.Unlock()
}

func (p *verifyPool) work() {
	p.mu.Lock()
	for {
		for p.writing && p.head < len(p.queue) && p.running >= max(1, p.max()-1) {
			if p.wake == nil {
				p.wake = sync.NewCond(&p.mu)
			}
			p.wake.Wait()
		}
		if p.head == len(p.queue) {
			p.queue, p.head = p.queue[:0], 0
			p.workers--
			p.mu.Unlock()
			return
		}
		j := p.queue[p.head]
		p.queue[p.head] = nil
		p.head++
		p.running++
		p.mu.Unlock()
		j()
		p.mu.Lock()
		p.running--
	}
}
