// Package syncgroup runs one actor per sync group (site_id, schema, table)
// (SSP/1 §13: events are materialized grouped per group). A group actor
// owns its group's mutations: it drains its mailbox into one batch, and
// the committer (committer.go), the sync store's one writer, runs the
// batches waiting for it in one storage transaction (group commit), with
// the pure decision (Decide) and the deterministic materializer inside
// it; each request is answered only after that transaction is durable.
// The committer also runs received pushes (push.go), the release of held
// groups and the node's DDL (write.go, addcolumn.go): nothing else writes
// the plane's rows, log or table state (checked.go, under the invariants
// build tag).
//
// Rows are shared by the groups of every site writing a table; the
// committer's transactions are what serialize two groups touching one
// row, and each transaction reads the row it rewrites.
package syncgroup

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/materialize"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Apply asks a group actor to insert and materialize one authenticated,
// in-scope event. Reply must be buffered (capacity ≥ 1); the actor never
// blocks on it.
type Apply struct {
	ID    messages.EventID
	Raw   []byte
	Event *messages.Event
	// RowKey is Event.RowKey(), computed by the caller (pure work, outside
	// the actor); nil to have the group compute it.
	RowKey []byte
	Reply  chan<- Result
	// Index is copied to the Result, so one Reply channel can serve many
	// requests.
	Index int
	// Kid and Cutoff name the signer's key when it was retired at
	// verification (Cutoff ≠ 0): such an event, if it is new here, is
	// surfaced as a RetiredKeyEvent whatever its HLC (a thief can backdate).
	Kid    []byte
	Cutoff messages.HLC
	// Prepared is the event's storage work done ahead of the transaction
	// (Router.Prepare); nil: the store does it in the transaction.
	Prepared *persistence.PreparedEvent
}

// Prepare does the pure storage work of reqs (nil entries skipped) —
// sealing their bytes, summing their reconciliation keys per table and
// site (persistence.SyncStore.PrepareEvents) — on the caller's goroutine,
// ahead of the committer's transaction: the apply path
// calls it on its parallel verifiers, so the single writer does not. A
// request sent to a group (or to ApplyWith) is released by the router
// once its transaction ended for good, whether or not its caller still
// waits; the caller releases one it never sent (Apply.Release).
func (r *Router) Prepare(reqs []*Apply) {
	sc := prepScratch.Get().(*prepareScratch)
	evs, ptrs := sc.evs[:0], sc.ptrs[:0]
	for _, req := range reqs {
		if req != nil {
			evs = append(evs, stored(req))
		}
	}
	for i := range evs { // after the appends: evs does not move any more
		ptrs = append(ptrs, &evs[i])
	}
	r.deps.Store.PrepareEvents(ptrs)
	i := 0
	for _, req := range reqs {
		if req != nil {
			req.Prepared = evs[i].Prepared
			i++
		}
	}
	sc.put(evs, ptrs)
}

// prepareScratch is Prepare's copies of its requests as stored events,
// pooled: PrepareEvents reads them and records each preparation in them
// during the call (the preparation itself is the request's, not the
// scratch's), and put clears them so the pool pins no event bytes.
type prepareScratch struct {
	evs  []persistence.StoredEvent
	ptrs []*persistence.StoredEvent
}

var prepScratch = sync.Pool{New: func() any { return new(prepareScratch) }}

// maxPooledPrepare caps the scratch kept (a verified batch is
// sign.BatchSize events; a push applied at once may be longer).
const maxPooledPrepare = 1024

func (sc *prepareScratch) put(evs []persistence.StoredEvent, ptrs []*persistence.StoredEvent) {
	clear(evs)
	clear(ptrs)
	if cap(evs) > maxPooledPrepare {
		return
	}
	sc.evs, sc.ptrs = evs[:0], ptrs[:0]
	prepScratch.Put(sc)
}

// Release returns the pooled memory of a's preparation (a nil a: none).
func (a *Apply) Release() {
	if a == nil {
		return
	}
	a.Prepared.Release()
	a.Prepared = nil
}

// releasePrepared releases the preparations of reqs: their transaction
// ended and will not run again.
func releasePrepared(reqs []*Apply) {
	for _, r := range reqs {
		r.Release()
	}
}

// ApplyMany hands a group several requests in one message (one mailbox
// operation for a whole batch of the caller's events).
type ApplyMany []*Apply

// Result answers Apply.
type Result struct {
	Index int
	// Outcome is the event's outcome (nil with Err). It points into the
	// answered batch's outcomes, which nothing writes once answered: a
	// pointer keeps the reply channels' buffers small (one Result per
	// event of a caller's batch is buffered).
	Outcome *messages.Outcome
	Err     error // a storage failure: nothing of the batch was kept
}

