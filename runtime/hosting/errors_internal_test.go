package hosting

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
	"github.com/syncmesh/syncmesh/runtime"
)

// TestClosedComponentErrorsAreRetryable closes a real instance of every
// component a hosted unit is made of and checks that the error each one
// returns once closed is classified CodeUnavailable: a request that
// reaches a unit while it is being closed (its member stopping, fencing
// itself, or passivating the grain) must be retried on the unit's next
// host, not reported as a failure. Before the fix the inbound,
// session, outbound, persistence and delivery "closed" errors became
// CodeFailed and the client gave up on a survivor.
func TestClosedComponentErrorsAreRetryable(t *testing.T) {
	ctx := context.Background()
	sys := actortest.System(t)
	closedErr := map[string]error{}

	out, err := outbound.New(outbound.Config{Store: memory.NewDelivery()})
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	closedErr["outbound"] = out.Close()

	sm, err := session.NewManager(ctx, sys, session.Config{Store: memory.NewDelivery(), Transport: session.NewInProcess().Endpoint(messages.DeviceAddress{User: "alice", Device: 1})})
	if err != nil {
		t.Fatal(err)
	}
	if err := sm.Close(); err != nil {
		t.Fatal(err)
	}
	closedErr["session"] = sm.Close()

	dev, err := device.Open(ctx, sys, device.Config{Store: memory.NewDelivery(), Transport: session.NewInProcess().Endpoint(messages.DeviceAddress{User: "alice", Device: 1})})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	_, closedErr["device"] = dev.Send(ctx, messages.DeviceAddress{User: "bob", Device: 1}, []byte("x"))

	db, err := bolt.Open(filepath.Join(t.TempDir(), "node.db"), bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	closedErr["bolt"] = db.Close()

	ms := memory.New()
	if err := ms.Close(); err != nil {
		t.Fatal(err)
	}
	closedErr["memory sync store"] = ms.Close()
	md := memory.NewDelivery()
	if err := md.Close(); err != nil {
		t.Fatal(err)
	}
	closedErr["memory delivery store"] = md.Close()

	svc, err := replicate.NewService(sys, replicate.Deps{
		Store: memory.New(), Name: "n", LogID: make([]byte, 16),
		Apply:   func(context.Context, [][]byte) ([]messages.Outcome, error) { return nil, nil },
		InScope: func(string, string) bool { return true },
		Own:     replicate.NewOwnWrites(0),
	}, replicate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()
	_, closedErr["delivery"] = svc.HandlePush(ctx, &messages.SyncPush{})

	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, closedErr["node"] = n.Get(ctx, "s", "t", map[string]any{"id": 1})

	for name, err := range closedErr {
		if err == nil {
			t.Errorf("%s: no error after close", name)
			continue
		}
		if got := codeOf(err); got != CodeUnavailable {
			t.Errorf("%s: %v classified %d, want CodeUnavailable (%d)", name, err, got, CodeUnavailable)
		}
		// Wrapped as a request failure on a unit, it stays retryable.
		rep := &Reply{Member: "m", Code: codeOf(err), Error: err.Error()}
		if !errors.Is(rep.Err(), ErrUnavailable) {
			t.Errorf("%s: reply error %v does not match ErrUnavailable", name, rep.Err())
		}
	}
	if !errors.Is(closedErr["bolt"], persistence.ErrClosed) {
		t.Fatalf("bolt close twice: %v, want persistence.ErrClosed", closedErr["bolt"])
	}
}
