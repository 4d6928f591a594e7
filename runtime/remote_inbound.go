package runtime

import (
	"context"
	"strconv"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// The remote's inbound bound. Every envelope the stream guard lets
// through to the sync actor holds a token of one inbound pool from the
// moment the guard admits it until it is answered: a push's token comes
// back only once its answer was sent, any other envelope's once the sync
// actor handled it. A configured peer's pushes draw on that peer's own
// pool (2 × MaxConcurrentPushes tokens, at most MaxConcurrentPushes of
// them being handled at once); every other envelope draws on one shared
// pool of the same size. When a pool is empty the guard stops reading
// that stream (RecvMsg blocks), so gRPC flow control pushes back on the
// sender instead of a mailbox growing — and since the pools are per
// peer and the sync actor itself never waits, a flooding or stalled peer
// holds only its own share: another peer's pushes go on.
//
// The node holds at most (configured peers + 1) × 2 × MaxConcurrentPushes
// envelopes, whatever the peers send.

// inPool is one peer's share of the inbound bound.
type inPool struct {
	tokens chan struct{} // one per envelope admitted and not yet answered
	sem    chan struct{} // one per push being handled by the Receiver
}

// inbound is the remote's set of pools and the pool each admitted
// envelope holds a token of, keyed by its sender PID (a request's future,
// so unique per push; a repeated PID just queues).
type inbound struct {
	size, handlers int
	shared         *inPool

	mu     sync.Mutex
	pools  map[string]*inPool   // by configured peer name; never removed
	claims map[string][]*inPool // by sender PID key, in admission order

	waits, peak uint64 // guard waits for a token; most tokens one pool held
}

func newInbound(handlers int) *inbound {
	in := &inbound{size: 2 * handlers, handlers: handlers, pools: map[string]*inPool{}, claims: map[string][]*inPool{}}
	in.shared = in.newPool()
	return in
}

func (in *inbound) newPool() *inPool {
	return &inPool{tokens: make(chan struct{}, in.size), sem: make(chan struct{}, in.handlers)}
}

// pool returns the pool of a push from a configured peer (peer true), or
// the shared one.
func (in *inbound) pool(name string, peer bool) *inPool {
	if !peer {
		return in.shared
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	p := in.pools[name]
	if p == nil {
		p = in.newPool()
		in.pools[name] = p
	}
	return p
}

func senderKey(pid *actor.PID) string {
	if pid == nil {
		return ""
	}
	return pid.Address + "\x00" + pid.Id + "\x00" + strconv.FormatUint(uint64(pid.RequestId), 10)
}

// take takes a token of p for an envelope answered to sender; with wait
// false it gives up at once when p is empty.
func (in *inbound) take(ctx, base context.Context, p *inPool, sender *actor.PID, wait bool) (bool, error) {
	select {
	case p.tokens <- struct{}{}:
	default:
		if !wait {
			return false, nil
		}
		in.mu.Lock()
		in.waits++
		in.mu.Unlock()
		select {
		case p.tokens <- struct{}{}:
		case <-ctx.Done():
			return false, ctx.Err()
		case <-base.Done():
			return false, base.Err()
		}
	}
	k := senderKey(sender)
	in.mu.Lock()
	in.claims[k] = append(in.claims[k], p)
	if n := uint64(len(p.tokens)); n > in.peak {
		in.peak = n
	}
	in.mu.Unlock()
	return true, nil
}

// claimed returns the pool whose token the envelope answered to sender
// holds (nil if the guard took none for it).
func (in *inbound) claimed(sender *actor.PID) *inPool {
	k := senderKey(sender)
	in.mu.Lock()
	defer in.mu.Unlock()
	ps := in.claims[k]
	if len(ps) == 0 {
		return nil
	}
	p := ps[0]
	if len(ps) == 1 {
		delete(in.claims, k)
	} else {
		in.claims[k] = ps[1:]
	}
	return p
}

// release gives a token of p back.
func (p *inPool) release() {
	if p == nil {
		return
	}
	select {
	case <-p.tokens:
	default:
	}
}

// held counts the envelopes holding a token now, over every pool.
func (in *inbound) held() uint64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := len(in.shared.tokens)
	for _, p := range in.pools {
		n += len(p.tokens)
	}
	return uint64(n)
}

func (in *inbound) stats() (waits, peak uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.waits, in.peak
}
