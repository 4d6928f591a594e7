package runtime

import (
	"context"
	"errors"
	"net"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/persistence"
)

// The closer stack runs its closers last first, each once, and returns
// every error they met.
func TestCloserStackUnwindsInReverseOnce(t *testing.T) {
	errA, errC := errors.New("a failed"), errors.New("c failed")
	var ran []string
	var s closerStack
	s.push(func() error { ran = append(ran, "a"); return errA })
	s.pushFunc(func() { ran = append(ran, "b") })
	s.push(func() error { ran = append(ran, "c"); return errC })
	err := s.unwind()
	if got := strings.Join(ran, ","); got != "c,b,a" {
		t.Fatalf("closers ran %q, want c,b,a", got)
	}
	if !errors.Is(err, errA) || !errors.Is(err, errC) {
		t.Fatalf("unwind = %v, want both errors", err)
	}
	if err := s.unwind(); err != nil || len(ran) != 3 {
		t.Fatalf("second unwind = %v, ran %v: want nil and nothing run again", err, ran)
	}
	var empty closerStack
	if err := empty.unwind(); err != nil {
		t.Fatalf("empty unwind = %v", err)
	}
}

// runPhases stops at the first failing phase, a real error as it is and
// an injected one wrapped with the phase's name.
func TestRunPhasesStopsAtTheFirstFailure(t *testing.T) {
	errReal := errors.New("real")
	var ran []string
	step := func(name string, err error) phase {
		return phase{name, func() error { ran = append(ran, name); return err }}
	}
	err := runPhases([]phase{step("a", nil), step("b", errReal), step("c", nil)}, nil)
	if err != errReal || strings.Join(ran, ",") != "a,b" {
		t.Fatalf("runPhases = %v after %v, want the real error after a,b", err, ran)
	}
	ran = nil
	err = runPhases([]phase{step("a", nil), step("b", nil), step("c", nil)}, failAfterPhase("b"))
	if !errors.Is(err, persistence.ErrInjected) || !strings.Contains(err.Error(), "phase b") || strings.Join(ran, ",") != "a,b" {
		t.Fatalf("runPhases = %v after %v, want the injected error after a,b", err, ran)
	}
}

// failAfterPhase is an openFault / startFault failing after phase name.
func failAfterPhase(name string) func(string) error {
	return func(p string) error {
		if p == name {
			return persistence.ErrInjected
		}
		return nil
	}
}

func phaseNames(ps []phase) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
	}
	return names
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// goroutines returns how many goroutines run, with their stacks, leaving
// out the parked workers of the mailbox pool: the process keeps up to
// 4 × GOMAXPROCS of them on purpose (actors/mailbox), a worker running
// an actor's mailbox is counted.
func goroutines() (int, string) {
	var kept []string
	for _, g := range goroutineStacks() {
		if lines := strings.SplitN(g, "\n", 3); len(lines) >= 2 && strings.Contains(lines[1], "actors/mailbox.(*Pool).run(") {
			continue
		}
		kept = append(kept, g)
	}
	return len(kept), strings.Join(kept, "\n\n")
}

