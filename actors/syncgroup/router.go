package syncgroup

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
	"github.com/syncmesh/syncmesh/persistence"
)

// Router spawns and finds the group actors of one node.
type Router struct {
	system *actor.ActorSystem
	deps   Deps
	prefix string

	committer *actor.PID
	writing   atomic.Pointer[func(bool)]

	mu     sync.Mutex
	groups map[persistence.GroupKey]*actor.PID
	closed bool
	stops  invariants.Once
}

// NewRouter returns a router spawning group actors on system. prefix
// keeps actor names of several nodes on one system apart.
func NewRouter(system *actor.ActorSystem, prefix string, deps Deps) *Router {
	deps.Store = CheckWriters(deps.Store)
	claim(deps.Store)
	r := &Router{system: system, deps: deps, prefix: prefix, groups: make(map[persistence.GroupKey]*actor.PID)}
	c := &committer{store: deps.Store, writing: &r.writing}
	r.committer = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }, deps.Mailboxes.Option("sync_committer")))
	return r
}

// SetWriterHook sets f, which the committer calls with true before each
// transaction and with false once it ended, so the pure work that feeds
// it (signature checks) can leave the single writer a core (apply's
// verify pool). f must not block.
func (r *Router) SetWriterHook(f func(busy bool)) { r.writing.Store(&f) }

// PID returns the group's actor, spawning it on first use. ok is false
// after Stop.
func (r *Router) PID(key persistence.GroupKey) (*actor.PID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false
	}
	if pid, ok := r.groups[key]; ok {
		return pid, true
	}
	g := newGroupActor(key, r.deps, r.committer)
	props := actor.PropsFromProducer(func() actor.Actor { return g }, r.deps.Mailboxes.Option("sync_group"))
	pid := r.system.Root.Spawn(props)
	r.groups[key] = pid
	return pid, true
}

// Name is a stable, printable name for a group (for logs and metrics).
func Name(key persistence.GroupKey) string {
	h := sha256.Sum256([]byte(key.Schema + "\x00" + key.Table))
	return key.Site.String()[:8] + "-" + hex.EncodeToString(h[:4])
}

// Stop drains every group actor (pending requests are committed and
// answered), then stops the groups and the committer. Its owner calls it
// once (checked under the invariants tag); a second call does nothing.
func (r *Router) Stop(timeout time.Duration) {
	r.stops.Done("syncgroup.Router")
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	pids := make([]*actor.PID, 0, len(r.groups))
	for _, pid := range r.groups {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	deadline := time.After(timeout)
	for _, pid := range pids {
		done := make(chan struct{})
		r.system.Root.Send(pid, &drain{done: done})
		select {
		case <-done:
		case <-deadline:
		}
	}
	for _, pid := range pids {
		_ = r.system.Root.StopFuture(pid).Wait()
	}
	_ = r.system.Root.PoisonFuture(r.committer).Wait()
}

// Send delivers a message to a group actor.
func (r *Router) Send(pid *actor.PID, msg any) { r.system.Root.Send(pid, msg) }
