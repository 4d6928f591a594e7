package runtime

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
)

// NoticeEvent is what the node publishes on its actor system's event
// stream: a notice and the node it comes from (several nodes may share a
// system). Custom actors subscribe with SubscribePID.
type NoticeEvent struct {
	Node   *Node
	Notice messages.Notice
}

func (n *Node) publish(x messages.Notice) {
	n.metrics.notice(x)
	ev := NoticeEvent{Node: n, Notice: x}
	// The node's own subscribers directly (a subscription on the shared
	// event stream per node would make every publish cost one predicate
	// per node hosted on the system), then the event stream for whoever
	// listens there.
	n.subsMu.Lock()
	for _, s := range n.subs {
		if s.q != nil {
			if s.q.push(x) {
				n.metrics.noticesMissed.Inc()
			}
			continue
		}
		n.system.Root.Send(s.pid, ev)
	}
	n.subsMu.Unlock()
	n.system.EventStream.Publish(ev)
}

// DefaultNoticeQueue is Config.NoticeQueue's default.
const DefaultNoticeQueue = 1024

// noticeQueue is one Subscribe callback's queue: at most limit entries,
// the last of which may be a NoticesMissed counting what did not fit. A
// peer can cause a notice per event it sends (every dropped event is one),
// so an unbounded queue behind a slow callback is memory the peer chooses
// the size of; this one holds limit notices however far behind fn is.
type noticeQueue struct {
	mu     sync.Mutex
	wake   chan struct{} // one token: entries may be waiting
	items  []messages.Notice
	limit  int
	closed bool
}

func newNoticeQueue(limit int) *noticeQueue {
	if limit < 2 {
		limit = 2 // one notice and one NoticesMissed after it
	}
	return &noticeQueue{wake: make(chan struct{}, 1), limit: limit}
}

// push queues x, or counts it missed when the queue is full; it reports
// whether x was missed. Only a NoticesMissed ever takes the last place, so
// a missed notice is counted at its place in the order.
func (q *noticeQueue) push(x messages.Notice) (missed bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	if len(q.items) >= q.limit-1 {
		missed = true
		if m, ok := q.items[len(q.items)-1].(messages.NoticesMissed); ok {
			m.Count++
			q.items[len(q.items)-1] = m
		} else {
			q.items = append(q.items, messages.NoticesMissed{Count: 1})
		}
	} else {
		q.items = append(q.items, x)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return missed
}

// pop takes the oldest entry; ok is false once the queue is closed.
func (q *noticeQueue) pop() (x messages.Notice, ok bool) {
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return nil, false
		}
		if len(q.items) > 0 {
			x = q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			if len(q.items) == 0 {
				q.items = nil // let the backing array go
			}
			q.mu.Unlock()
			return x, true
		}
		q.mu.Unlock()
		<-q.wake
	}
}

// close ends delivery: what is queued is discarded.
func (q *noticeQueue) close() {
	q.mu.Lock()
	q.closed, q.items = true, nil
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Subscribe calls fn with every notice of this node (resurrections,
// partial rebuilds, dropped, rejected and held events, ignored columns,
// released groups), in order, on a goroutine of its own: a slow fn never
// stalls the sync groups. When fn falls Config.NoticeQueue notices behind,
// the notices that do not fit are not kept: fn receives one
// messages.NoticesMissed with their count in their place, and
// syncmesh_sync_notices_missed_total counts them. The returned func
// cancels the subscription (notices still queued are discarded); Close
// cancels it too.
func (n *Node) Subscribe(fn func(messages.Notice)) (cancel func()) {
	limit := n.cfg.NoticeQueue
	if limit == 0 {
		limit = DefaultNoticeQueue
	}
	q := newNoticeQueue(limit)
	go func() {
		for {
			x, ok := q.pop()
			if !ok {
				return
			}
			fn(x)
		}
	}()
	return n.subscribe(noticeSub{q: q})
}

// SubscribePID sends every notice of this node, as a NoticeEvent, to an
// actor (for custom actors), in order. The returned func cancels it and
// stops nothing.
//
// The actor's mailbox is its own and unbounded: an actor that cannot keep
// up with a flood of notices should use Subscribe, whose queue is bounded.
func (n *Node) SubscribePID(pid *actor.PID) (cancel func()) { return n.subscribe(noticeSub{pid: pid}) }

// noticeSub is one subscription: a Subscribe queue, or an actor.
type noticeSub struct {
	q   *noticeQueue
	pid *actor.PID
}

func (s noticeSub) stop() {
	if s.q != nil {
		s.q.close()
	}
}

func (n *Node) subscribe(sub noticeSub) (cancel func()) {
	n.subsMu.Lock()
	defer n.subsMu.Unlock()
	if n.subs == nil { // closed
		sub.stop()
		return func() {}
	}
	n.subSeq++
	id := n.subSeq
	n.subs[id] = sub
	return func() {
		n.subsMu.Lock()
		s, ok := n.subs[id]
		delete(n.subs, id)
		n.subsMu.Unlock()
		if ok {
			s.stop()
		}
	}
}
