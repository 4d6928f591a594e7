package session

import (
	"context"
	"sync"

	"github.com/syncmesh/syncmesh/messages"
)

// Ordered hand-off. A peer actor encrypts one peer's envelopes in chain
// order and the committer makes their writes durable, and answers them, in
// that order; but each caller used to hand its envelope to the transport
// from its own goroutine, so envelopes reached the link in the order the
// callers' goroutines woke up. With many in flight most of them arrived
// out of order: the receiver then derived and stored a skipped message
// key for every gap (DR §3.5 SkipMessageKeys), grew the session record it
// re-encodes and seals at every commit, and copied the skipped list at
// every decrypt. The committer's goroutine now queues each durable
// envelope on its peer's hand-off queue, in commit order, and one goroutine
// per peer with a non-empty queue hands them to the transport in that
// order; the caller waits for its own envelope's hand-off and reports its
// error as before.

// handoffs holds the hand-off queue of every peer with envelopes waiting
// (a peer's entry is removed as soon as its queue is empty: idle devices
// keep nothing).
type handoffs struct {
	mu    sync.Mutex
	peers map[messages.DeviceAddress]*handoffQueue
}

type handoffQueue struct {
	queue []*ticket
}

// ticket is one durable envelope waiting for, or done with, its hand-off.
type ticket struct {
	ctx  context.Context
	env  []byte
	done chan struct{}
	err  error // the transport's answer, set before done is closed
}

// enqueueHandoff queues env for peer behind the envelopes already queued
// for it. It never blocks: the committer's goroutine calls it, in commit
// order, before it answers the envelope's caller.
func (m *Manager) enqueueHandoff(ctx context.Context, peer messages.DeviceAddress, env []byte) *ticket {
	t := &ticket{ctx: ctx, env: env, done: make(chan struct{})}
	h := &m.handoffs
	h.mu.Lock()
	q := h.peers[peer]
	start := q == nil
	if start {
		if h.peers == nil {
			h.peers = map[messages.DeviceAddress]*handoffQueue{}
		}
		q = &handoffQueue{}
		h.peers[peer] = q
	}
	q.queue = append(q.queue, t)
	h.mu.Unlock()
	if start {
		go m.drainHandoffs(peer, q)
	}
	return t
}

// drainHandoffs hands q's envelopes to the transport one after the other
// until q is empty (never on the committer's goroutine: a transport may
// deliver synchronously).
func (m *Manager) drainHandoffs(peer messages.DeviceAddress, q *handoffQueue) {
	h := &m.handoffs
	for {
		h.mu.Lock()
		if len(q.queue) == 0 {
			delete(h.peers, peer)
			h.mu.Unlock()
			return
		}
		t := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		h.mu.Unlock()
		t.err = m.cfg.Transport.Send(t.ctx, peer, t.env)
		close(t.done)
	}
}

// wait returns the transport's answer to t's hand-off, or ctx's error when
// ctx ends first (the envelope is handed over all the same: it is durable,
// and a copy is harmless to the receiver).
func (t *ticket) wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ackHandoff queues a durable ACK envelope (none when its encryption
// failed: ackErr).
func (m *Manager) ackHandoff(ctx context.Context, peer messages.DeviceAddress, env []byte, ackErr error) *handoff {
	h := &handoff{env: env, err: ackErr}
	if ackErr == nil {
		h.t = m.enqueueHandoff(ctx, peer, env)
	}
	return h
}