type flush struct{}

// drain asks a group to answer once nothing is pending or in flight.
type drain struct{ done chan struct{} }

// Deps are what a group actor needs from its node.
type Deps struct {
	Store   persistence.SyncStore
	Notify  func(messages.Notice)  // called after the transaction is durable
	Observe func(messages.HLC)     // HLC observe (SSP/1 §12 step 5)
	Count   func(messages.Outcome) // metrics
	Logger  *slog.Logger
	// Mailboxes measures the group actors' and the committer's mailboxes.
	Mailboxes *mailbox.Depths
}

// groupActor serializes one group's events: it drains its mailbox into a
// batch, sorts it in HLC order, hands it to the committer, and answers
// each caller once the batch is durable. One batch is in flight at a
// time; what arrives meanwhile forms the next batch.
type groupActor struct {
	key       persistence.GroupKey
	deps      Deps
	committer *actor.PID
	pending   []*Apply
	inflight  []*Apply
	queued    bool
	drains    []chan struct{}
}

func newGroupActor(key persistence.GroupKey, deps Deps, committer *actor.PID) *groupActor {
	return &groupActor{key: key, deps: deps, committer: committer}
}

func (g *groupActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *Apply, ApplyMany:
		if a, ok := m.(*Apply); ok {
			g.pending = append(g.pending, a)
		} else {
			g.pending = append(g.pending, m.(ApplyMany)...)
		}
		if !g.queued && g.inflight == nil {
			// Everything already in the mailbox is ahead of this marker,
			// so the flush takes all of it as one batch.
			g.queued = true
			ctx.Send(ctx.Self(), flush{})
		}
	case flush:
		g.queued = false
		g.send(ctx)
	case *committed:
		g.finish(m)
		g.send(ctx)
		g.answerDrains()
	case *drain:
		g.drains = append(g.drains, m.done)
		g.answerDrains()
	}
}

func (g *groupActor) answerDrains() {
	if len(g.pending) > 0 || g.inflight != nil || g.queued {
		return
	}
	for _, d := range g.drains {
		close(d)
	}
	g.drains = nil
}

// batchResult is what one batch produced inside the transaction.
type batchResult struct {
	outcomes []messages.Outcome
	notices  notices
}

type notices []messages.Notice

func (g *groupActor) send(ctx actor.Context) {
	if g.inflight != nil || len(g.pending) == 0 {
		return
	}
	batch := g.pending
	g.pending = nil
	g.inflight = batch
	// SSP/1 §13: materialize in HLC order within the batch.
	slices.SortStableFunc(batch, func(a, b *Apply) int { return cmp.Compare(a.Event.HLC, b.Event.HLC) })
	key := g.key
	ctx.Send(g.committer, &batchWork{from: ctx.Self(), reqs: batch, run: func(tx persistence.SyncTx) (batchResult, error) {
		r := batchResult{outcomes: make([]messages.Outcome, len(batch))}
		tc := &tableCache{}
		for i, req := range batch {
			out, err := applyOne(tx, key, tc, req, &r.notices)
			if err != nil {
				return batchResult{}, err
			}
			r.outcomes[i] = out
		}
		return r, nil
	}})
}

func (g *groupActor) finish(m *committed) {
	batch := g.inflight
	g.inflight = nil
	if m.err != nil {
		err := fmt.Errorf("syncgroup %s/%s/%s: %w", g.key.Site, g.key.Schema, g.key.Table, m.err)
		for _, req := range batch {
			req.Reply <- Result{Index: req.Index, Err: err}
		}
		return
	}
	for i, req := range batch {
		out := m.res.outcomes[i]
		if out.Kind == messages.Applied || out.Kind == messages.Held {
			g.deps.Observe(req.Event.HLC)
		}
		g.deps.Count(out)
	}
	for _, n := range m.res.notices {
		g.deps.Notify(n)
	}
	for i, req := range batch {
		req.Reply <- Result{Index: req.Index, Outcome: &m.res.outcomes[i]}
	}
}

// tableCache holds a group's table definition and horizon for one batch:
// every event of a group names the same table, and one transaction sees
// one state of it.
type tableCache struct {
	loaded  bool
	def     persistence.TableDef
	defined bool
	horizon messages.HLC
}

