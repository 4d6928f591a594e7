package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/actors/materialize"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Batch writes: many rows in one call, one storage transaction and one
// fsync. Each row is still its own signed event with its own HLC (SSP/1
// §12: every event is authenticated on its own, so a peer receives,
// verifies, reconciles and materializes the rows of a batch exactly as if
// they had been written one at a time); only the local commit is shared.
// The events go through the apply chokepoint together (apply.ApplyWith)
// and the transaction keeps them only if every one of them applied, so a
// batch is visible locally all at once or not at all.

// MaxBatchRows bounds the writes of one Batch: the events of a batch are
// held in memory and committed in one transaction, so it is the bound a
// received push's transaction has (messages.MaxPushEvents, SSP/1 §14).
const MaxBatchRows = messages.MaxPushEvents

// ErrBatchTooLarge: a Batch holds more than MaxBatchRows writes.
var ErrBatchTooLarge = errors.New("runtime: batch holds too many writes")

// Batch collects upserts and deletes to write with Node.Write. The zero
// value is an empty batch. A Batch is not safe for concurrent use; it may
// be written again (each Write signs new events).
type Batch struct {
	ops []batchOp
}

type batchOp struct {
	schema, table string
	key, values   map[string]any
	del           bool
}

// Upsert adds an upsert of one row (see Node.Upsert) and returns b.
func (b *Batch) Upsert(schema, table string, key, values map[string]any) *Batch {
	if values == nil {
		values = map[string]any{}
	}
	b.ops = append(b.ops, batchOp{schema: schema, table: table, key: key, values: values})
	return b
}

// Delete adds a delete of one row (see Node.Delete) and returns b.
func (b *Batch) Delete(schema, table string, key map[string]any) *Batch {
	b.ops = append(b.ops, batchOp{schema: schema, table: table, key: key, del: true})
	return b
}

// Len returns how many writes b holds.
func (b *Batch) Len() int { return len(b.ops) }

// Reset empties b, keeping its memory.
func (b *Batch) Reset() { clear(b.ops); b.ops = b.ops[:0] }

// BatchError is the error of a Batch refused as a whole: Index is the
// write that refused it (its position in the batch; -1 when the batch as
// a whole is at fault). Nothing of the batch was kept. It unwraps to the
// write's own error, so errors.Is matches ErrUnknownColumn,
// ErrInvalidKey, ErrTypeMismatch, ErrNotApplied and the others.
type BatchError struct {
	Index int
	Err   error
}

// Error implements the error interface.
func (e *BatchError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("runtime: batch refused: %v", e.Err)
	}
	return fmt.Sprintf("runtime: batch refused at write %d: %v", e.Index, e.Err)
}

// Unwrap returns the write's error.
func (e *BatchError) Unwrap() error { return e.Err }

// Write signs every write of b as its own event and applies them all in
// one storage transaction: it returns once they are durable together, with
// one outcome per write in b's order. A write that is invalid (unknown
// table or column, bad key, a value of the wrong type) or that the
// chokepoint would not apply refuses the whole batch with a *BatchError:
// nothing of it is kept or visible. Rows written twice in one batch end as
// the later write says, as with one call after the other. An empty batch
// writes nothing.
func (n *Node) Write(ctx context.Context, b *Batch) ([]messages.Outcome, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	if b == nil || len(b.ops) == 0 {
		return nil, nil
	}
	if len(b.ops) > MaxBatchRows {
		return nil, &BatchError{Index: -1, Err: fmt.Errorf("%w: %d writes, limit %d", ErrBatchTooLarge, len(b.ops), MaxBatchRows)}
	}
	events, err := n.batchEvents(ctx, b.ops)
	if err != nil {
		return nil, err
	}
	if err := n.awaitClock(ctx); err != nil { // restore.go: Config.Restored
		return nil, err
	}
	// Every HLC issued and registered in flight before any event is
	// applied: the groups' own watermarks stay below them until the batch
	// is durable (§14.2).
	raws := make([][]byte, len(events))
	groups := make([]persistence.GroupKey, len(events))
	issued := 0
	end := func(durable bool) {
		for i := range issued {
			n.own.End(groups[i], events[i].HLC, durable)
		}
	}
	for i, e := range events {
		groups[i] = persistence.GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table}
		if e.HLC, err = n.own.Begin(groups[i], n.clock.Now); err != nil {
			end(true) // nothing applied yet
			return nil, err
		}
		issued++
		if raws[i], err = n.signer.Sign(e, n.meshID); err != nil {
			end(true)
			return nil, err
		}
	}
	var refused error
	outs, err := n.apply.ApplyWith(ctx, raws, func(_ persistence.SyncTx, outs []messages.Outcome) (func(), error) {
		// The events stay only if every one applied: returning an error
		// rolls the whole transaction back.
		refused = nil
		for i, out := range outs {
			if out.Kind != messages.Applied {
				refused = &BatchError{Index: i, Err: &NotAppliedError{Schema: events[i].Schema, Table: events[i].Table, Outcome: out}}
				return nil, refused
			}
		}
		return nil, nil
	})
	if err != nil {
		// A refusal is known to have kept nothing; any other error (a
		// cancelled wait) may still commit, so the HLCs stay in flight.
		end(refused != nil && errors.Is(err, refused))
		if refused != nil && errors.Is(err, refused) {
			return nil, refused
		}
		return nil, err
	}
	end(true)
	return outs, nil
}

// batchEvents validates every write of ops and builds its event (HLC not
// yet issued); the first invalid write refuses the batch.
func (n *Node) batchEvents(ctx context.Context, ops []batchOp) ([]*messages.Event, error) {
	defs := map[persistence.TableKey]TableDef{}
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		for i, op := range ops {
			t := persistence.TableKey{Schema: op.schema, Table: op.table}
			if _, ok := defs[t]; ok {
				continue
			}
			_, def, err := requireTable(tx, op.schema, op.table)
			if err != nil {
				return &BatchError{Index: i, Err: err}
			}
			defs[t] = def
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	site := n.signer.Site()
	events := make([]*messages.Event, len(ops))
	for i, op := range ops {
		def := defs[persistence.TableKey{Schema: op.schema, Table: op.table}]
		e, err := localEvent(site, def, op.key, op.values, op.del)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		events[i] = e
	}
	return events, nil
}

// localEvent builds and validates the event of one local write against
// the table's definition (HLC not yet issued).
func localEvent(site messages.SiteID, def TableDef, key, values map[string]any, del bool) (*messages.Event, error) {
	k, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := materialize.ResolveKey(def, k); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	if err := checkTypes(def, k); err != nil {
		return nil, err
	}
	e := &messages.Event{Site: site, Schema: def.Schema, Table: def.Table, Key: k, Delete: del}
	if !del {
		if e.Payload, err = encodeColumns(values); err != nil {
			return nil, err
		}
		for c := range e.Payload {
			if !slices.Contains(def.Columns, c) {
				return nil, fmt.Errorf("%w: %s.%s.%s", ErrUnknownColumn, def.Schema, def.Table, c)
			}
		}
		if err := checkTypes(def, e.Payload); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// checkTypes refuses a local write whose value is not of its column's
// declared type (a *TypeError matching ErrTypeMismatch). Only local
// writes are refused: a received value is signed and kept as it is.
func checkTypes(def TableDef, cols messages.Columns) error {
	if len(def.Types) == 0 {
		return nil
	}
	for _, c := range cols.Names() {
		if err := def.TypeOf(c).Check(c, cols[c]); err != nil {
			return fmt.Errorf("runtime: %s.%s: %w", def.Schema, def.Table, err)
		}
	}
	return nil
}
