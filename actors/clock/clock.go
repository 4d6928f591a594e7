// Package clock is a node's hybrid logical clock: the tick discipline for
// local events, observe on apply, and durability across restarts. The node
// never issues an HLC it issued before, even after a crash or with a wall
// clock that went backwards (SSP/1 §13.5: HLC reuse breaks convergence).
//
// Durability works by a persisted high-water mark: the clock never issues a
// value above the last persisted mark without first persisting a new one a
// lease ahead, and on open it resumes above the persisted mark. So there is
// at most one storage write per lease period of issued time.
package clock

import (
	"fmt"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
	"github.com/syncmesh/syncmesh/messages"
)

// DefaultLease is how far ahead of an issued value the high-water mark is
// persisted.
const DefaultLease = 10 * time.Second

// Persist durably stores a new high-water mark; it returns only when the
// mark is durable.
type Persist func(messages.HLC) error

// Clock is safe for concurrent use. mu guards the state and is never held
// while a mark is persisted: the persist callback waits for the store's
// writer, and that writer's transaction reads the clock (Last, Observe)
// while it applies received events — holding mu across persist deadlocked
// the two. pmu serializes the persists themselves.
type Clock struct {
	pmu       sync.Mutex
	mu        sync.Mutex
	wall      func() time.Time
	persist   Persist
	lease     uint64 // in HLC units (ms<<16)
	last      messages.HLC
	highWater messages.HLC
	held      bool
	stopped   bool          // Stop: nothing is issued any more
	released  chan struct{} // closed by Release; nil while not held
	// issued is the highest value this clock issued or reserved (or the
	// mark it resumed from), kept for the invariant check only: it is
	// independent of last, which observed values also raise.
	issued messages.HLC
}

// New returns a clock resuming above persisted, the last high-water mark
// read from storage (0 for a new node). wall is the injected wall clock.
func New(wall func() time.Time, persisted messages.HLC, persist Persist, lease time.Duration) *Clock {
	if lease <= 0 {
		lease = DefaultLease
	}
	return &Clock{wall: wall, persist: persist, lease: uint64(lease.Milliseconds()) << 16, last: persisted, highWater: persisted, issued: persisted}
}

// WallMS returns the injected wall clock in Unix milliseconds.
func (c *Clock) WallMS() uint64 {
	ms := c.wall().UnixMilli()
	if ms < 0 {
		return 0
	}
	return uint64(ms)
}

// Now issues a new HLC for a local event: greater than every value issued
// or observed before, and not below the wall clock.
func (c *Clock) Now() (messages.HLC, error) {
	for {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return 0, ErrStopped
		}
		if c.held {
			c.mu.Unlock()
			return 0, ErrHeld
		}
		pt := c.WallMS()
		if pt > messages.MaxPhysicalMS {
			c.mu.Unlock()
			return 0, ErrExhausted
		}
		next := messages.HLC(pt << 16)
		if next <= c.last {
			// Same or earlier physical time: bump the logical counter. A full
			// counter carries into the physical part, which stays monotonic.
			next = c.last + 1
		}
		if next.Physical() > messages.MaxPhysicalMS {
			c.mu.Unlock()
			return 0, ErrExhausted
		}
		if next > c.highWater {
			// Nothing above the durable mark is issued: raise it (outside
			// mu) and decide again, since the clock may have moved meanwhile.
			c.mu.Unlock()
			if err := c.raise(next); err != nil {
				return 0, err
			}
			continue
		}
		if invariants.Enabled {
			c.checkIssue(next)
		}
		c.last = next
		c.mu.Unlock()
		return next, nil
	}
}

// raise durably moves the high-water mark a lease past h, unless another
// caller already moved it past h. It holds pmu, never mu, while the mark
// is persisted.
func (c *Clock) raise(h messages.HLC) error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	c.mu.Lock()
	hw := c.highWater
	c.mu.Unlock()
	if h <= hw {
		return nil
	}
	target := messages.HLC(uint64(h) + c.lease)
	if err := c.persist(target); err != nil {
		return fmt.Errorf("clock: persist high-water: %w", err)
	}
	c.mu.Lock()
	if target > c.highWater {
		c.highWater = target
	}
	c.mu.Unlock()
	return nil
}

// Observe merges a remote HLC into the clock (SSP/1 §12 step 5), so the
// next local event is issued above it. Values are checked against the skew
// bound before they are observed.
func (c *Clock) Observe(h messages.HLC) {
	c.mu.Lock()
	if h > c.last {
		c.last = h
	}
	c.mu.Unlock()
}

// Reserve durably marks h as used: the clock will never issue h or
// anything below it, even after a crash. For events signed with an HLC
// chosen by the caller instead of issued by Now.
func (c *Clock) Reserve(h messages.HLC) error {
	for {
		c.mu.Lock()
		if c.stopped {
			c.mu.Unlock()
			return ErrStopped
		}
		if c.held {
			c.mu.Unlock()
			return ErrHeld
		}
		if h > c.highWater {
			c.mu.Unlock()
			if err := c.raise(h); err != nil {
				return err
			}
			continue
		}
		if h > c.last {
			c.last = h
		}
		if invariants.Enabled && h > c.issued {
			c.issued = h
		}
		c.mu.Unlock()
		return nil
	}
}

// checkIssue is the invariant behind SSP/1 §13.5's "never reuse an HLC":
// a value to issue lies above everything this clock issued, reserved or
// resumed from, and at or below the durable mark (so a crash cannot make
// the next run issue it again). Called with mu held.
func (c *Clock) checkIssue(next messages.HLC) {
	if next <= c.issued {
		invariants.Fail("clock: issuing %d, not above %d it issued before", next, c.issued)
	}
	if next > c.highWater {
		invariants.Fail("clock: issuing %d above its durable high-water mark %d", next, c.highWater)
	}
	c.issued = next
}

// Stop ends issuing (Now and Reserve fail with ErrStopped from then on),
// waits for a mark being persisted, and returns the highest value issued
// or observed. At a clean close that value is a mark as safe as the
// leased one and lower by up to a lease: resuming above the leased mark
// at every restart would push the clock a lease ahead of the wall clock
// per restart, until its own events fail the skew bound (SSP/1 §12 step
// 2) although the wall clock is right.
func (c *Clock) Stop() messages.HLC {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.pmu.Lock() // a raise under way ends first
	defer c.pmu.Unlock()
	return c.Last()
}

// Last returns the highest value issued or observed.
func (c *Clock) Last() messages.HLC {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Hold stops the clock from issuing (Now and Reserve fail with ErrHeld)
// until Release; Observe still raises it. A node opened from a restored
// copy holds its clock until it has applied its own released events
// from a peer (SSP/1 §13.5), so its first issued value is above them.
func (c *Clock) Hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		c.held, c.released = true, make(chan struct{})
	}
}

// Release lets a held clock issue again (idempotent).
func (c *Clock) Release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		c.held = false
		close(c.released)
	}
}

// Released returns a channel closed once the clock is not held (already
// closed when it is not).
func (c *Clock) Released() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c.released
}