// goroutineStacks returns the stack of every goroutine, one an entry.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := goruntime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitGoroutinesAtMost waits (up to a minute) until at most want
// goroutines run (goroutines): a goroutine that outlives its owner's
// teardown keeps the count up, and the test fails with every stack.
func waitGoroutinesAtMost(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, stacks := goroutines()
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still run, %d before:\n%s", n, want, stacks)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unwindConfig is a node on bbolt with every optional part Open can
// start: remote, device over it, metrics listener, the reconciliation
// schedule; both listeners on fixed ports so a reopen shows them freed.
func unwindConfig(dir string, httpPort, remotePort int) Config {
	return Config{Dir: dir, MeshID: testMesh, NoSync: true, Name: "u", LockTimeout: 200 * time.Millisecond,
		MetricsAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		Remote:      &RemoteConfig{Plaintext: true, Port: remotePort},
		Device:      &DeviceConfig{Address: DeviceAddress{User: "u", Device: 1}}}
}

// A failure after each phase of Open unwinds everything the phases
// before it opened: the error is the injected one (errors.Is), no
// goroutine is left, and the same directory opens again at once with the
// same listener ports (the bbolt file lock and both ports released); the
// reopened node's Close leaves nothing either.
func TestOpenFailureInEachPhaseUnwindsEverythingOpenedBefore(t *testing.T) {
	ctx := context.Background()
	httpPort, remotePort := freePort(t), freePort(t)
	// A full open and close first leaves nothing either.
	base := goroutineCount()
	whole, err := Open(ctx, unwindConfig(t.TempDir(), httpPort, remotePort))
	if err != nil {
		t.Fatal(err)
	}
	if err := whole.Close(); err != nil {
		t.Fatal(err)
	}
	waitGoroutinesAtMost(t, base)
	phases := phaseNames((&Node{}).openPhases(ctx))
	if len(phases) < 10 {
		t.Fatalf("only %d phases: %v", len(phases), phases)
	}
	for _, p := range phases {
		t.Run(p, func(t *testing.T) {
			dir := t.TempDir()
			base := goroutineCount()
			cfg := unwindConfig(dir, httpPort, remotePort)
			cfg.openFault = failAfterPhase(p)
			n, err := Open(ctx, cfg)
			if !errors.Is(err, persistence.ErrInjected) || n != nil {
				t.Fatalf("Open = %v, %v; want the injected error and no node", n, err)
			}
			if !strings.Contains(err.Error(), "phase "+p) {
				t.Fatalf("error %q does not name phase %s", err, p)
			}
			waitGoroutinesAtMost(t, base)
			n, err = Open(ctx, unwindConfig(dir, httpPort, remotePort))
			if err != nil {
				t.Fatalf("reopen after a failure after %s: %v", p, err)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			waitGoroutinesAtMost(t, base)
		})
	}
}

// processCount is how many processes (actors, futures) sys holds.
func processCount(sys *actor.ActorSystem) int {
	n := 0
	for _, m := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += m.Count()
	}
	return n
}

// waitProcessesAtMost waits (up to a minute) until sys holds at most want
// processes: an actor that outlives its owner's teardown keeps one.
func waitProcessesAtMost(t *testing.T, sys *actor.ActorSystem, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n := processCount(sys)
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the actor system holds %d processes, %d before", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// On an actor system the node does not own (Config.System, as a host
// shares one), a failure after each phase of Open stops every actor the
// phases before it spawned: the system holds as many processes as
// before, and the directory opens again on it.
func TestOpenFailureOnASharedSystemStopsEveryActorItSpawned(t *testing.T) {
	ctx := context.Background()
	sys := actortest.System(t)
	net := NewNetwork(1)
	addr := DeviceAddress{User: "u", Device: 1}
	config := func(dir string) Config {
		return Config{Dir: dir, MeshID: testMesh, NoSync: true, Name: "u", LockTimeout: 200 * time.Millisecond, System: sys,
			Device: &DeviceConfig{Address: addr, Transport: net.DeviceTransport("u", addr)}}
	}
	for _, p := range phaseNames((&Node{}).openPhases(ctx)) {
		t.Run(p, func(t *testing.T) {
			dir := t.TempDir()
			before := processCount(sys)
			cfg := config(dir)
			cfg.openFault = failAfterPhase(p)
			if _, err := Open(ctx, cfg); !errors.Is(err, persistence.ErrInjected) {
				t.Fatalf("Open = %v, want the injected error", err)
			}
			waitProcessesAtMost(t, sys, before)
			n, err := Open(ctx, config(dir))
			if err != nil {
				t.Fatalf("reopen after a failure after %s: %v", p, err)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			waitProcessesAtMost(t, sys, before)
		})
	}
}

// A real error in a late phase (a device without a transport, found
// after storage, the actors and the sync service are open) unwinds the
// same way: a ConfigError, and the directory opens again at once.
func TestOpenConfigErrorInALatePhaseReleasesTheStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	base := goroutineCount()
	cfg := Config{Dir: dir, MeshID: testMesh, NoSync: true, LockTimeout: 200 * time.Millisecond,
		Device: &DeviceConfig{Address: DeviceAddress{User: "u", Device: 1}}}
	_, err := Open(ctx, cfg)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Device.Transport" {
		t.Fatalf("Open = %v, want a ConfigError on Device.Transport", err)
	}
	waitGoroutinesAtMost(t, base)
	cfg.Device = nil
	n, err := Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

func goroutineCount() int {
	n, _ := goroutines()
	return n
}
