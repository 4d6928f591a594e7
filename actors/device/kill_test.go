package device_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// A SIGKILL between each step of the flow, across two processes: a child
// process runs alice and bob, each on its own bbolt file (fsync on), and
// kills itself at a failpoint of one step's transaction — before its
// commit or right after it became durable, before anything was handed
// over. The parent reopens both files and checks the state the crash-window
// tables name, then finishes the flow from there.
const killEnv = "SYNCMESH_DEVICE_KILL_AT"

func TestProcessKillBetweenEachStep(t *testing.T) {
	if os.Getenv(killEnv) != "" {
		killChild()
		return
	}
	before, after := bolt.FailpointDeliveryUpdateBeforeCommit, bolt.FailpointDeliveryUpdateAfterCommit
	for _, tc := range []struct {
		step, failpoint string
		// state after the kill
		senderPending, receiverPending int
		processed                      bool
	}{
		{"send", before, 0, 0, false},    // nothing stored: the message was never sent
		{"send", after, 1, 0, false},     // pending at the sender, not handed over: Resend
		{"receive", before, 1, 0, false}, // row 1: nothing persisted at the receiver
		{"receive", after, 1, 1, false},  // row 2: pending, delivered again
		{"commit", before, 1, 1, false},  // atomicity: still pending, unprocessed
		{"commit", after, 1, 0, true},    // row 5: processed, no ACK handed: the retry gets one
		{"ack", before, 1, 0, true},      // the ACK's receive rolled back: still pending, the retry is ACKed
		{"ack", after, 0, 0, true},       // cleared: the flow is complete
	} {
		t.Run(tc.step+"/"+tc.failpoint, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestProcessKillBetweenEachStep$")
			cmd.Env = append(os.Environ(), killEnv+"="+tc.step+"|"+tc.failpoint, "SYNCMESH_DEVICE_KILL_DIR="+dir)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v (want killed by SIGKILL)\n%s", err, out)
			}
			ms := newMesh(t)
			a := &dev{ms: ms, addr: aliceAddr, path: filepath.Join(dir, "alice.db")}
			a.openDB()
			a.start()
			b := &dev{ms: ms, addr: bobAddr, path: filepath.Join(dir, "bob.db")}
			b.openDB()
			b.start()
			sent := a.sentPending()
			if len(sent) != tc.senderPending {
				t.Fatalf("sender has %d pending after the kill, want %d", len(sent), tc.senderPending)
			}
			pending := b.pendingAll()
			if len(pending) != tc.receiverPending {
				t.Fatalf("receiver has %d pending after the kill, want %d", len(pending), tc.receiverPending)
			}
			if len(pending) == 1 && string(pending[0].Plaintext) != "survives the kill" {
				t.Fatalf("pending message %q", pending[0].Plaintext)
			}
			if len(sent) == 0 {
				return // never sent: nothing to finish
			}
			id := sent[0].ID
			if _, ok := b.processed(a, id); ok != tc.processed {
				t.Fatalf("processed entry after the kill: %v, want %v", ok, tc.processed)
			}
			// Finish the flow: the sender retries (there is no automatic
			// retry); the receiver delivers again or ACKs again.
			a.resend(b, id)
			r := b.mustRecv(b.takeOne())
			switch {
			case tc.processed:
				if r.Kind != device.AlreadyCommitted || !r.AckSent {
					t.Fatalf("retry after a kill after the commit = %+v", r)
				}
			case r.Kind != device.Delivery || string(r.Message.Plaintext) != "survives the kill":
				t.Fatalf("retry = %+v", r)
			case len(pending) == 1 && r.Message.Sequence != pending[0].Sequence:
				t.Fatalf("redelivered with sequence %d, was %d", r.Message.Sequence, pending[0].Sequence)
			default:
				if c := b.commit(a, id); c.Status != device.Committed || !c.AckSent {
					t.Fatalf("commit = %+v", c)
				}
			}
			if acks := acksOf(a.pump()); len(acks) != 1 || !acks[0].Cleared {
				t.Fatalf("sender got %+v", acks)
			}
			if len(a.sentPending()) != 0 || b.pendingCount() != 0 {
				t.Fatal("flow not finished")
			}
		})
	}
}

// killChild runs the flow on two bbolt files and SIGKILLs itself at the
// armed failpoint of the named step.
func killChild() {
	var step, at string
	for i, c := range os.Getenv(killEnv) {
		if c == '|' {
			step, at = os.Getenv(killEnv)[:i], os.Getenv(killEnv)[i+1:]
		}
	}
	dir := os.Getenv("SYNCMESH_DEVICE_KILL_DIR")
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	net := session.NewInProcess()
	var armed atomic.Pointer[string] // the file whose failpoint kills
	open := func(name string) *bolt.DB {
		db, err := bolt.Open(filepath.Join(dir, name+".db"), bolt.Options{Failpoint: func(fp string) error {
			if p := armed.Load(); p != nil && *p == name && fp == at {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is delivered; nothing runs after it
			}
			return nil
		}})
		if err != nil {
			os.Exit(12)
		}
		return db
	}
	adb, bdb := open("alice"), open("bob")
	a, err := device.Open(context.Background(), sys, device.Config{Store: adb.Delivery(), Transport: net.Endpoint(aliceAddr),
		Session: func(c *session.Config) { c.RefreshInterval = -1 }})
	if err != nil {
		os.Exit(13)
	}
	net.Register(aliceAddr, a.Sessions())
	b, err := device.Open(context.Background(), sys, device.Config{Store: bdb.Delivery(), Transport: net.Endpoint(bobAddr),
		Session: func(c *session.Config) { c.RefreshInterval = -1 }})
	if err != nil {
		os.Exit(14)
	}
	net.Register(bobAddr, b.Sessions())
	ctx := context.Background()
	arm := func(s, name string) {
		if s == step {
			armed.Store(&name)
		}
	}
	arm("send", "alice")
	sm, err := a.Send(ctx, bobAddr, []byte("survives the kill"))
	if err != nil {
		os.Exit(15)
	}
	env := net.Take(bobAddr)
	if len(env) != 1 {
		os.Exit(16)
	}
	arm("receive", "bob")
	if _, err := b.Receive(ctx, env[0].From, env[0].Envelope); err != nil {
		os.Exit(17)
	}
	arm("commit", "bob")
	if _, err := b.CommitReceivedMessage(ctx, aliceAddr, sm.ID); err != nil {
		os.Exit(18)
	}
	ack := net.Take(aliceAddr)
	if len(ack) != 1 {
		os.Exit(19)
	}
	arm("ack", "alice")
	_, _ = a.Receive(ctx, ack[0].From, ack[0].Envelope)
	os.Exit(20) // not reached: the failpoint kills first
}
