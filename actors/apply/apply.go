// Package apply is the apply chokepoint of SSP/1 §12: the one path every
// received or locally written event takes, with its checks in the spec's
// order — signature, clock skew, scope, idempotent insert, HLC observe.
//
// The first three checks are pure work (decoding, hashing, Ed25519) and
// run on the caller's goroutine or on parallel workers, outside any actor.
// The rest runs in the event's sync-group actor, inside one storage
// transaction per drained batch.
package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/clock"
	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxSkewMS is SSP/1 §12's clock-skew bound: an event more than this many
// milliseconds in the receiver's future is rejected.
const MaxSkewMS = 300_000

// Config wires a Chokepoint.
type Config struct {
	MeshID  []byte
	Keyring *atomic.Pointer[sign.Keyring] // current trusted-peer snapshot
	Clock   *clock.Clock
	Scope   Scope
	Router  *syncgroup.Router
	Notify  func(messages.Notice)
	Count   func(messages.Outcome)
	Logger  *slog.Logger
	// Stopped is closed once the group actors have drained and stopped:
	// no answer can come after it.
	Stopped <-chan struct{}
}

// Chokepoint is the node's single apply path.
type Chokepoint struct {
	cfg     Config
	retired atomic.Pointer[retiredKids]
	pool    verifyPool
}

// retiredKids is the retirement cutoff of every retired key of one keyring
// snapshot, by kid: checking it costs a map lookup per event instead of a
// copied Key.
type retiredKids struct {
	kr  *sign.Keyring
	cut map[string]messages.HLC
}

// cutoffOf returns kid's retirement cutoff in kr (0: not retired).
func (c *Chokepoint) cutoffOf(kr *sign.Keyring, kid []byte) messages.HLC {
	r := c.retired.Load()
	if r == nil || r.kr != kr {
		r = &retiredKids{kr: kr, cut: map[string]messages.HLC{}}
		for _, k := range kr.Keys() {
			if k.Cutoff != 0 {
				r.cut[string(k.Kid)] = k.Cutoff
			}
		}
		c.retired.Store(r)
	}
	return r.cut[string(kid)]
}

// New returns the chokepoint.
func New(cfg Config) *Chokepoint {
	c := &Chokepoint{cfg: cfg}
	if cfg.Router != nil {
		cfg.Router.SetWriterHook(c.pool.setWriting) // pool.go
	}
	return c
}

// checked is the result of the pure steps: either a final outcome or an
// authenticated, in-scope event to insert.
type checked struct {
	out   messages.Outcome
	final bool
	req   *syncgroup.Apply
}

// check runs §12 steps 1–3.
func (c *Chokepoint) check(raw []byte) checked {
	// Step 1: signature first, so nothing later reads unauthenticated input.
	kr := c.cfg.Keyring.Load()
	v, err := sign.Verify(kr, raw, c.cfg.MeshID)
	ck := c.checkedWith(kr, raw, v, err, nil)
	if ck.req != nil {
		c.prepare([]*syncgroup.Apply{ck.req})
	}
	return ck
}

// prepare does the storage work of reqs that depends on the events alone
// (sealing, the range sums' hashing: syncgroup.Router.Prepare) here, on
// the verifiers, instead of in the single writer every apply waits on.
func (c *Chokepoint) prepare(reqs []*syncgroup.Apply) {
	if c.cfg.Router != nil {
		c.cfg.Router.Prepare(reqs)
	}
}

// checkBatch runs §12 steps 1–3 for raws, step 1 for all of them together
// (sign.VerifyBatch: one batch equation, bisection when it fails; the same
// verdict per event as sign.Verify), writing into outs and reqs.
func (c *Chokepoint) checkBatch(raws [][]byte, outs []messages.Outcome, reqs []*syncgroup.Apply) {
	kr := c.cfg.Keyring.Load()
	res := sign.VerifyBatch(kr, raws, c.cfg.MeshID)
	// The requests of the verified events in one allocation: they are
	// answered, and dropped, together (one ApplyBatch).
	n := 0
	for _, r := range res {
		if r.Err == nil {
			n++
		}
	}
	slab := make([]syncgroup.Apply, n)
	for i, r := range res {
		var req *syncgroup.Apply
		if r.Err == nil {
			req, slab = &slab[0], slab[1:]
		}
		ck := c.checkedWith(kr, raws[i], r.Verified, r.Err, req)
		outs[i], reqs[i] = ck.out, ck.req
	}
	c.prepare(reqs)
}

