package mailbox

import (
	"runtime"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Pool is a protoactor dispatcher that runs mailboxes on long-lived
// goroutines. protoactor's default dispatcher starts a new goroutine each
// time an idle mailbox gets a message; a goroutine starts with a small
// stack, and an actor whose work goes deep (decrypting, decoding, a bbolt
// transaction) grows and copies that stack on every such start — several
// per cent of the CPU of a delivered message. A Pool hands the mailbox to
// a parked worker whose stack has already grown; when none is parked it
// starts a goroutine as the default does (Schedule never blocks and never
// waits for another mailbox), which parks afterwards while fewer than
// maxIdle workers are parked, and otherwise ends.
type Pool struct {
	work       chan func()
	idle       atomic.Int32
	maxIdle    int32
	throughput int
}

// NewPool returns a Pool keeping at most maxIdle parked workers (at least
// 1); throughput is the messages a mailbox processes before it yields
// (protoactor's default is 300).
func NewPool(maxIdle, throughput int) *Pool {
	return &Pool{work: make(chan func()), maxIdle: int32(max(1, maxIdle)), throughput: throughput}
}

// Schedule implements actor.Dispatcher.
func (p *Pool) Schedule(fn func()) {
	select {
	case p.work <- fn: // a parked worker took it
	default:
		go p.run(fn)
	}
}

// Throughput implements actor.Dispatcher.
func (p *Pool) Throughput() int { return p.throughput }

func (p *Pool) run(fn func()) {
	for {
		fn()
		if p.idle.Add(1) > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		fn = <-p.work
		p.idle.Add(-1)
	}
}

// pooled is the process's pool for actors on the delivery hot path: its
// parked workers are shared by every node of the process, so they do not
// add to the memory of a hosted device.
var pooled = NewPool(4*runtime.GOMAXPROCS(0), 300)

// Pooled is the props option that runs an actor's mailbox on the
// process's Pool.
func Pooled() actor.PropsOption { return actor.WithDispatcher(pooled) }
