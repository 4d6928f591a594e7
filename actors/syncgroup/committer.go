package syncgroup

import (
	"runtime"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
	"github.com/syncmesh/syncmesh/persistence"
)

// The committer is the node's single writer of sync-group batches. bbolt
// admits one write transaction at a time, so separate transactions per
// group would queue behind each other, each paying its own fsync. Group
// actors hand their drained batches to the committer instead; it drains
// its own mailbox and runs every batch waiting there in ONE transaction,
// then answers each group after that transaction is durable.

// batchWork is one group's drained batch. run executes inside the shared
// transaction; it must only touch the batch it closes over.
type batchWork struct {
	run  func(tx persistence.SyncTx) (batchResult, error)
	from *actor.PID
	// done, when set, is answered instead of from (a push applied with
	// its record, push.go), after onCommit ran.
	done     chan<- committed
	onCommit func()
	// reqs are the apply requests run has (their preparations are released
	// once the work is answered: its transaction ended for good).
	reqs []*Apply
}

// committed answers batchWork, sent back to the group actor.
type committed struct {
	res batchResult
	err error
}

type committer struct {
	store   persistence.SyncStore
	writing *atomic.Pointer[func(bool)] // Router.SetWriterHook
	pending []*batchWork
	queued  bool
	yielded bool // the pending flush has yielded once already
}

func (c *committer) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *batchWork:
		c.pending = append(c.pending, m)
		if !c.queued {
			c.queued = true
			ctx.Send(ctx.Self(), flush{})
		}
	case flush:
		if !c.yielded {
			// Before committing, let the goroutines that are ready to run
			// — typically the other groups of the caller batch that woke
			// us — hand over their batches too: they land in the mailbox
			// ahead of the flush sent again here, so they join this
			// transaction. On one core the first group's batch would
			// otherwise commit alone, and every transaction rewrites the
			// pages of the randomly keyed indexes it touches (twice the
			// commits, twice that work). The yield returns at once when
			// nothing else is ready.
			c.yielded = true
			runtime.Gosched()
			ctx.Send(ctx.Self(), flush{})
			return
		}
		c.queued, c.yielded = false, false
		c.commit(ctx)
	case *actor.Stopping:
		c.commit(ctx)
	}
}

func (c *committer) commit(ctx actor.Context) {
	if len(c.pending) == 0 {
		return
	}
	works := c.pending
	c.pending = nil
	if h := c.writing.Load(); h != nil {
		(*h)(true)
		defer (*h)(false)
	}
	results := make([]batchResult, len(works))
	err := c.run(works, results)
	if err == nil || len(works) == 1 {
		for i, w := range works {
			c.answer(ctx, w, results[i], err)
		}
		return
	}
	// One failing batch never fails the others that shared its
	// transaction (a received push's storage error is that push's alone,
	// SSP/1 §14): the failed transaction rolled back, so each batch runs
	// again in a transaction of its own, answered (its commit hook run)
	// before the next one starts.
	for i, w := range works {
		err := c.run([]*batchWork{w}, results[i:i+1])
		c.answer(ctx, w, results[i], err)
	}
}

// answer answers w once its transaction ended with err.
func (c *committer) answer(ctx actor.Context, w *batchWork, res batchResult, err error) {
	if err != nil {
		res = batchResult{}
	}
	// Released here, not by the callers: a caller that stopped waiting
	// (cancelled) would never release them, and the budget of preparations
	// (persistence.MaxPreparedEvents) would leak.
	releasePrepared(w.reqs)
	if w.done != nil {
		if err == nil && w.onCommit != nil {
			w.onCommit() // before the next transaction can run
		}
		w.done <- committed{res: res, err: err}
		return
	}
	ctx.Send(w.from, &committed{res: res, err: err})
}

// run runs works in one transaction, filling results; on an error the
// transaction rolled back and results must not be used. Its transactions
// carry committerCtx: the one writer of rows, log and table state.
func (c *committer) run(works []*batchWork, results []batchResult) (err error) {
	if invariants.Enabled {
		// A violation raised inside the transaction (the checked store,
		// checked.go) rolls it back and fails its callers instead of
		// panicking inside the actor, where nobody would answer them.
		defer func() {
			if r := recover(); r != nil {
				v, ok := r.(invariants.Violation)
				if !ok {
					panic(r)
				}
				err = v
			}
		}()
	}
	return c.store.Update(committerCtx, func(tx persistence.SyncTx) error {
		for i, w := range works {
			r, err := w.run(tx)
			if err != nil {
				return err
			}
			results[i] = r
		}
		return nil
	})
}
