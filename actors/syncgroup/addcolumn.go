package syncgroup

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/actors/materialize"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Adding a column rebuilds it for every row of its table from the retained
// log (SSP/1 §13.6). A large table is rebuilt in bounded chunks, one
// committer transaction each, so no transaction holds every row and the
// applies of other events interleave with it; the progress is stored in
// the chunk's own transaction, so a crash resumes from the last durable
// chunk.
//
// Meanwhile (docs/architecture.md, "Adding a column"): the definition
// carries the new column from the first transaction on, so events applied
// meanwhile materialize it like any column; a row not yet rebuilt reads
// the column as it stood before (never written, or cleared by a delete);
// a rebuilt row reads the value the one-shot rebuild would give. The
// result equals a one-shot rebuild because both the rebuild and an apply
// only raise a cell to the highest retained upsert carrying it that beats
// the row's tombstone clock, whatever the order.

// ColumnRebuild is a column whose rebuild has not finished yet.
type ColumnRebuild struct {
	Schema string `cbor:"1,keyasint"`
	Table  string `cbor:"2,keyasint"`
	Column string `cbor:"3,keyasint"`
	// After is the last row key rebuilt (empty: none yet); rows are
	// rebuilt in the natural order of their keys (SyncReader.Rows).
	After []byte `cbor:"4,keyasint,omitempty"`
}

// metaColumnRebuilds holds the pending rebuilds, in the order they were
// begun, in the sync store's meta bucket (a small list: no layout change).
const metaColumnRebuilds = "sync.column_rebuilds"

var rebuildEnc, _ = cbor.CoreDetEncOptions().EncMode()

// ColumnRebuilds lists the column rebuilds not finished yet.
func ColumnRebuilds(tx persistence.SyncReader) ([]ColumnRebuild, error) {
	b, ok, err := tx.Meta(metaColumnRebuilds)
	if err != nil || !ok || len(b) == 0 {
		return nil, err
	}
	var rs []ColumnRebuild
	if err := cbor.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("%w: column rebuilds: %v", persistence.ErrCorrupt, err)
	}
	return rs, nil
}

func putColumnRebuilds(tx persistence.SyncTx, rs []ColumnRebuild) error {
	if len(rs) == 0 {
		rs = []ColumnRebuild{}
	}
	b, err := rebuildEnc.Marshal(rs)
	if err != nil {
		return err
	}
	return tx.PutMeta(metaColumnRebuilds, b)
}

// BeginAddColumn, inside a committer transaction (Router.Write), stores
// def with column added and records the column's pending rebuild, which
// RebuildColumns then runs. The caller has checked that column is new and
// valid.
func BeginAddColumn(tx persistence.SyncTx, def persistence.TableDef, column string) error {
	def.Columns = append(slices.Clone(def.Columns), column)
	if err := tx.PutTable(def); err != nil {
		return err
	}
	rs, err := ColumnRebuilds(tx)
	if err != nil {
		return err
	}
	return putColumnRebuilds(tx, append(rs, ColumnRebuild{Schema: def.Schema, Table: def.Table, Column: column}))
}

// RebuildColumns runs every pending column rebuild to its end, chunk rows
// (≥ 1) per committer transaction. after, when set, is called once each
// chunk is durable with the rebuild as it stands; an error from it stops
// here, the rest staying pending (a later call, or the next Open, resumes).
func (r *Router) RebuildColumns(ctx context.Context, chunk int, after func(ColumnRebuild) error) error {
	if chunk < 1 {
		chunk = 1
	}
	for {
		var step ColumnRebuild
		var more bool
		if err := r.Write(ctx, func(tx persistence.SyncTx) error {
			var err error
			step, more, err = rebuildChunk(tx, chunk)
			return err
		}); err != nil {
			return err
		}
		if !more {
			return nil
		}
		if after != nil {
			if err := after(step); err != nil {
				return err
			}
		}
	}
}

// rebuildChunk rebuilds up to chunk rows of the first pending column
// rebuild inside tx and stores how far it got (the rebuild is dropped
// from the list once it passed the last row). It returns the rebuild as
// it now stands; pending is false when there was none.
func rebuildChunk(tx persistence.SyncTx, chunk int) (step ColumnRebuild, pending bool, err error) {
	rs, err := ColumnRebuilds(tx)
	if err != nil || len(rs) == 0 {
		return ColumnRebuild{}, false, err
	}
	cur := rs[0]
	t := persistence.TableKey{Schema: cur.Schema, Table: cur.Table}
	def, ok, err := tx.Table(t)
	if err != nil {
		return ColumnRebuild{}, false, err
	}
	if !ok || !slices.Contains(def.Columns, cur.Column) {
		return ColumnRebuild{}, false, fmt.Errorf("%w: column rebuild of %s.%s.%s: no such column", persistence.ErrCorrupt, cur.Schema, cur.Table, cur.Column)
	}
	h, err := tx.Horizon(t)
	if err != nil {
		return ColumnRebuild{}, false, err
	}
	var rows []persistence.Row
	var last []byte
	var after []byte
	if len(cur.After) > 0 {
		after = cur.After
	}
	if err := tx.Rows(t, after, func(k []byte, row persistence.Row) (bool, error) {
		rows = append(rows, row)
		last = bytes.Clone(k)
		return len(rows) < chunk, nil
	}); err != nil {
		return ColumnRebuild{}, false, err
	}
	for _, row := range rows {
		nr, changed, err := materialize.AddColumn(def, h, row, cur.Column, RowLog(tx, t, row.Key.Encode()))
		if err != nil {
			return ColumnRebuild{}, false, err
		}
		if !changed {
			continue
		}
		if err := tx.PutRow(nr); err != nil {
			return ColumnRebuild{}, false, err
		}
		if ch, ok := materialize.Change(row, nr, persistence.CauseAddColumn, messages.Clock{}); ok {
			if _, err := tx.AppendChange(ch); err != nil {
				return ColumnRebuild{}, false, err
			}
		}
	}
	if len(rows) < chunk {
		rs = rs[1:] // past the last row: done
	} else {
		cur.After = last
		rs[0] = cur
	}
	return cur, true, putColumnRebuilds(tx, rs)
}
