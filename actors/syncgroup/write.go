package syncgroup

import (
	"context"

	"github.com/syncmesh/syncmesh/persistence"
)

// One writer for the sync plane's store: besides the group actors'
// batches and received pushes (ApplyWith), the node's DDL (tables,
// columns, horizons, keys) and the release of held groups run in the
// committer's transactions too, so rows, log and table state have one
// writer and no write waits on a lock of its own (under the invariants
// tag, checked.go fails any other writer).

// commit runs run in a committer transaction (possibly shared with other
// work) and returns once that transaction is durable. run may be called
// more than once — a shared transaction that failed is retried one work
// at a time — so it must start from nothing each time. A ctx done before
// the answer returns ctx.Err(), while the work may still commit.
func (r *Router) commit(ctx context.Context, run func(tx persistence.SyncTx) (batchResult, error)) (batchResult, error) {
	done := make(chan committed, 1)
	// Sent under mu: Stop marks the router closed under mu before it stops
	// the committer, so work sent while open is ahead of the stop in the
	// committer's mailbox and always answered.
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return batchResult{}, ErrStopped
	}
	r.system.Root.Send(r.committer, &batchWork{done: done, run: run})
	r.mu.Unlock()
	select {
	case m := <-done:
		if m.err != nil {
			return batchResult{}, m.err
		}
		for _, n := range m.res.notices {
			r.deps.Notify(n)
		}
		return m.res, nil
	case <-ctx.Done():
		return batchResult{}, ctx.Err()
	}
}

// Write runs fn in a committer transaction and returns once it is durable
// (or fn's error, with nothing of fn kept). It is how the node changes the
// sync store's tables, horizons and keys. fn may run more than once (see
// commit): it must not keep state across calls.
func (r *Router) Write(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	_, err := r.commit(ctx, func(tx persistence.SyncTx) (batchResult, error) {
		return batchResult{}, fn(tx)
	})
	return err
}

// Release materializes what the groups in keys hold, for those whose
// table exists (SSP/1 §13.6), in one committer transaction; it returns
// how many events were released. The group actors need not take part:
// their batches and the release are ordered by the committer, and each
// transaction reads the table state it acts on.
func (r *Router) Release(ctx context.Context, keys []persistence.GroupKey) (int, error) {
	total := 0
	_, err := r.commit(ctx, func(tx persistence.SyncTx) (batchResult, error) {
		var res batchResult
		total = 0
		for _, k := range keys {
			n, err := release(tx, k, &res.notices)
			if err != nil {
				return batchResult{}, err
			}
			total += n
		}
		return res, nil
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}