// checkedWith runs steps 2–3 on the verdict of step 1 (v, err), reached
// under the keyring snapshot kr; req is where the request to insert goes
// (nil: a new one; unused for a final outcome).
func (c *Chokepoint) checkedWith(kr *sign.Keyring, raw []byte, v *sign.Verified, err error, req *syncgroup.Apply) checked {
	if err != nil {
		id := eventid.Of(raw)
		out := messages.Outcome{ID: id}
		out.Kind, out.Detail = messages.Dropped, err.Error()
		switch {
		case sign.IsSignatureFailure(err):
			out.Reason = messages.ReasonSignature
		case errors.Is(err, messages.ErrEmptyRowKey):
			out.Reason = messages.ReasonEmptyRowKey
		default:
			out.Reason = messages.ReasonMalformed
		}
		if out.Reason == messages.ReasonEmptyRowKey || out.Reason == messages.ReasonMalformed {
			// Authenticated but unusable: attribute it to its signer.
			if k, ok := signerOf(kr, raw); ok {
				out.Site = k.Site
			}
		}
		return checked{out: out, final: true}
	}
	// Verify hashed raw once already: v.ID is eventid.Of(raw).
	id, e := v.ID, v.Event
	out := messages.Outcome{ID: id}
	out.Site, out.Schema, out.Table, out.HLC = e.Site, e.Schema, e.Table, e.HLC
	// Step 2: clock skew. Rejected events are not retained.
	if now := c.cfg.Clock.WallMS(); e.HLC.Physical() > now+MaxSkewMS {
		out.Kind, out.Reason = messages.Rejected, messages.ReasonClockSkew
		out.Detail = fmt.Sprintf("hlc physical %d ms is %d ms ahead of the receiver", e.HLC.Physical(), e.HLC.Physical()-now)
		return checked{out: out, final: true}
	}
	// Step 3: scope. Dropped and logged, never an error that stalls anything.
	if !c.cfg.Scope.Contains(e.Schema, e.Table) {
		out.Kind, out.Reason = messages.Dropped, messages.ReasonOutOfScope
		c.cfg.Logger.Debug("apply: event out of scope dropped", "schema", e.Schema, "table", e.Table, "id", id)
		return checked{out: out, final: true}
	}
	rowKey := v.RowKey // read off the wire as it is, for a canonical event
	if rowKey == nil {
		rowKey = e.RowKey()
	}
	if req == nil {
		req = new(syncgroup.Apply)
	}
	*req = syncgroup.Apply{ID: id, Raw: raw, Event: e, RowKey: rowKey}
	// SSP/1 §12, §13.5: an event of a key retired by the time it arrives
	// is valid (HLC ≤ cutoff) but surfaced by its group if it is new, so a
	// stolen key cannot backdate writes unseen.
	if cut := c.cutoffOf(kr, v.Kid); cut != 0 {
		req.Kid, req.Cutoff = v.Kid, cut
	}
	return checked{out: out, req: req}
}

func signerOf(kr *sign.Keyring, raw []byte) (sign.Key, bool) {
	kid, err := sign.PeekKid(raw)
	if err != nil {
		return sign.Key{}, false
	}
	return kr.Lookup(kid)
}

// Apply runs one signed event through the chokepoint and returns its
// outcome once it is durable. The error is for infrastructure failures
// (storage, cancellation, closing); verdicts on the event are outcomes.
func (c *Chokepoint) Apply(ctx context.Context, raw []byte) (messages.Outcome, error) {
	ck := c.check(raw)
	if ck.final {
		c.finish(ck.out)
		return ck.out, nil
	}
	reply := make(chan syncgroup.Result, 1)
	if err := c.send(ck.req, reply); err != nil {
		ck.req.Release() // never sent: its group did not take it over
		return ck.out, err
	}
	return c.wait(ctx, reply)
}

// checkAll runs §12 steps 1–3 for every event of raws, in parallel over
// sub-batches of sign.BatchSize, writing into outs and reqs (a nil req:
// decided by the pure checks). Batch verification costs ~0.25× a single
// check per signature at that size, and a forgery costs its sub-batch a
// bisection, not the whole push. The sub-batches run on the chokepoint's
// pool, behind those of callers that came first (pool.go).
func (c *Chokepoint) checkAll(raws [][]byte, outs []messages.Outcome, reqs []*syncgroup.Apply) {
	jobs := make([]func(), 0, (len(raws)+sign.BatchSize-1)/sign.BatchSize)
	for lo := 0; lo < len(raws); lo += sign.BatchSize {
		hi := min(lo+sign.BatchSize, len(raws))
		jobs = append(jobs, func() { c.checkBatch(raws[lo:hi], outs[lo:hi], reqs[lo:hi]) })
	}
	c.pool.run(jobs)
}

