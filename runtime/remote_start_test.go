package runtime

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/persistence"
)

// startUnwound checks what a StartRemote that failed must leave on sys:
// no goroutine beyond base, the endpoint subscription gone (the event
// stream holds subs subscriptions again), the sync actor's name free, and
// the port free for a remote on another system.
func startUnwound(t *testing.T, sys *actor.ActorSystem, base int, subs int32, port int) {
	t.Helper()
	waitGoroutinesAtMost(t, base)
	if got := sys.EventStream.Length(); got != subs {
		t.Fatalf("event stream holds %d subscriptions, %d before StartRemote", got, subs)
	}
	pid, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), SyncActorName)
	if err != nil {
		t.Fatalf("the sync actor's name is still taken: %v", err)
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	other := actortest.QuietSystem()
	defer other.Shutdown()
	r, err := StartRemote(other, RemoteConfig{Plaintext: true, Port: port})
	if err != nil {
		t.Fatalf("port %d not released: %v", port, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// A failure after each phase of StartRemote unwinds everything the
// phases before it started (startUnwound), with the injected error.
func TestStartRemoteFailureInEachPhaseUnwindsEverythingStartedBefore(t *testing.T) {
	port := freePort(t)
	for _, p := range phaseNames((&Remote{}).startPhases()) {
		t.Run(p, func(t *testing.T) {
			sys := actortest.System(t)
			base, subs := goroutineCount(), sys.EventStream.Length()
			r, err := StartRemote(sys, RemoteConfig{Plaintext: true, Port: port, startFault: failAfterPhase(p)})
			if !errors.Is(err, persistence.ErrInjected) || r != nil {
				t.Fatalf("StartRemote = %v, %v; want the injected error and no remote", r, err)
			}
			startUnwound(t, sys, base, subs, port)
		})
	}
}

// A real failure in the last phase (the sync actor's name taken on the
// system) shuts the started server down and drops the endpoint
// subscription (before the closer stack, that subscription was left on
// the caller's system).
func TestStartRemoteSpawnFailureStopsTheServer(t *testing.T) {
	port := freePort(t)
	sys := actortest.System(t)
	taken, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), SyncActorName)
	if err != nil {
		t.Fatal(err)
	}
	base, subs := goroutineCount(), sys.EventStream.Length()
	r, err := StartRemote(sys, RemoteConfig{Plaintext: true, Port: port})
	if err == nil || r != nil || !strings.Contains(err.Error(), fmt.Sprintf("spawn %s", SyncActorName)) {
		t.Fatalf("StartRemote = %v, %v; want the spawn error", r, err)
	}
	if err := sys.Root.StopFuture(taken).Wait(); err != nil {
		t.Fatal(err)
	}
	startUnwound(t, sys, base, subs, port)
}
