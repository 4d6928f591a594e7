package runtime

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

// captureStd redirects stdout and stderr while fn runs.
func captureStd(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() { _, _ = io.Copy(&buf, r); close(done) }()
	fn()
	os.Stdout, os.Stderr = oldOut, oldErr
	w.Close()
	<-done
	return buf.String()
}

type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func deadLetter(n *Node) {
	pid := n.System().Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	_ = n.System().Root.StopFuture(pid).Wait()
	n.System().Root.Send(pid, "nobody is listening")
}

// protoactor's logging goes through the node's *slog.Logger and is quiet
// by default: nothing on stdout or stderr, dead letters still counted.
func TestProtoactorLogsRoutedAndQuietByDefault(t *testing.T) {
	out := captureStd(t, func() {
		n, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh})
		if err != nil {
			t.Error(err)
			return
		}
		deadLetter(n)
		time.Sleep(50 * time.Millisecond)
		tn := &testNode{Node: n, t: t}
		if got := counterValue(t, tn, "syncmesh_actor_dead_letters_total"); got < 1 {
			t.Errorf("dead letter not counted: %v", got)
		}
		n.Close()
	})
	if strings.TrimSpace(out) != "" {
		t.Fatalf("a default node wrote to stdout/stderr:\n%s", out)
	}

	rec := &recorder{}
	n, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	deadLetter(n)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		rec.mu.Lock()
		got := strings.Join(rec.msgs, "\n")
		rec.mu.Unlock()
		if strings.Contains(strings.ToLower(got), "dead") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("protoactor's dead-letter log did not reach the node's logger; got %q", rec.msgs)
}

// Nodes sharing an actor system do not each count its dead letters; the
// host counts them once with CountDeadLetters.
func TestSharedSystemCountsDeadLettersOnce(t *testing.T) {
	sys := actortest.System(t)
	reg := prometheus.NewRegistry()
	var nodes []*Node
	for i := 0; i < 3; i++ {
		n, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, System: sys, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	stop, err := CountDeadLetters(sys, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	deadLetter(nodes[0])
	tn := &testNode{Node: nodes[0], t: t}
	deadline := time.Now().Add(5 * time.Second)
	for counterValue(t, tn, "syncmesh_actor_dead_letters_total") < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := counterValue(t, tn, "syncmesh_actor_dead_letters_total"); got != 1 {
		t.Fatalf("one dead letter counted %v times", got)
	}
}
