package session_test

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var (
	aliceAddr = messages.DeviceAddress{User: "alice", Device: 1}
	bobAddr   = messages.DeviceAddress{User: "bob", Device: 1}
	carolAddr = messages.DeviceAddress{User: "carol", Device: 2}
)

// node is one device in a test mesh.
type node struct {
	addr  messages.DeviceAddress
	store persistence.DeliveryStore
	m     *session.Manager
}

type mesh struct {
	tb    testing.TB
	sys   *actor.ActorSystem
	net   *session.InProcess
	clock *actortest.Clock
}

func newMesh(tb testing.TB) *mesh {
	return &mesh{tb: tb, sys: actortest.System(tb), net: session.NewInProcess(), clock: actortest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
}

// add starts a manager for addr on store (a new memory store when nil).
func (ms *mesh) add(addr messages.DeviceAddress, store persistence.DeliveryStore, tweak func(*session.Config)) *node {
	ms.tb.Helper()
	if store == nil {
		store = memory.NewDelivery()
	}
	cfg := session.Config{Store: store, Transport: ms.net.Endpoint(addr), Local: addr, Now: ms.clock.Now, RefreshInterval: -1}
	if tweak != nil {
		tweak(&cfg)
	}
	m, err := session.NewManager(context.Background(), ms.sys, cfg)
	if err != nil {
		ms.tb.Fatalf("NewManager(%s): %v", addr, err)
	}
	ms.tb.Cleanup(func() { _ = m.Close() })
	ms.net.Register(addr, m)
	return &node{addr: addr, store: store, m: m}
}

func mustEncrypt(tb testing.TB, from *node, to messages.DeviceAddress, pt string) []byte {
	tb.Helper()
	env, err := from.m.Encrypt(context.Background(), to, []byte(pt))
	if err != nil {
		tb.Fatalf("Encrypt %s→%s: %v", from.addr, to, err)
	}
	return env
}

func mustDecrypt(tb testing.TB, at *node, from messages.DeviceAddress, env []byte, want string) {
	tb.Helper()
	pt, err := at.m.Decrypt(context.Background(), from, env)
	if err != nil {
		tb.Fatalf("Decrypt at %s from %s: %v", at.addr, from, err)
	}
	if string(pt) != want {
		tb.Fatalf("Decrypt at %s: %q, want %q", at.addr, pt, want)
	}
}

// storedSession returns the stored record bytes of peer in store.
func storedSession(tb testing.TB, store persistence.DeliveryStore, peer messages.DeviceAddress) []byte {
	tb.Helper()
	var out []byte
	if err := store.View(context.Background(), func(r persistence.DeliveryReader) error {
		v, _, err := r.Session(peer)
		out = v
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func storedPrekeys(tb testing.TB, store persistence.DeliveryStore) []byte {
	tb.Helper()
	var out []byte
	if err := store.View(context.Background(), func(r persistence.DeliveryReader) error {
		v, _, err := r.Prekeys()
		out = v
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}
