package runtime_test

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/runtime"
)

// cacheHolder is a custom actor that drops what it holds once it has had
// no message for a while.
type cacheHolder struct {
	idle    *runtime.IdleTimer
	held    []byte
	dropped chan<- int
}

func (a *cacheHolder) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *runtime.IdleTick:
		if a.idle.Fired(ctx, m) {
			a.dropped <- len(a.held)
			a.held = nil
		}
		return
	case *actor.Stopping:
		a.idle.Stop()
		return
	case []byte:
		a.held = append(a.held, m...)
	}
	a.idle.Touch(ctx) // every other message restarts the idle period
}

// An idle timer for a custom actor: the tick arrives as a message, so the
// actor's state changes only on its own goroutine.
func ExampleNewIdleTimer() {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	dropped := make(chan int, 1)
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &cacheHolder{idle: runtime.NewIdleTimer(10 * time.Millisecond), dropped: dropped}
	}))
	sys.Root.Send(pid, []byte("cached"))
	fmt.Println("dropped", <-dropped, "bytes once idle")
	// Output: dropped 6 bytes once idle
}
