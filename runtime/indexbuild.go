package runtime

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/persistence"
)

// An index declared on a table that has rows is built from them in
// chunks, like an AddColumn rebuild (tables.go): one committer
// transaction per Config.AddColumnChunk rows, the progress stored in the
// chunk's own transaction, so a crash resumes from the last durable chunk
// (the next Open, or the next EnsureTable). From the first transaction
// on, the definition carries the index, so every row written meanwhile
// (applies, deletes, resurrections, column rebuilds) moves its own entry
// with it (persistence.SyncTx.PutRow); the build puts the entry of each
// row it passes as the row then stands, so the result is the index a
// table declaring it from the start would have. A query of the index
// fails with ErrIndexBuilding until the build is done.

// FailpointIndexBuildChunk is passed to Config.Failpoint after each chunk
// of an index build is durable; an error stops the build there (it stays
// pending and resumes on the next EnsureTable or Open).
const FailpointIndexBuildChunk = "sync.indexbuild.chunk.after_commit"

// indexBuild is an index whose build has not finished.
type indexBuild struct {
	Schema string `cbor:"1,keyasint"`
	Table  string `cbor:"2,keyasint"`
	Index  string `cbor:"3,keyasint"`
	// After is the encoded key of the last row indexed (empty: none yet).
	After []byte `cbor:"4,keyasint,omitempty"`
}

// metaIndexBuilds holds the pending builds, in the order they were begun,
// in the sync store's meta bucket.
const metaIndexBuilds = "sync.index_builds"

var indexBuildEnc, _ = cbor.CoreDetEncOptions().EncMode()

func indexBuilds(tx persistence.SyncReader) ([]indexBuild, error) {
	b, ok, err := tx.Meta(metaIndexBuilds)
	if err != nil || !ok || len(b) == 0 {
		return nil, err
	}
	var bs []indexBuild
	if err := cbor.Unmarshal(b, &bs); err != nil {
		return nil, fmt.Errorf("%w: index builds: %v", persistence.ErrCorrupt, err)
	}
	return bs, nil
}

func putIndexBuilds(tx persistence.SyncTx, bs []indexBuild) error {
	if len(bs) == 0 {
		bs = []indexBuild{}
	}
	b, err := indexBuildEnc.Marshal(bs)
	if err != nil {
		return err
	}
	return tx.PutMeta(metaIndexBuilds, b)
}

// building reports whether index of schema.table is still being built.
func building(tx persistence.SyncReader, schema, table, index string) (bool, error) {
	bs, err := indexBuilds(tx)
	return slices.ContainsFunc(bs, func(b indexBuild) bool {
		return b.Schema == schema && b.Table == table && b.Index == index
	}), err
}

// beginIndexes, inside a committer transaction, stores the table's
// definition (re-read: the transaction may have changed it) with the
// indexes added and records their builds.
func (n *Node) beginIndexes(tx persistence.SyncTx, def TableDef, add []IndexDef) error {
	cur, ok, err := tx.Table(persistence.TableKey{Schema: def.Schema, Table: def.Table})
	if err != nil {
		return err
	}
	if !ok {
		cur = def
	}
	cur.Indexes = append(persistence.CloneIndexes(cur.Indexes), persistence.CloneIndexes(add)...)
	if err := tx.PutTable(cur); err != nil {
		return err
	}
	bs, err := indexBuilds(tx)
	if err != nil {
		return err
	}
	for _, x := range add {
		bs = append(bs, indexBuild{Schema: def.Schema, Table: def.Table, Index: x.Name})
	}
	return putIndexBuilds(tx, bs)
}

// buildIndexes runs the pending index builds to their end.
func (n *Node) buildIndexes(ctx context.Context) error {
	chunk := n.cfg.AddColumnChunk
	if chunk <= 0 {
		chunk = DefaultAddColumnChunk
	}
	for {
		var more bool
		if err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
			var err error
			more, err = buildIndexChunk(tx, chunk)
			return err
		}); err != nil {
			return err
		}
		if !more {
			return nil
		}
		if fp := n.cfg.Failpoint; fp != nil {
			if err := fp(FailpointIndexBuildChunk); err != nil {
				return fmt.Errorf("runtime: failpoint %s: %w", FailpointIndexBuildChunk, err)
			}
		}
	}
}

// buildIndexChunk indexes up to chunk rows of the first pending build
// inside tx and stores how far it got (the build is dropped from the
// list once it passed the last row); pending is false when there was
// none.
func buildIndexChunk(tx persistence.SyncTx, chunk int) (pending bool, err error) {
	bs, err := indexBuilds(tx)
	if err != nil || len(bs) == 0 {
		return false, err
	}
	cur := bs[0]
	t := persistence.TableKey{Schema: cur.Schema, Table: cur.Table}
	def, ok, err := tx.Table(t)
	if err != nil {
		return false, err
	}
	if _, has := def.Index(cur.Index); !ok || !has {
		return false, fmt.Errorf("%w: index build of %s.%s %q: no such index", persistence.ErrCorrupt, cur.Schema, cur.Table, cur.Index)
	}
	var after []byte
	if len(cur.After) > 0 {
		after = cur.After
	}
	var rows []persistence.Row
	var last []byte
	if err := tx.Rows(t, after, func(k []byte, row persistence.Row) (bool, error) {
		rows = append(rows, row)
		last = bytes.Clone(k)
		return len(rows) < chunk, nil
	}); err != nil {
		return false, err
	}
	for _, row := range rows {
		if err := tx.IndexRow(t, cur.Index, row); err != nil {
			return false, err
		}
	}
	if len(rows) < chunk {
		bs = bs[1:]
	} else {
		cur.After = last
		bs[0] = cur
	}
	return true, putIndexBuilds(tx, bs)
}
