package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// The synced table the actor writes every delivered message into. Its key
// is the message's identity at the delivery plane (sender, logical id), so
// writing the same message twice addresses the same row.
const (
	inboxSchema = "inbox"
	inboxTable  = "messages"
)

// inboxDef is the table on the receiving node. The sender's node runs a
// newer version of the application with one more column ("note"); what it
// writes there is ignored here and reported by a ColumnsIgnored notice.
var (
	inboxDef      = runtime.TableDef{Schema: inboxSchema, Table: inboxTable, KeyColumns: []string{"sender", "id"}, Columns: []string{"body", "received_at"}}
	inboxDefNewer = runtime.TableDef{Schema: inboxSchema, Table: inboxTable, KeyColumns: []string{"sender", "id"}, Columns: []string{"body", "received_at", "note"}}
)

// callTimeout bounds each node call the actor makes.
const callTimeout = 10 * time.Second

// delivered is what the device's Handler sends the actor for each
// delivery; the actor answers with an applyResult (RequestFuture), so the
// Handler returns only once the message is written and committed: the
// device hands the next one after that, in order.
type delivered struct{ msg runtime.ReceivedMessage }

// applyResult is the actor's answer to a delivered message.
type applyResult struct {
	Written   bool                 // the row was upserted
	Committed bool                 // the commit returned Committed or AlreadyCommitted
	Status    runtime.CommitResult // the commit's result
	Crashed   bool                 // the demo's crash hook stopped it between write and commit
	Err       error
}

// statsRequest asks the actor for its counters (RequestFuture → inboxStats).
type statsRequest struct{}

// inboxStats is what the actor did so far.
type inboxStats struct {
	Writes, Commits int
	Notices         []messages.Notice
}

// inboxActor feeds the sync plane from the delivery plane: for each
// delivered message it (1) upserts the message into the synced table
// inbox.messages under key (sender, id), then (2) commits the message,
// which sends the ACK to the sender. It also receives the node's notices
// (runtime.NoticeEvent, through Node.SubscribePID).
type inboxActor struct {
	node *runtime.Node
	say  func(format string, args ...any)
	// crashAfterWrite, when it returns true for a message, makes the actor
	// stop between the write and the commit, as a process crash would.
	crashAfterWrite func(runtime.ReceivedMessage) bool
	stats           inboxStats
}

// Receive implements actor.Actor.
func (a *inboxActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.say("actor %s started on the node's actor system", c.Self().Id)
	case *delivered:
		c.Respond(a.apply(m.msg))
	case runtime.NoticeEvent:
		a.notice(m.Notice)
	case *statsRequest:
		s := a.stats
		s.Notices = append([]messages.Notice(nil), a.stats.Notices...)
		c.Respond(s)
	}
}

// apply writes then commits. The order is what makes it safe: the table
// write is idempotent (same key, same values: received_at is the time the
// device first stored the message, identical on every redelivery), the
// commit is not undoable. Committing first and crashing before the write
// would lose the message (the sender has its ACK, nothing is redelivered);
// writing first and crashing before the commit only means the message is
// delivered again on the next Open and written again, harmlessly.
func (a *inboxActor) apply(m runtime.ReceivedMessage) applyResult {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	key := map[string]any{"sender": m.Sender.String(), "id": m.ID.String()}
	vals := map[string]any{"body": string(m.Plaintext), "received_at": m.ReceivedAt.UnixMilli()}
	if _, err := a.node.Upsert(ctx, inboxSchema, inboxTable, key, vals); err != nil {
		a.say("actor: write of %s failed (%v): left pending, delivered again on the next Open", m.ID, err)
		return applyResult{Err: err}
	}
	a.stats.Writes++
	a.say("actor: wrote message %s from %s into %s.%s: %q", short(m.ID), m.Sender, inboxSchema, inboxTable, m.Plaintext)
	if a.crashAfterWrite != nil && a.crashAfterWrite(m) {
		a.say("actor: ** simulated crash between the write and the commit of %s **", short(m.ID))
		return applyResult{Written: true, Crashed: true}
	}
	res, err := a.node.CommitMessage(ctx, m)
	if err != nil {
		a.say("actor: commit of %s failed (%v): left pending", short(m.ID), err)
		return applyResult{Written: true, Err: err}
	}
	a.stats.Commits++
	a.say("actor: committed %s (%v, ACK sent: %v)", short(m.ID), res.Status, res.AckSent)
	return applyResult{Written: true, Committed: res.Status == runtime.Committed || res.Status == runtime.AlreadyCommitted, Status: res}
}

func (a *inboxActor) notice(n messages.Notice) {
	a.stats.Notices = append(a.stats.Notices, n)
	switch x := n.(type) {
	case messages.ColumnsIgnored:
		a.say("actor: notice ColumnsIgnored on %s.%s: a peer wrote columns %v this version does not have (schema rollout in progress)", x.Schema, x.Table, x.Columns)
	default:
		a.say("actor: notice %T %+v", n, n)
	}
}

// inbox attaches an inboxActor to one open node: DeviceConfig.Handler is
// built before the node exists, the actor can only be spawned on the
// node's system after Open, and Open already hands the Handler every
// message still pending from a previous run. So the Handler waits until
// the actor is spawned (ready), then forwards each delivery and waits for
// the actor's answer.
type inbox struct {
	ready chan struct{}
	once  sync.Once
	node  *runtime.Node
	pid   atomic.Pointer[actor.PID]
}

func newInbox() *inbox { return &inbox{ready: make(chan struct{})} }

// handler is the DeviceConfig.Handler: called by the device one delivery
// at a time, in order.
func (b *inbox) handler(ctx context.Context, m runtime.ReceivedMessage) {
	select {
	case <-b.ready:
	case <-ctx.Done():
		return // closing: the message stays pending
	}
	// The answer is not needed here: a message the actor did not commit
	// stays pending and is delivered again on the next Open.
	_, _ = b.node.System().Root.RequestFuture(b.pid.Load(), &delivered{msg: m}, callTimeout+time.Second).Result()
}

// spawn starts the actor on the node's actor system, subscribes it to the
// node's notices, and releases the Handler. Node.Close cancels the
// subscription and stops the actor (SubscribePID's cancel func, ignored
// here, would end the subscription earlier).
func (b *inbox) spawn(n *runtime.Node, a *inboxActor) *actor.PID {
	b.node, a.node = n, n
	pid := n.System().Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }))
	b.pid.Store(pid)
	_ = n.SubscribePID(pid)
	b.once.Do(func() { close(b.ready) })
	return pid
}

// stats asks the actor for its counters.
func (b *inbox) stats() (inboxStats, error) {
	r, err := b.node.System().Root.RequestFuture(b.pid.Load(), &statsRequest{}, callTimeout).Result()
	if err != nil {
		return inboxStats{}, err
	}
	s, ok := r.(inboxStats)
	if !ok {
		return inboxStats{}, fmt.Errorf("customactor: stats: unexpected answer %T", r)
	}
	return s, nil
}

func short(id runtime.MessageID) string { return id.String()[:8] }

func printer(w io.Writer) func(string, ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}
}
