package apply

import (
	"context"

	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// ApplyWith runs a received push's events through the chokepoint like
// ApplyBatch (the pure checks in parallel, signatures verified in batches), then inserts and materializes
// the ones that passed and runs record in ONE storage transaction
// (syncgroup.Router.ApplyWith): the push's events and the receiver's
// record of it commit together. record gets every event's outcome in
// input order (the pure checks' verdicts included).
func (c *Chokepoint) ApplyWith(ctx context.Context, raws [][]byte, record func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error)) ([]messages.Outcome, error) {
	outs := make([]messages.Outcome, len(raws))
	reqs := make([]*syncgroup.Apply, len(raws))
	c.checkAll(raws, outs, reqs)
	pass := make([]*syncgroup.Apply, 0, len(raws))
	at := make([]int, 0, len(raws))
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
