package syncgroup

import (
	"cmp"
	"context"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// ApplyWith applies reqs (authenticated, in-scope events of one received
// push) and then runs record in the SAME committer transaction, so a push's
// events and what the receiver records about it commit together: one
// transaction per received push (SSP/1 §14). The events are materialized
// grouped per (site, schema, table), in HLC order inside a group, exactly
// as a group actor's batch would be (the committer is the one writer, so
// this interleaves with the group actors' batches transaction by
// transaction). record gets the outcomes in reqs' order and returns a
// hook run once the transaction is durable, before the next one.
func (r *Router) ApplyWith(ctx context.Context, reqs []*Apply, record func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error)) ([]messages.Outcome, error) {
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	key := func(i int) persistence.GroupKey {
		e := reqs[i].Event
		return persistence.GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ka, kb := key(a), key(b)
		return cmp.Or(cmp.Compare(string(ka.Site[:]), string(kb.Site[:])), cmp.Compare(ka.Schema, kb.Schema), cmp.Compare(ka.Table, kb.Table),
			cmp.Compare(reqs[a].Event.HLC, reqs[b].Event.HLC))
	})
	var hook func()
	done := make(chan committed, 1)
	w := &batchWork{done: done, reqs: reqs, onCommit: func() {
		if hook != nil {
			hook()
		}
	}, run: func(tx persistence.SyncTx) (batchResult, error) {
		res := batchResult{outcomes: make([]messages.Outcome, len(reqs))}
		var tc *tableCache
		var cur persistence.GroupKey
		for n, i := range order {
			if k := key(i); n == 0 || k != cur {
				cur, tc = k, &tableCache{}
			}
			out, err := applyOne(tx, cur, tc, reqs[i], &res.notices)
			if err != nil {
				return batchResult{}, err
			}
			res.outcomes[i] = out
		}
		h, err := record(tx, res.outcomes)
		if err != nil {
			return batchResult{}, err
		}
		hook = h
		return res, nil
	}}
	r.mu.Lock() // as in commit (write.go): never sent behind the committer's stop
	if r.closed {
		r.mu.Unlock()
		releasePrepared(reqs) // never sent
		return nil, ErrStopped
	}
	r.system.Root.Send(r.committer, w)
	r.mu.Unlock()
	var m committed
	select {
	case m = <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if m.err != nil {
		return nil, m.err
	}
	for i, req := range reqs {
		out := m.res.outcomes[i]
		if out.Kind == messages.Applied || out.Kind == messages.Held {
			r.deps.Observe(req.Event.HLC)
		}
		r.deps.Count(out)
	}
	for _, n := range m.res.notices {
		r.deps.Notify(n)
	}
	return m.res.outcomes, nil
}