// ApplyBatch runs many events: the pure checks in parallel on up to
// GOMAXPROCS workers, each verifying sub-batches of sign.BatchSize
// signatures together, then every event to its group (groups commit their
// share in one transaction each). Outcomes are in input order. A failure
// of one event's storage does not stop the others; the first such error
// is returned beside the outcomes of the rest.
func (c *Chokepoint) ApplyBatch(ctx context.Context, raws [][]byte) ([]messages.Outcome, error) {
	// Outcomes are written in place; only the requests to insert are kept
	// beside them (no per-event copy of the outcome).
	outs := make([]messages.Outcome, len(raws))
	reqs := make([]*syncgroup.Apply, len(raws))
	c.checkAll(raws, outs, reqs)

	// One reply channel and one message per group for the whole batch.
	byGroup := map[persistence.GroupKey]syncgroup.ApplyMany{}
	pending := 0
	for i, req := range reqs {
		if req == nil { // final: decided by the pure checks
			c.finish(outs[i])
			continue
		}
		e := req.Event
		k := persistence.GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table}
		req.Index = i
		byGroup[k] = append(byGroup[k], req)
		pending++
	}
	// Every group's actor first, so a closing router leaves nothing half
	// sent: what no group took over is released here (a group releases
	// what it was sent once it answered).
	pids := make(map[persistence.GroupKey]*actor.PID, len(byGroup))
	for k := range byGroup {
		pid, ok := c.cfg.Router.PID(k)
		if !ok {
			for _, r := range reqs {
				r.Release()
			}
			return outs, ErrClosed
		}
		pids[k] = pid
	}
	reply := make(chan syncgroup.Result, pending)
	for k, reqs := range byGroup {
		for _, r := range reqs {
			r.Reply = reply
		}
		c.cfg.Router.Send(pids[k], reqs)
	}
	var firstErr error
	for ; pending > 0; pending-- {
		res, err := c.waitResult(ctx, reply)
		if err != nil {
			return outs, err
		}
		if res.Err != nil {
			if firstErr == nil {
				firstErr = res.Err
			}
			continue
		}
		outs[res.Index] = *res.Outcome
	}
	return outs, firstErr
}

func (c *Chokepoint) send(req *syncgroup.Apply, reply chan syncgroup.Result) error {
	e := req.Event
	pid, ok := c.cfg.Router.PID(persistence.GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table})
	if !ok {
		return ErrClosed
	}
	req.Reply = reply
	c.cfg.Router.Send(pid, req)
	return nil
}

func (c *Chokepoint) wait(ctx context.Context, reply chan syncgroup.Result) (messages.Outcome, error) {
	res, err := c.waitResult(ctx, reply)
	if err != nil {
		return messages.Outcome{}, err
	}
	if res.Err != nil {
		return messages.Outcome{}, res.Err
	}
	return *res.Outcome, nil
}

// waitResult waits for one answer; the error is cancellation or closing.
func (c *Chokepoint) waitResult(ctx context.Context, reply chan syncgroup.Result) (syncgroup.Result, error) {
	// A group answers its whole batch at once: most answers are already
	// buffered, and a receive that need not wait skips the three-way select.
	select {
	case res := <-reply:
		return res, nil
	default:
	}
	select {
	case res := <-reply:
		return res, nil
	case <-ctx.Done():
		return syncgroup.Result{}, ctx.Err()
	case <-c.cfg.Stopped:
		// Groups answer everything they accepted before stopping; a
		// request that reached none of them gets ErrClosed.
		select {
		case res := <-reply:
			return res, nil
		default:
			return syncgroup.Result{}, ErrClosed
		}
	}
}

// finish surfaces an outcome decided before any actor saw the event.
func (c *Chokepoint) finish(out messages.Outcome) {
	c.cfg.Count(out)
	switch out.Kind {
	case messages.Dropped:
		if out.Reason != messages.ReasonOutOfScope {
			c.cfg.Notify(messages.EventDropped{Outcome: out})
		}
	case messages.Rejected:
		c.cfg.Notify(messages.EventRejected{Outcome: out})
	}
}