func (c *tableCache) load(tx persistence.SyncReader, t persistence.TableKey) error {
	if c.loaded && c.defined {
		return nil
	}
	var err error
	if c.def, c.defined, err = tx.Table(t); err != nil {
		return err
	}
	if c.defined {
		if c.horizon, err = tx.Horizon(t); err != nil {
			return err
		}
	}
	c.loaded = true
	return nil
}

// applyOne runs steps 4 and on of the chokepoint for one event inside tx:
// it reads what Decide needs, decides, and runs the decision's storage
// action (the materializer adds its own notices).
func applyOne(tx persistence.SyncTx, key persistence.GroupKey, tc *tableCache, req *Apply, ns *notices) (messages.Outcome, error) {
	e := req.Event
	if req.RowKey == nil {
		req.RowKey = e.RowKey()
	}
	in := Input{ID: req.ID, Event: e, Kid: req.Kid, Cutoff: req.Cutoff}
	// §12 step 4: idempotent insert keyed on the event id.
	se, known, err := tx.Event(e.Site, e.HLC, req.ID)
	if err != nil {
		return messages.Outcome{}, err
	}
	if known {
		// A point lookup: a duplicate must not cost a scan of the group's
		// held list inside the transaction every group shares.
		held, err := tx.IsHeld(key, se.Seq)
		if err != nil {
			return messages.Outcome{}, err
		}
		in.Known, in.StillHeld = true, held
	} else {
		if err := tc.load(tx, persistence.TableKey{Schema: e.Schema, Table: e.Table}); err != nil {
			return messages.Outcome{}, err
		}
		in.Defined, in.Def, in.Horizon = tc.defined, tc.def, tc.horizon
		// Two ids suffice: any one other than this event's is the
		// evidence, and the scan stays bounded however many events the
		// site signed with this HLC.
		if in.Stamped, err = tx.EventIDsAt(e.Site, e.HLC, 2); err != nil {
			return messages.Outcome{}, err
		}
		if !in.Defined {
			if in.OverHeldQuota, err = overHeldQuota(tx, e.Site, len(req.Raw)); err != nil {
				return messages.Outcome{}, err
			}
		}
	}
	d := Decide(in)
	*ns = append(*ns, d.Notices...)
	return d.Outcome, execute(tx, key, d, in, stored(req), ns)
}

// execute runs a decision's storage effects inside tx, for the apply path
// and the release of a held group alike (the materializer adds its own
// notices to ns). se is the event as stored (or to store).
func execute(tx persistence.SyncTx, key persistence.GroupKey, d Decision, in Input, se persistence.StoredEvent, ns *notices) error {
	if d.Action == Nothing {
		return nil
	}
	if d.Append {
		seq, err := tx.AppendEvent(se)
		if err != nil {
			return err
		}
		se.Seq = seq
	}
	if d.Action == Hold {
		return tx.HoldEvent(key, se.Seq)
	}
	return materializeInto(tx, in.Def, in.Horizon, in.Event, se.RowKey, in.ID, ns)
}

func resolveKey(def persistence.TableDef, e *messages.Event) (messages.Reason, string) {
	err := materialize.ResolveKey(def, e.Key)
	switch {
	case err == nil:
		return messages.ReasonNone, ""
	case errors.Is(err, messages.ErrEmptyRowKey):
		return messages.ReasonEmptyRowKey, err.Error()
	case errors.Is(err, materialize.ErrUnknownKeyColumn):
		return messages.ReasonUnknownKeyColumn, err.Error()
	default:
		return messages.ReasonIncompleteKey, err.Error()
	}
}

func stored(req *Apply) persistence.StoredEvent {
	e := req.Event
	return persistence.StoredEvent{ID: req.ID, Raw: req.Raw, Site: e.Site, HLC: e.HLC, Schema: e.Schema, Table: e.Table, RowKey: req.RowKey, Prepared: req.Prepared}
}

// RowLog reads a row's retained events from tx for a rebuild.
func RowLog(tx persistence.SyncReader, t persistence.TableKey, rowKey []byte) materialize.Log {
	return func(yield func(messages.EventID, *messages.Event) error) error {
		return tx.RowEvents(t, rowKey, func(se persistence.StoredEvent) (bool, error) {
			ev, err := sign.ParseVerified(se.Raw)
			if err != nil {
				return false, fmt.Errorf("%w: retained event %s: %v", persistence.ErrCorrupt, se.ID, err)
			}
			return true, yield(se.ID, ev)
		})
	}
}

// keyedRowReader is implemented by stores that can read a row without
// decoding its key when the caller already holds the key columns (the
// bolt store); others are read with Row.
type keyedRowReader interface {
	RowWithKey(t persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error)
}

