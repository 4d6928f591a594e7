package runtime

import (
	"time"

	"github.com/syncmesh/syncmesh/actors/idle"
)

// IdleTimer is an actor's idle timer, for custom actors beside a node
// (runtime/hosting's grains use it to passivate): Touch it on every
// message, pass each *IdleTick to Fired, and act when Fired reports the
// actor idle. The timer's goroutine only sends the tick; protoactor-go's
// own SetReceiveTimeout writes the actor context from its timer goroutine
// while the actor reads it (a data race), so syncmesh's actors do not use
// it.
//
// It has no exported fields; its methods are Touch(ctx actor.Context),
// Fired(ctx actor.Context, tick *IdleTick) bool and Stop().
type IdleTimer = idle.Timer

// IdleTick is the message an IdleTimer sends to its actor. It has no
// exported fields; IgnoreDeadLetterLogging keeps a tick that arrives
// after its actor stopped out of the dead-letter log.
type IdleTick = idle.Tick

// NewIdleTimer returns an IdleTimer for an actor idle after d (d > 0).
func NewIdleTimer(d time.Duration) *IdleTimer { return idle.New(d) }
