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
