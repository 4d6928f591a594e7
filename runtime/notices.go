package runtime

import (
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
		n.system.Root.Send(s.pid, ev)
	}
	n.subsMu.Unlock()
	n.system.EventStream.Publish(ev)
}

type subscriber struct{ fn func(messages.Notice) }

func (s *subscriber) Receive(ctx actor.Context) {
	if ev, ok := ctx.Message().(NoticeEvent); ok {
		s.fn(ev.Notice)
	}
}

// Subscribe calls fn with every notice of this node (resurrections,
// partial rebuilds, dropped, rejected and held events, ignored columns,
// released groups), in order, on a goroutine of its own: a slow fn never
// stalls the sync groups. The returned func cancels the subscription;
// Close cancels it too.
func (n *Node) Subscribe(fn func(messages.Notice)) (cancel func()) {
	pid := n.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &subscriber{fn: fn} }))
	return n.subscribe(pid, true)
}

// SubscribePID sends every notice of this node, as a NoticeEvent, to an
// actor (for custom actors), in order. The returned func cancels it and
// stops nothing.
func (n *Node) SubscribePID(pid *actor.PID) (cancel func()) { return n.subscribe(pid, false) }

type noticeSub struct {
	pid  *actor.PID
	owns bool // spawned by Subscribe: stopped with the subscription
}

func (n *Node) subscribe(pid *actor.PID, owns bool) (cancel func()) {
	n.subsMu.Lock()
	defer n.subsMu.Unlock()
	if n.subs == nil { // closed
		if owns {
			n.system.Root.Stop(pid)
		}
		return func() {}
	}
	n.subSeq++
	id := n.subSeq
	n.subs[id] = noticeSub{pid: pid, owns: owns}
	return func() {
		n.subsMu.Lock()
		s, ok := n.subs[id]
		delete(n.subs, id)
		n.subsMu.Unlock()
		if ok && s.owns {
			n.system.Root.Stop(s.pid)
		}
	}
}
