package replicate

import (
	"slices"
	"sync"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// OwnWrites tracks this node's local writes between the moment their HLC
// is issued and the moment they are durable in the log. It is what lets a
// node state a watermark for its own groups (SSP/1 §14.2): when no write
// of group g is in flight, every own event of g at or below the clock's
// last value is in the log, because an own event enters the log only
// through a local write.
//
// It is a small synchronization primitive of the write path rather than an
// actor: issuing the HLC and registering it must be one step, and the
// write path must not pay a mailbox round trip per write.
//
// Events signed with Node.Sign (tools) and applied later are outside this
// accounting: a watermark may already cover their HLC.
type OwnWrites struct {
	issuing  sync.Mutex                              // serializes Begin's issue-and-register; never held by Safe
	mu       sync.Mutex                              // guards the fields below; never held across issue
	inflight map[persistence.GroupKey][]messages.HLC // ascending
	issued   messages.HLC                            // highest HLC Begin issued, or the floor
}

// NewOwnWrites returns a tracker with nothing in flight; Safe starts at
// floor. Every own event at or below floor must be durable (after a
// restart nothing is in flight: the newest own event in the log, or any
// lower value, which only claims less), and the clock must issue only
// values above it (it resumes above its persisted high water).
func NewOwnWrites(floor messages.HLC) *OwnWrites {
	return &OwnWrites{inflight: map[persistence.GroupKey][]messages.HLC{}, issued: floor}
}

// Begin issues an HLC with issue and registers it as in flight for g, in
// one step.
//
// issue may wait for the store (the clock persists its high water), and a
// store writer may ask Safe: so o.mu is not held across issue (that would
// deadlock with the push committer). Begins are serialized by o.issuing
// instead: one issue at a time, and its HLC is above issued (the clock is
// monotonic), so until it is registered Safe's answer (at most issued)
// stays below it.
func (o *OwnWrites) Begin(g persistence.GroupKey, issue func() (messages.HLC, error)) (messages.HLC, error) {
	o.issuing.Lock()
	defer o.issuing.Unlock()
	h, err := issue()
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if h > o.issued {
		o.issued = h
	}
	s := o.inflight[g]
	i, _ := slices.BinarySearch(s, h)
	o.inflight[g] = slices.Insert(s, i, h)
	return h, nil
}

// End marks the write at h as finished. durable is false when the write
// failed in a way that leaves its outcome unknown (it may still commit):
// h then stays registered, so the group's own watermark stays below it
// until the node restarts (fail closed, SSP/1 §14.2).
func (o *OwnWrites) End(g persistence.GroupKey, h messages.HLC, durable bool) {
	if !durable {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.inflight[g]
	if i, ok := slices.BinarySearch(s, h); ok {
		s = slices.Delete(s, i, i+1)
	}
	if len(s) == 0 {
		delete(o.inflight, g)
	} else {
		o.inflight[g] = s
	}
}

// Safe returns the highest HLC h such that every own event of g at or
// below h is durable; ok is false when nothing can be stated. It never
// decreases while the node runs (across a restart it resumes at
// NewOwnWrites' floor).
func (o *OwnWrites) Safe(g persistence.GroupKey) (h messages.HLC, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.inflight[g]; len(s) > 0 {
		if s[0] == 0 {
			return 0, false
		}
		return s[0] - 1, true
	}
	// An issue in progress yields an HLC above issued (see Begin).
	return o.issued, o.issued != 0
}
