package syncgroup

import (
	"context"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The sync store's invariants (actors/internal/invariants), checked on
// every write of a transaction when the build has the `invariants` tag:
// only the committer writes the sync plane's rows, log and table state
// (the one-writer rule of docs/architecture.md, "Actor topology"); every
// stored row is canonical; a stored watermark never goes down.

// ownerKey marks the context of the committer's transactions.
type ownerKey struct{}

// committerCtx is the context the committer runs its transactions with:
// the checked store admits writes of rows, log and table state only
// under it.
var committerCtx = context.WithValue(context.Background(), ownerKey{}, true)

// CheckWriters returns s with the sync store's invariant checks when the
// build has the `invariants` tag, and s itself otherwise. The node wraps
// its store with it once, outermost, so every writer's transaction is
// checked. Writes before a Router is made on the store (the node's own
// setup in Open, single-threaded) are the store's first owner's; from
// NewRouter on, only the committer writes.
func CheckWriters(s persistence.SyncStore) persistence.SyncStore {
	if !invariants.Enabled {
		return s
	}
	if _, ok := s.(checkedStore); ok {
		return s
	}
	return checkedStore{SyncStore: s, committed: new(atomic.Bool)}
}

type checkedStore struct {
	persistence.SyncStore
	committed *atomic.Bool // a committer owns the store (NewRouter)
}

// claim records that a committer now owns s, when s is checked.
func claim(s persistence.SyncStore) {
	if cs, ok := s.(checkedStore); ok {
		cs.committed.Store(true)
	}
}

func (s checkedStore) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	owner := ctx.Value(ownerKey{}) != nil || !s.committed.Load()
	return s.SyncStore.Update(ctx, func(tx persistence.SyncTx) error {
		return fn(&checkedTx{SyncTx: tx, owner: owner})
	})
}

// checkedTx is a transaction whose writes are checked.
type checkedTx struct {
	persistence.SyncTx
	owner bool // the committer's
}

func (t *checkedTx) own(what string) {
	if !t.owner {
		invariants.Fail("sync store: %s outside the committer", what)
	}
}

// RowWithKey keeps the bolt store's fast read path (group.go).
func (t *checkedTx) RowWithKey(tk persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error) {
	if kr, ok := t.SyncTx.(keyedRowReader); ok {
		return kr.RowWithKey(tk, rowKey, key)
	}
	return t.SyncTx.Row(tk, rowKey)
}

// RowForUpdate keeps the bolt store's lent row read (group.go).
func (t *checkedTx) RowForUpdate(tk persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error) {
	if ru, ok := t.SyncTx.(rowUpdater); ok {
		return ru.RowForUpdate(tk, rowKey, key)
	}
	return t.RowWithKey(tk, rowKey, key)
}

func (t *checkedTx) AppendEvent(ev persistence.StoredEvent) (uint64, error) {
	t.own("AppendEvent")
	return t.SyncTx.AppendEvent(ev)
}

func (t *checkedTx) PutRow(row persistence.Row) error {
	t.own("PutRow")
	if why := uncanonical(row); why != "" {
		invariants.Fail("sync store: PutRow %s.%s %v: not canonical: %s", row.Schema, row.Table, row.Key, why)
	}
	return t.SyncTx.PutRow(row)
}

func (t *checkedTx) AppendChange(c persistence.RowChange) (uint64, error) {
	t.own("AppendChange")
	return t.SyncTx.AppendChange(c)
}

func (t *checkedTx) HoldEvent(g persistence.GroupKey, seq uint64) error {
	t.own("HoldEvent")
	return t.SyncTx.HoldEvent(g, seq)
}

func (t *checkedTx) ReleaseGroup(g persistence.GroupKey) error {
	t.own("ReleaseGroup")
	return t.SyncTx.ReleaseGroup(g)
}

func (t *checkedTx) PurgeHeld(g persistence.GroupKey) (int, error) {
	t.own("PurgeHeld")
	return t.SyncTx.PurgeHeld(g)
}

func (t *checkedTx) PutTable(def persistence.TableDef) error {
	t.own("PutTable")
	return t.SyncTx.PutTable(def)
}

func (t *checkedTx) SetHorizon(tk persistence.TableKey, h messages.HLC) error {
	t.own("SetHorizon")
	return t.SyncTx.SetHorizon(tk, h)
}

func (t *checkedTx) DeleteEventsBelow(tk persistence.TableKey, h messages.HLC) (int, error) {
	t.own("DeleteEventsBelow")
	return t.SyncTx.DeleteEventsBelow(tk, h)
}

func (t *checkedTx) PutKey(k persistence.KeyEntry) error {
	t.own("PutKey")
	return t.SyncTx.PutKey(k)
}

// PutWatermark checks that the stored watermark did not go down: the
// store refuses a lower HLC (ErrWatermarkRegression), so one that went
// down anyway is a store or a caller bypassing it.
func (t *checkedTx) PutWatermark(g persistence.GroupKey, w persistence.Watermark) error {
	before, had, err := t.SyncTx.Watermark(g)
	if err != nil {
		return err
	}
	if err := t.SyncTx.PutWatermark(g, w); err != nil {
		return err
	}
	after, _, err := t.SyncTx.Watermark(g)
	if err != nil {
		return err
	}
	if had && after.HLC < before.HLC {
		invariants.Fail("sync store: watermark of %s/%s/%s went down from %d to %d", g.Site, g.Schema, g.Table, before.HLC, after.HLC)
	}
	return nil
}

// uncanonical says why row is not in the form the materializer writes
// ("" when it is). That form is what makes equal event sets give equal
// stored bytes (SSP/1 §13.1–§13.3): existence is the highest existence
// event, so it is never below the tombstone clock and equals it when the
// row is deleted; a cell is kept only when its clock beats the tombstone
// clock, and it was written by an event counted in existence.
func uncanonical(r persistence.Row) string {
	switch {
	case r.Schema == "" || r.Table == "":
		return "no table"
	case len(r.Key) == 0:
		return "empty key"
	case r.Existence.IsZero():
		return "no existence event"
	case r.Tomb.Beats(r.Existence):
		return "tombstone clock above existence"
	case !r.Exists && r.Existence != r.Tomb:
		return "deleted, but existence is not the tombstone clock"
	}
	for name, c := range r.Cells {
		switch {
		case !c.Clock.Beats(r.Tomb):
			return "cell " + name + " at or below the tombstone clock"
		case c.Clock.Beats(r.Existence):
			return "cell " + name + " above existence"
		}
	}
	return ""
}
