package hosting

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
	"github.com/syncmesh/syncmesh/runtime"
)

// TestClosedComponentErrorsAreRetryable closes a real instance of every
// component a hosted unit is made of, calls it, and checks that the error
// matches the one base runtime.ErrClosed and is classified CodeUnavailable:
// a request that reaches a unit while it is being closed (its member
// stopping, fencing itself, or passivating the grain) must be retried on
// the unit's next host, not reported as a failure. It also checks the one
// Close rule: a second Close returns nil. (Before the base existed the
// inbound, session, outbound, persistence and delivery "closed" errors
// became CodeFailed and the client gave up on a survivor; and the second
// Close returned ErrClosed in some types and nil in others.)
func TestClosedComponentErrorsAreRetryable(t *testing.T) {
	ctx := context.Background()
	sys := actortest.System(t)
	closedErr := map[string]error{}
	secondClose := map[string]error{}
	alice := messages.DeviceAddress{User: "alice", Device: 1}

	out, err := outbound.New(outbound.Config{Store: memory.NewDelivery()})
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["outbound"] = out.Close()
	_, closedErr["outbound"] = out.Count(ctx)

	sm, err := session.NewManager(ctx, sys, session.Config{Store: memory.NewDelivery(), Transport: session.NewInProcess().Endpoint(alice)})
	if err != nil {
		t.Fatal(err)
	}
	if err := sm.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["session"] = sm.Close()
	_, closedErr["session"] = sm.Bundle(ctx)

	// The inbound store's operations run inside the device (its
	// committer); a closed device store reaches them as persistence's
	// closed error.
	dstore := memory.NewDelivery()
	dev, err := device.Open(ctx, sys, device.Config{Store: dstore, Transport: session.NewInProcess().Endpoint(alice)})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["device"] = dev.Close()
	_, closedErr["device"] = dev.Send(ctx, messages.DeviceAddress{User: "bob", Device: 1}, []byte("x"))

	db, err := bolt.Open(filepath.Join(t.TempDir(), "node.db"), bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	syncH, delivH := db.Sync(), db.Delivery()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["bolt"] = db.Close()
	closedErr["bolt sync store"] = syncH.View(ctx, func(persistence.SyncReader) error { return nil })
	closedErr["bolt delivery store"] = delivH.Update(ctx, func(persistence.DeliveryTx) error { return nil })
	if err := syncH.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["bolt sync handle"] = syncH.Close()

	ms := memory.New()
	if err := ms.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["memory sync store"] = ms.Close()
	closedErr["memory sync store"] = ms.Update(ctx, func(persistence.SyncTx) error { return nil })
	if err := dstore.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["memory delivery store"] = dstore.Close()
	closedErr["memory delivery store"] = dstore.View(ctx, func(persistence.DeliveryReader) error { return nil })

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
	svc.Close() // no error to return; must not block or panic
	_, closedErr["delivery"] = svc.HandlePush(ctx, &messages.SyncPush{})

	router := syncgroup.NewRouter(sys, "closed-test", syncgroup.Deps{Store: memory.New()})
	router.Stop(10 * time.Second)
	router.Stop(10 * time.Second)
	_, closedErr["sync groups"] = router.ApplyWith(ctx, nil, nil)

	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["node"] = n.Close()
	_, _, closedErr["node"] = n.Get(ctx, "s", "t", map[string]any{"id": 1})
	_, closedErr["node apply"] = n.ApplySignedBatch(ctx, [][]byte{{0}})

	l, err := NewLocal(Config{Root: t.TempDir(), MeshID: []byte("m"), NoSync: true}, sys)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	secondClose["hosting"] = l.Close()
	_, closedErr["hosting"] = l.Request(ctx, KindGroup, "g", &Request{Op: OpGet})

	for name, err := range secondClose {
		if err != nil {
			t.Errorf("%s: second Close = %v, want nil", name, err)
		}
	}
	for name, err := range closedErr {
		if err == nil {
			t.Errorf("%s: no error after close", name)
			continue
		}
		if !errors.Is(err, runtime.ErrClosed) {
			t.Errorf("%s: %v does not match runtime.ErrClosed", name, err)
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
	// Each component's own sentinel still matches itself, and wraps the base.
	for name, c := range map[string]struct{ err, own error }{
		"outbound": {closedErr["outbound"], outbound.ErrClosed},
		"session":  {closedErr["session"], session.ErrClosed},
		"device":   {closedErr["device"], device.ErrClosed},
		"delivery": {closedErr["delivery"], replicate.ErrStopped},
		"groups":   {closedErr["sync groups"], syncgroup.ErrStopped},
		"hosting":  {closedErr["hosting"], ErrClosed},
	} {
		if !errors.Is(c.err, c.own) {
			t.Errorf("%s: %v does not match its own sentinel %v", name, c.err, c.own)
		}
	}
	// The chokepoint has no Close of its own (it stops with the node's
	// groups); its sentinel wraps the same base.
	for _, own := range []error{apply.ErrClosed, runtime.ErrRemoteClosed} {
		if !errors.Is(own, runtime.ErrClosed) || codeOf(fmt.Errorf("wrapped: %w", own)) != CodeUnavailable {
			t.Errorf("%v: not a retryable closed error", own)
		}
	}
}

// A change feed's typed errors keep their meaning across the wire: a
// cursor behind the retained log is CodeLagged, one of a history the
// store lost to a restore is CodeRestored, and each matches its runtime
// sentinel on the caller's side.
func TestChangeFeedErrorsKeepTheirCode(t *testing.T) {
	for want, err := range map[Code]error{
		CodeLagged:   &runtime.WatchLagError{Schema: "app", Table: "t", After: 3, Oldest: 9, Resume: 20},
		CodeRestored: &runtime.WatchRestoredError{Schema: "app", Table: "t", After: 30, Lost: runtime.ChangeGap{From: 5, To: 40}, Resume: 50},
	} {
		if got := codeOf(fmt.Errorf("changes: %w", err)); got != want {
			t.Errorf("%v classified %d, want %d", err, got, want)
		}
		sentinel := runtime.ErrWatchLagged
		if want == CodeRestored {
			sentinel = runtime.ErrWatchRestored
		}
		if rep := (&Reply{Member: "m", Code: want, Error: err.Error()}); !errors.Is(rep.Err(), sentinel) {
			t.Errorf("reply error %v does not match %v", rep.Err(), sentinel)
		}
	}
}
