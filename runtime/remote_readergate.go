package runtime

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// readerGate orders protoactor's remote Shutdown after every read its
// endpoint reader makes of its suspended flag. The pinned protoactor-go
// writes that flag in Shutdown (endpointReader.suspend) without
// synchronization, and each stream's reader reads it right after every
// message our guardedStream.RecvMsg returns, before it asks for the next:
// a stream receiving while the remote closes was a data race
// (examples/benchreport TestSyncAndCatchupReportsRun failed under -race in
// a clean-clone CI run on 46de12f with that report; rare: 0 of 4 runs
// reproduced it). A stream holds the gate from a message it
// returned until its next RecvMsg call or its handler's end; Close marks
// the gate closing, after which no RecvMsg returns a message, and waits
// for the holders before Shutdown runs.
type readerGate struct {
	mu      sync.Mutex
	cond    *sync.Cond
	closing bool
	holding int
}

// errRemoteClosing is what RecvMsg returns once the remote is closing.
var errRemoteClosing = status.Error(codes.Unavailable, "runtime: remote closing")

// release ends the hold of a stream (held is the stream's own flag) and
// reports whether close began.
func (g *readerGate) release(held *bool) (closing bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *held {
		*held = false
		g.holding--
		if g.holding == 0 && g.cond != nil {
			g.cond.Broadcast()
		}
	}
	return g.closing
}

// hold records that a stream returns a message; false once closing (the
// message must not reach protoactor's reader).
func (g *readerGate) hold(held *bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.holding++
	*held = true
	return true
}

// close marks the gate closing and waits until no stream holds it, at
// most timeout (a reader stuck handing a message to an actor must not
// hang Close; past the timeout Shutdown runs as it did before the gate).
// It reports whether every hold ended.
func (g *readerGate) close(timeout time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closing = true
	if g.cond == nil {
		g.cond = sync.NewCond(&g.mu)
	}
	expired := false
	t := time.AfterFunc(timeout, func() {
		g.mu.Lock()
		expired = true
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer t.Stop()
	for g.holding > 0 && !expired {
		g.cond.Wait()
	}
	return g.holding == 0
}

// readerGateTimeout bounds how long Close waits for streams to hand back
// the message they hold.
const readerGateTimeout = 5 * time.Second
