package idle

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

// idler touches its timer on every message but the tick and reports each
// tick's verdict.
type idler struct {
	timer *Timer
	fired chan bool
}

// poke is activity; done, when set, is closed once it was handled.
type poke struct{ done chan struct{} }

func (a *idler) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *Tick:
		a.fired <- a.timer.Fired(ctx, m)
	case *actor.Stopping:
		a.timer.Stop()
	case poke:
		a.timer.Touch(ctx)
		if m.done != nil {
			close(m.done)
		}
	}
}

func spawn(t *testing.T, tm *Timer) (*actor.ActorSystem, *actor.PID, *idler) {
	t.Helper()
	sys := actortest.System(t)
	a := &idler{timer: tm, fired: make(chan bool, 1024)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }))
	t.Cleanup(func() { _ = sys.Root.PoisonFuture(pid).Wait() })
	return sys, pid, a
}

func verdict(t *testing.T, a *idler) bool {
	t.Helper()
	select {
	case v := <-a.fired:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("no tick")
		return false
	}
}

// touch sends a poke and waits until the actor handled it.
func touch(sys *actor.ActorSystem, pid *actor.PID) {
	done := make(chan struct{})
	sys.Root.Send(pid, poke{done: done})
	<-done
}

// untilIdle waits for a tick that says idle, skipping those that did not.
func untilIdle(t *testing.T, a *idler) {
	t.Helper()
	for !verdict(t, a) {
	}
}

// The idle verdict goes by the actor's own clock reading at Touch and at
// the tick (an injected clock here, so the test does not depend on how
// fast the machine is): a tick that arrives before the duration elapsed
// since the last Touch re-arms the timer and says not idle; one after it
// says idle; the next Touch arms the timer again.
func TestFiredOnlyAfterTheDurationWithoutActivity(t *testing.T) {
	var fake atomic.Int64 // ns
	tm := New(time.Millisecond)
	tm.now = func() time.Time { return time.Unix(0, fake.Load()) }
	sys, pid, a := spawn(t, tm)

	touch(sys, pid) // arms; the clock does not move
	for range 3 {   // each tick re-arms for what is left: never idle
		if verdict(t, a) {
			t.Fatal("idle although no time passed since the last message")
		}
	}
	fake.Add(int64(time.Millisecond))
	untilIdle(t, a)
	select {
	case v := <-a.fired:
		t.Fatalf("a tick (%v) after the timer fired and nothing touched it", v)
	case <-time.After(20 * time.Millisecond):
	}
	touch(sys, pid) // arms again
	fake.Add(int64(time.Millisecond))
	untilIdle(t, a)
}

// Fired ignores a tick of another timer and one that arrives after Stop.
func TestFiredIgnoresForeignAndStoppedTicks(t *testing.T) {
	tm := New(time.Hour)
	other := New(time.Hour)
	sys, pid, a := spawn(t, tm)
	touch(sys, pid)
	sys.Root.Send(pid, &Tick{t: other})
	if verdict(t, a) {
		t.Fatal("another timer's tick fired this one")
	}
	sys.Root.Send(pid, &Tick{t: tm}) // armed, but an hour is not over
	if verdict(t, a) {
		t.Fatal("fired before its duration")
	}
	if tm.Fired(nil, nil) {
		t.Fatal("a nil tick fired")
	}
	tm.Stop()
	tm.last = time.Time{} // long idle
	sys.Root.Send(pid, &Tick{t: tm})
	if verdict(t, a) {
		t.Fatal("a tick after Stop fired")
	}
}

// A busy actor whose timer is short fires many ticks while messages keep
// arriving; under -race this shows the timer goroutine touches no actor
// state (protoactor's SetReceiveTimeout does, and is reported here).
func TestBusyActorWithShortTimerHasNoRace(t *testing.T) {
	tm := New(50 * time.Microsecond)
	sys, pid, a := spawn(t, tm)
	go func() {
		for range a.fired {
		}
	}()
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		sys.Root.Send(pid, poke{})
		time.Sleep(20 * time.Microsecond)
	}
}
