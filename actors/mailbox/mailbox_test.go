package mailbox

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type blocker struct{ release chan struct{} }

func (b *blocker) Receive(c actor.Context) {
	if _, ok := c.Message().(string); ok {
		<-b.release
	}
}

func TestDepthCountsQueuedMessages(t *testing.T) {
	reg := prometheus.NewRegistry()
	d, err := NewDepths(reg)
	if err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem()
	b := &blocker{release: make(chan struct{})}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return b }, d.Option("test")))
	for i := 0; i < 5; i++ {
		sys.Root.Send(pid, "work")
	}
	g := d.vec.WithLabelValues("test")
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(g) < 4 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if v := testutil.ToFloat64(g); v < 4 {
		t.Fatalf("depth %v with one message in process and four queued", v)
	}
	close(b.release)
	for testutil.ToFloat64(g) != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if v := testutil.ToFloat64(g); v != 0 {
		t.Fatalf("depth %v after the mailbox drained", v)
	}
	var nilDepths *Depths
	_ = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &blocker{} }, nilDepths.Option("x")))
}

type counter struct {
	n    int
	done chan int
}

func (c *counter) Receive(ctx actor.Context) {
	if v, ok := ctx.Message().(int); ok {
		c.n += v
		if v == 0 {
			c.done <- c.n
		}
	}
}

// A Pool runs every message exactly once, for many actors at once
// (more than it parks), and keeps at most maxIdle workers parked after.
func TestPoolRunsEveryMailboxAndParksBoundedWorkers(t *testing.T) {
	p := NewPool(2, 3)
	sys := actor.NewActorSystem()
	const actors, msgs = 16, 200
	done := make(chan int, actors)
	for i := 0; i < actors; i++ {
		c := &counter{done: done}
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return c }, actor.WithDispatcher(p)))
		go func() {
			for j := 1; j <= msgs; j++ {
				sys.Root.Send(pid, j)
			}
			sys.Root.Send(pid, 0)
		}()
	}
	for i := 0; i < actors; i++ {
		if got, want := <-done, msgs*(msgs+1)/2; got != want {
			t.Fatalf("an actor summed %d, want %d (a message lost or run twice)", got, want)
		}
	}
	if n := p.idle.Load(); n > 2 {
		t.Fatalf("%d parked workers, want at most 2", n)
	}
	if p.Throughput() != 3 {
		t.Fatalf("throughput %d", p.Throughput())
	}
}
