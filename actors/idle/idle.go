// Package idle is an actor's idle timer: a Tick sent to the actor itself
// once it has had no other message for a while, for passivation and for
// dropping caches an idle actor should not hold.
//
// protoactor-go's SetReceiveTimeout is not used for this: its timer
// goroutine cancels the timeout by writing the actor context's fields
// (the timer, the duration) while the actor's goroutine reads them in
// InvokeUserMessage, a data race the race detector reports under load and,
// when the two interleave badly, a nil timer dereference on the actor's
// goroutine. Here the timer goroutine does one thing, send a message; all
// state is the actor's and changes only on its goroutine.
package idle

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Tick is the message a Timer sends. An actor passes it to Timer.Fired.
type Tick struct{ t *Timer }

// IgnoreDeadLetterLogging implements actor.IgnoreDeadLetterLogging: a
// tick that was in flight when its actor stopped has nobody to tell.
func (*Tick) IgnoreDeadLetterLogging() {}

// Timer fires once its actor has been idle for its duration. The zero
// value is not usable: use New. A Timer belongs to one actor and is used
// only on that actor's goroutine (in Receive).
type Timer struct {
	d     time.Duration
	now   func() time.Time
	last  time.Time
	armed bool // a tick is scheduled or in the mailbox: at most one is
	t     *time.Timer
	send  func()
}

// New returns a timer for an actor idle after d (d > 0).
func New(d time.Duration) *Timer { return &Timer{d: d, now: time.Now} }

// Touch records activity (call it for every message but the Tick) and
// arms the timer if no tick is pending.
func (t *Timer) Touch(ctx actor.Context) {
	t.last = t.now()
	if !t.armed {
		t.arm(ctx, t.d)
	}
}

// Fired reports whether tick means the actor has been idle for the
// timer's duration since the last Touch. If it has not (there was
// activity since the tick was scheduled), the timer is armed again for
// what is left. After it reports true, the next Touch arms it again.
func (t *Timer) Fired(ctx actor.Context, tick *Tick) bool {
	if tick == nil || tick.t != t || !t.armed {
		return false // not this timer's, or stopped since it was sent
	}
	t.armed = false
	if left := t.d - t.now().Sub(t.last); left > 0 {
		t.arm(ctx, left)
		return false
	}
	return true
}

// Stop releases the timer (on actor.Stopping). A tick already sent is
// then ignored by Fired.
func (t *Timer) Stop() {
	t.armed = false
	if t.t != nil {
		t.t.Stop()
	}
}

func (t *Timer) arm(ctx actor.Context, d time.Duration) {
	t.armed = true
	if t.t == nil {
		// The root context's Send may be used from any goroutine; the
		// actor's own Context may not.
		root, self, tick := ctx.ActorSystem().Root, ctx.Self(), &Tick{t: t}
		t.send = func() { root.Send(self, tick) }
		t.t = time.AfterFunc(d, t.send)
		return
	}
	t.t.Reset(d)
}
