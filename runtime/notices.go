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
	n.system.EventStream.Publish(NoticeEvent{Node: n, Notice: x})
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
// stalls the sync groups. The returned func cancels the subscription.
func (n *Node) Subscribe(fn func(messages.Notice)) (cancel func()) {
	pid := n.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &subscriber{fn: fn} }))
	return n.SubscribePID(pid)
}

// SubscribePID sends every notice of this node, as a NoticeEvent, to an
// actor (for custom actors). The returned func cancels it and stops
// nothing.
func (n *Node) SubscribePID(pid *actor.PID) (cancel func()) {
	root := n.system.Root
	sub := n.system.EventStream.SubscribeWithPredicate(func(evt any) {
		root.Send(pid, evt)
	}, func(evt any) bool {
		ev, ok := evt.(NoticeEvent)
		return ok && ev.Node == n
	})
	n.subsMu.Lock()
	if n.subs != nil {
		n.subs[sub] = pid
	}
	n.subsMu.Unlock()
	return func() {
		n.system.EventStream.Unsubscribe(sub)
		n.subsMu.Lock()
		delete(n.subs, sub)
		n.subsMu.Unlock()
	}
}