// rowUpdater is implemented by stores that lend a row read for an update
// from the transaction's memory, valid until the next such read (the bolt
// store: no map and copy per applied event).
type rowUpdater interface {
	RowForUpdate(t persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error)
}

func materializeInto(tx persistence.SyncTx, def persistence.TableDef, h messages.HLC, e *messages.Event, rowKey []byte, id messages.EventID, ns *notices) error {
	t := persistence.TableKey{Schema: e.Schema, Table: e.Table}
	var row persistence.Row
	var err error
	if ru, ok := tx.(rowUpdater); ok {
		// The row is consumed (PutRow, AppendChange) before the next read.
		row, _, err = ru.RowForUpdate(t, rowKey, e.Key)
	} else if kr, ok := tx.(keyedRowReader); ok {
		row, _, err = kr.RowWithKey(t, rowKey, e.Key) // rowKey is e.Key's encoding
	} else {
		row, _, err = tx.Row(t, rowKey)
	}
	if err != nil {
		return err
	}
	// The row is this transaction's own copy: hand it over.
	nr, fx, ch, changed, err := materialize.ApplyChange(def, h, row, id, e, RowLog(tx, t, rowKey), persistence.CauseEvent)
	if err != nil {
		return err
	}
	if err := tx.PutRow(nr); err != nil {
		return err
	}
	// The change log is written in the transaction that writes the row.
	if changed {
		if _, err := tx.AppendChange(ch); err != nil {
			return err
		}
	}
	if fx.Resurrected {
		*ns = append(*ns, messages.Resurrection{Schema: e.Schema, Table: e.Table, Key: e.Key, By: e.ClockOf(id), Tomb: fx.Tomb, EventID: id})
		if fx.Partial {
			// §13.4: a partial rebuild MUST NOT pass as complete.
			*ns = append(*ns, messages.PartialRebuild{Schema: e.Schema, Table: e.Table, Key: e.Key, Tomb: fx.Tomb, Horizon: h, EventID: id})
		}
	}
	if len(fx.Ignored) > 0 {
		*ns = append(*ns, messages.ColumnsIgnored{Schema: e.Schema, Table: e.Table, EventID: id, Columns: fx.Ignored})
	}
	if bad := mistyped(def, e); len(bad) > 0 {
		*ns = append(*ns, messages.TypeMismatch{Schema: e.Schema, Table: e.Table, EventID: id, Columns: bad})
	}
	return nil
}

// mistyped lists the columns of e (key and payload) whose value is not of
// the type def declares, in name order. The event is materialized as it
// is anyway: its values are signed, and a node declaring other types must
// reach the same cells (SSP/1 §13.1).
func mistyped(def persistence.TableDef, e *messages.Event) []string {
	if len(def.Types) == 0 {
		return nil
	}
	var bad []string
	for _, cols := range []messages.Columns{e.Key, e.Payload} {
		for c, v := range cols {
			if def.TypeOf(c).Check(c, v) != nil {
				bad = append(bad, c)
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// release materializes the group's held events once its table exists,
// each through Decide and execute as a new event is (Input.Released: it
// is in the log already, and was surfaced when it was held).
func release(tx persistence.SyncTx, key persistence.GroupKey, ns *notices) (int, error) {
	tc := &tableCache{}
	if err := tc.load(tx, persistence.TableKey{Schema: key.Schema, Table: key.Table}); err != nil || !tc.defined {
		return 0, err
	}
	seqs, err := tx.HeldEvents(key)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, seq := range seqs {
		var se persistence.StoredEvent
		found := false
		if err := tx.EventsAfter(seq-1, 1, func(s persistence.StoredEvent) (bool, error) {
			se, found = s, s.Seq == seq
			return false, nil
		}); err != nil {
			return 0, err
		}
		if !found {
			continue // reclaimed below a horizon meanwhile
		}
		e, err := sign.ParseVerified(se.Raw)
		if err != nil {
			return 0, fmt.Errorf("%w: held event %s: %v", persistence.ErrCorrupt, se.ID, err)
		}
		n++
		in := Input{ID: se.ID, Event: e, Released: true, Defined: true, Def: tc.def, Horizon: tc.horizon}
		d := Decide(in)
		*ns = append(*ns, d.Notices...)
		if err := execute(tx, key, d, in, se, ns); err != nil {
			return 0, err
		}
	}
	if len(seqs) > 0 {
		*ns = append(*ns, messages.GroupReleased{Site: key.Site, Schema: key.Schema, Table: key.Table, Events: n})
	}
	return n, tx.ReleaseGroup(key)
}
