// Package sessionmem measures the resident heap of idle delivery-plane
// sessions for the benchmark report. It lives beside the report, not in
// the library: it builds a throwaway in-memory store and actor system.
package sessionmem

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// IdleSessions measures the resident heap of n idle sessions kept
// two ways, on an in-memory store:
//
//   - persistedBytes: n established session records stored (no actors):
//     the heap the store holds for them.
//   - liveBytes: the additional heap of n live, idle session actors (each
//     spawned and holding its decoded record), on top of the stored ones.
//
// The records are copies of one real established session (a PQXDH
// initiation answered once in each direction), stored under n addresses.
// Divide by n for per-session costs. It is meant for benchmarks and
// reports (a few seconds for n = 100 000).
func IdleSessions(n int) (persistedBytes, liveBytes uint64, err error) {
	if n <= 0 {
		return 0, 0, fmt.Errorf("%w: n must be positive", session.ErrInvalidConfig)
	}
	rec, err := establishedRecord()
	if err != nil {
		return 0, 0, err
	}
	raw, err := ratchet.MarshalState(rec)
	if err != nil {
		return 0, 0, err
	}
	ctx := context.Background()
	base := heapInUse()

	store := memory.NewDelivery()
	peer := func(i int) messages.DeviceAddress {
		return messages.DeviceAddress{User: fmt.Sprintf("user-%08d", i), Device: 1}
	}
	const batch = 1000
	for start := 0; start < n; start += batch {
		if err := store.Update(ctx, func(tx persistence.DeliveryTx) error {
			for i := start; i < start+batch && i < n; i++ {
				if err := tx.PutSession(peer(i), raw); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return 0, 0, err
		}
	}
	stored := heapInUse()

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer sys.Shutdown()
	m, err := session.NewManager(ctx, sys, session.Config{Store: store, Transport: session.NewInProcess().Endpoint(peer(-1)), IdleTimeout: 24 * time.Hour, RefreshInterval: -1})
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	started := heapInUse()
	for i := range n {
		if err := m.Warm(ctx, peer(i)); err != nil {
			return 0, 0, err
		}
	}
	if got := m.LiveSessions(); got != n {
		return 0, 0, fmt.Errorf("sessionmem: %d live sessions, want %d", got, n)
	}
	live := heapInUse()
	runtime.KeepAlive(store)
	runtime.KeepAlive(m)
	return sub(stored, base), sub(live, started), nil
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// establishedRecord returns the initiator's record of a session answered
// once in each direction.
func establishedRecord() (ratchet.SessionRecord, error) {
	alice, err := ratchet.NewIdentity()
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	bob, err := ratchet.NewIdentity()
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	now := time.Now()
	ps, err := ratchet.NewPrekeyStore(bob, now, ratchet.DefaultPrekeyConfig())
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	ps, bundle, err := ps.IssueBundle(bob.Public())
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	ra, _, err := ratchet.Initiate(ratchet.SessionRecord{}, alice, &bundle, aliceToBob)
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	ra, env, err := ratchet.Encrypt(ra, []byte("hello"))
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	res, err := ratchet.Decrypt(ratchet.SessionRecord{}, bob, ps, env, aliceToBob, now)
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	_, env, err = ratchet.Encrypt(res.Record, []byte("hi"))
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	back, err := ratchet.Decrypt(ra, alice, ratchet.PrekeyStore{}, env, bobToAlice, now)
	if err != nil {
		return ratchet.SessionRecord{}, err
	}
	return back.Record, nil
}

// The routes of the measured pair's envelopes.
var (
	aliceToBob = ratchet.Route{From: messages.DeviceAddress{User: "alice", Device: 1}, To: messages.DeviceAddress{User: "bob", Device: 1}}
	bobToAlice = ratchet.Route{From: aliceToBob.To, To: aliceToBob.From}
)
