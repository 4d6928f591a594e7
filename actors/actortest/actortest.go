// Package actortest holds what syncmesh's actor tests share: a quiet
// actor system torn down with the test, and an injectable wall clock.
// It is imported by tests only (like persistence/storetest).
package actortest

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// System returns an actor system whose logs are discarded, shut down when
// tb ends.
func System(tb testing.TB) *actor.ActorSystem {
	sys := QuietSystem()
	tb.Cleanup(sys.Shutdown)
	return sys
}

// QuietSystem returns an actor system whose logs are discarded; the
// caller shuts it down.
func QuietSystem() *actor.ActorSystem {
	logger := slog.New(slog.DiscardHandler)
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
}

// Clock is an injectable wall clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d (backwards for a negative d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
