package apply

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// ApplyWith runs a received push's events through the chokepoint like
// ApplyBatch (the pure checks in parallel), then inserts and materializes
// the ones that passed and runs record in ONE storage transaction
// (syncgroup.Router.ApplyWith): the push's events and the receiver's
// record of it commit together. record gets every event's outcome in
// input order (the pure checks' verdicts included).
func (c *Chokepoint) ApplyWith(ctx context.Context, raws [][]byte, record func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error)) ([]messages.Outcome, error) {
	outs := make([]messages.Outcome, len(raws))
	reqs := make([]*syncgroup.Apply, len(raws))
	workers := min(runtime.GOMAXPROCS(0), len(raws))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(raws) {
					return
				}
				ck := c.check(raws[i])
				outs[i], reqs[i] = ck.out, ck.req
			}
		}()
	}
	wg.Wait()
	var pass []*syncgroup.Apply
	var at []int
	for i, req := range reqs {
		if req == nil {
			c.finish(outs[i])
			continue
		}
		pass = append(pass, req)
		at = append(at, i)
	}
	_, err := c.cfg.Router.ApplyWith(ctx, pass, func(tx persistence.SyncTx, got []messages.Outcome) (func(), error) {
		for j, i := range at {
			outs[i] = got[j]
		}
		return record(tx, outs)
	})
	if err != nil {
		return nil, err
	}
	return outs, nil
}
