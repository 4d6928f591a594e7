package device_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// The crash windows once more with a real process abort: a child process
// receives one message on a bbolt file and calls os.Exit at a failpoint of
// the receive transaction; the parent reopens the file and checks the
// state the table names.
const abortEnv = "SYNCMESH_DEVICE_ABORT_AT"

func TestProcessAbortAtReceiveFailpoints(t *testing.T) {
	if os.Getenv(abortEnv) != "" {
		abortChild()
		return
	}
	for _, tc := range []struct {
		failpoint string
		pending   int
	}{
		{bolt.FailpointDeliveryUpdateBeforeCommit, 0}, // row 1: nothing persisted
		{bolt.FailpointDeliveryUpdateAfterCommit, 1},  // row 2: pending, delivered again
	} {
		t.Run(tc.failpoint, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bob.db")
			cmd := exec.Command(os.Args[0], "-test.run=^TestProcessAbortAtReceiveFailpoints$")
			cmd.Env = append(os.Environ(), abortEnv+"="+tc.failpoint, "SYNCMESH_DEVICE_ABORT_PATH="+path)
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Fatalf("child: %v (want exit 3)\n%s", err, out)
			}
			ms := newMesh(t)
			b := &dev{ms: ms, addr: bobAddr, path: path}
			b.openDB()
			b.start()
			msgs := b.pendingAll()
			if len(msgs) != tc.pending {
				t.Fatalf("%d pending after an abort at %s, want %d", len(msgs), tc.failpoint, tc.pending)
			}
			if tc.pending == 1 && string(msgs[0].Plaintext) != "survives the abort" {
				t.Fatalf("pending message %q", msgs[0].Plaintext)
			}
		})
	}
}

// abortChild runs in the child process: alice (memory) sends to bob (the
// bbolt file), bob receives with the failpoint armed to exit the process.
func abortChild() {
	at, path := os.Getenv(abortEnv), os.Getenv("SYNCMESH_DEVICE_ABORT_PATH")
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	net := session.NewInProcess()
	a, err := device.Open(context.Background(), sys, device.Config{Store: newMemoryStore(), Transport: net.Endpoint(aliceAddr),
		Session: func(c *session.Config) { c.RefreshInterval = -1 }})
	if err != nil {
		os.Exit(11)
	}
	net.Register(aliceAddr, a.Sessions())
	var armed atomic.Bool
	db, err := bolt.Open(path, bolt.Options{Failpoint: func(name string) error {
		if armed.Load() && name == at {
			os.Exit(3) // the process dies here
		}
		return nil
	}})
	if err != nil {
		os.Exit(12)
	}
	b, err := device.Open(context.Background(), sys, device.Config{Store: db.Delivery(), Transport: net.Endpoint(bobAddr),
		Session: func(c *session.Config) { c.RefreshInterval = -1 }})
	if err != nil {
		os.Exit(13)
	}
	net.Register(bobAddr, b.Sessions())
	if _, err := a.Send(context.Background(), bobAddr, []byte("survives the abort")); err != nil {
		os.Exit(14)
	}
	env := net.Take(bobAddr)
	if len(env) != 1 {
		os.Exit(15)
	}
	armed.Store(true)
	_, _ = b.Receive(context.Background(), env[0].From, env[0].Envelope)
	os.Exit(16) // not reached: the failpoint exits first
}
