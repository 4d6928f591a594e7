package runtime

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The node's DDL: tables, columns, horizons. Every change is written by
// the sync plane's committer (syncgroup.Router.Write), in its transaction
// queue with the applies, never by a transaction of its own
// (docs/architecture.md, "Actor topology").

// FailpointAddColumnChunk is passed to Config.Failpoint after each chunk
// of an AddColumn rebuild is durable; an error stops the rebuild there
// (it stays pending and resumes on the next AddColumn of that column or
// the next Open).
const FailpointAddColumnChunk = "sync.addcolumn.chunk.after_commit"

// DefaultAddColumnChunk is Config.AddColumnChunk's default.
const DefaultAddColumnChunk = 1000

// DefineTable defines a destination table. Defining an existing table
// again with the same definition is a no-op; with another, an error
// (ErrTableConflict). At start-up use EnsureTable, which also accepts a
// table that has grown since (AddColumn). Groups held for the table are materialized (§13.6).
func (n *Node) DefineTable(ctx context.Context, def TableDef) error {
	if err := validateDef(def); err != nil {
		return err
	}
	if n.isClosed() {
		return ErrClosed
	}
	created := false
	err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
		created = false
		old, ok, err := tx.Table(persistence.TableKey{Schema: def.Schema, Table: def.Table})
		if err != nil {
			return err
		}
		if ok {
			if !slices.Equal(old.KeyColumns, def.KeyColumns) || !slices.Equal(old.Columns, def.Columns) || !sameTypes(old, def) || !sameIndexes(old.Indexes, def.Indexes) {
				return fmt.Errorf("%w: %s.%s", ErrTableConflict, def.Schema, def.Table)
			}
			return nil
		}
		created = true
		return tx.PutTable(def)
	})
	if err != nil {
		return err
	}
	if err := n.releaseDefined(ctx, def.Schema+"\x00"+def.Table); err != nil {
		return err
	}
	if created {
		// A new synced table: what peers hold of it (events this node
		// dropped or never held before it existed) comes back by
		// reconciliation on every link it receives from (reconcile.go).
		n.reconcileAllInBackground()
	}
	return nil
}

// EnsureTable makes the table have at least def's columns, and is the
// call for an application's start-up: it defines a missing table, adds
// (AddColumn, with its rebuild from the retained log) each of def's value
// columns the stored definition lacks, and keeps the columns the stored
// definition has beyond def. A node whose schema is ahead of def (a
// rollback, or an older build in a rolling upgrade) therefore starts
// unchanged instead of failing; calling it again changes nothing. Only
// what adding cannot reconcile fails with ErrTableConflict: other key
// columns (a row's key is its identity, SSP/1 §13), or a column declared
// with another type than the stored one (a column stored as any takes
// the declared type; a stored type def leaves as any stays). Held groups of the table are materialized
// (§13.6).
func (n *Node) EnsureTable(ctx context.Context, def TableDef) error {
	if err := validateDef(def); err != nil {
		return err
	}
	if n.isClosed() {
		return ErrClosed
	}
	added, indexed := false, false
	if err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
		added, indexed = false, false
		cur, ok, err := tx.Table(persistence.TableKey{Schema: def.Schema, Table: def.Table})
		if err != nil {
			return err
		}
		if !ok {
			return tx.PutTable(def)
		}
		if !slices.Equal(cur.KeyColumns, def.KeyColumns) {
			return fmt.Errorf("%w: %s.%s: key columns %v, stored %v", ErrTableConflict, def.Schema, def.Table, def.KeyColumns, cur.KeyColumns)
		}
		// Types: a column stored as any takes def's type (declared
		// later); a stored type def does not declare stays (a store
		// ahead); two different declared types are a change, not an
		// addition.
		typed := maps.Clone(cur.Types)
		for c, t := range def.Types {
			switch st := cur.TypeOf(c); {
			case t == messages.TypeAny || st == t:
			case st == messages.TypeAny:
				if typed == nil {
					typed = map[string]messages.ColumnType{}
				}
				typed[c] = t
			default:
				return fmt.Errorf("%w: %s.%s: column %q is %s, stored %s", ErrTableConflict, def.Schema, def.Table, c, t, st)
			}
		}
		if !maps.Equal(typed, cur.Types) {
			cur.Types = typed
			if err := tx.PutTable(cur); err != nil {
				return err
			}
		}
		for _, c := range def.Columns {
			if slices.Contains(cur.Columns, c) {
				continue
			}
			if err := syncgroup.BeginAddColumn(tx, cur, c); err != nil {
				return err
			}
			cur.Columns = append(slices.Clone(cur.Columns), c)
			added = true
		}
		// Indexes: a missing one is added (and built from the rows); one
		// stored under the name with other columns is a change.
		var newIdx []IndexDef
		for _, x := range def.Indexes {
			if old, ok := cur.Index(x.Name); ok {
				if !slices.Equal(old.Columns, x.Columns) {
					return fmt.Errorf("%w: %s.%s: index %q is over %v, stored over %v", ErrTableConflict, def.Schema, def.Table, x.Name, x.Columns, old.Columns)
				}
				continue
			}
			newIdx = append(newIdx, x)
		}
		if len(newIdx) > 0 {
			if err := n.beginIndexes(tx, cur, newIdx); err != nil {
				return err
			}
			indexed = true
		}
		return nil
	}); err != nil {
		return err
	}
	if added {
		if err := n.rebuildColumns(ctx); err != nil {
			return err
		}
	}
	if indexed {
		if err := n.buildIndexes(ctx); err != nil {
			return err
		}
	}
	return n.releaseDefined(ctx, def.Schema+"\x00"+def.Table)
}

// releaseDefined releases held groups whose table exists (only=""), or
// those of one table ("schema\x00table").
func (n *Node) releaseDefined(ctx context.Context, only string) error {
	var keys []persistence.GroupKey
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		held, err := tx.HeldGroups()
		if err != nil {
			return err
		}
		for _, g := range held {
			if only != "" && g.Schema+"\x00"+g.Table != only {
				continue
			}
			if _, ok, err := tx.Table(persistence.TableKey{Schema: g.Schema, Table: g.Table}); err != nil {
				return err
			} else if ok {
				keys = append(keys, g)
			}
		}
		return nil
	})
	if err != nil || len(keys) == 0 {
		return err
	}
	_, err = n.router.Release(ctx, keys)
	return err
}

func validateDef(def TableDef) error {
	if def.Schema == "" || def.Table == "" {
		return fmt.Errorf("runtime: table needs a schema and a name")
	}
	if len(def.KeyColumns) == 0 {
		return fmt.Errorf("runtime: table %s.%s needs at least one key column", def.Schema, def.Table)
	}
	seen := map[string]bool{}
	for _, c := range append(append([]string(nil), def.KeyColumns...), def.Columns...) {
		if c == "" || len(c) > 255 {
			return fmt.Errorf("runtime: table %s.%s: column names must be 1..255 bytes", def.Schema, def.Table)
		}
		if seen[c] {
			return fmt.Errorf("runtime: table %s.%s: column %q listed twice", def.Schema, def.Table, c)
		}
		seen[c] = true
	}
	names := map[string]bool{}
	for _, x := range def.Indexes {
		if x.Name == "" || len(x.Name) > 255 {
			return fmt.Errorf("runtime: table %s.%s: index names must be 1..255 bytes", def.Schema, def.Table)
		}
		if names[x.Name] {
			return fmt.Errorf("runtime: table %s.%s: index %q listed twice", def.Schema, def.Table, x.Name)
		}
		names[x.Name] = true
		if len(x.Columns) == 0 {
			return fmt.Errorf("runtime: table %s.%s: index %q needs at least one column", def.Schema, def.Table, x.Name)
		}
		for i, c := range x.Columns {
			if !seen[c] {
				return fmt.Errorf("runtime: table %s.%s: index %q is over %q, which is not a column", def.Schema, def.Table, x.Name, c)
			}
			if slices.Contains(x.Columns[:i], c) {
				return fmt.Errorf("runtime: table %s.%s: index %q lists %q twice", def.Schema, def.Table, x.Name, c)
			}
		}
	}
	for c, t := range def.Types {
		if !seen[c] {
			return fmt.Errorf("runtime: table %s.%s: type declared for %q, which is not a column", def.Schema, def.Table, c)
		}
		if !t.Known() {
			return fmt.Errorf("runtime: table %s.%s: column %q: unknown type %d", def.Schema, def.Table, c, t)
		}
	}
	return nil
}

// sameIndexes reports whether a and b declare the same indexes, in any
// order.
func sameIndexes(a, b []IndexDef) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y IndexDef) bool { return y.Name == x.Name && slices.Equal(y.Columns, x.Columns) }) {
			return false
		}
	}
	return true
}

// sameTypes reports whether a and b declare the same type for every
// column of a.
func sameTypes(a, b TableDef) bool {
	for _, c := range append(slices.Clone(a.KeyColumns), a.Columns...) {
		if a.TypeOf(c) != b.TypeOf(c) {
			return false
		}
	}
	return true
}

// AddColumn adds a value column and rebuilds it for every row from the
// retained event log (SSP/1 §13.6), so values received while the column
// was unknown are recovered (down to the eviction horizon). It returns
// once every row is rebuilt.
//
// The rebuild runs in chunks of Config.AddColumnChunk rows, one committer
// transaction each, its progress stored with each chunk: a crash resumes
// it on the next Open (or the next AddColumn of the column). Meanwhile
// the table's definition already has the column, events applied meanwhile
// write it, and a row not yet rebuilt reads it as it stood before (never
// written, or cleared by a delete). The result equals a one-shot rebuild.
func (n *Node) AddColumn(ctx context.Context, schema, table, column string) error {
	if n.isClosed() {
		return ErrClosed
	}
	if err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
		_, def, err := requireTable(tx, schema, table)
		if err != nil {
			return err
		}
		if slices.Contains(def.Columns, column) {
			return nil // added already; a pending rebuild resumes below
		}
		if slices.Contains(def.KeyColumns, column) {
			return fmt.Errorf("runtime: %q is a key column of %s.%s", column, schema, table)
		}
		next := def
		next.Columns = append(slices.Clone(def.Columns), column)
		if err := validateDef(next); err != nil {
			return err
		}
		return syncgroup.BeginAddColumn(tx, def, column)
	}); err != nil {
		return err
	}
	return n.rebuildColumns(ctx)
}

// rebuildColumns runs the pending column rebuilds to their end (AddColumn,
// and Open after a crash).
func (n *Node) rebuildColumns(ctx context.Context) error {
	chunk := n.cfg.AddColumnChunk
	if chunk <= 0 {
		chunk = DefaultAddColumnChunk
	}
	var after func(syncgroup.ColumnRebuild) error
	if fp := n.cfg.Failpoint; fp != nil {
		after = func(syncgroup.ColumnRebuild) error {
			if err := fp(FailpointAddColumnChunk); err != nil {
				return fmt.Errorf("runtime: failpoint %s: %w", FailpointAddColumnChunk, err)
			}
			return nil
		}
	}
	return n.router.RebuildColumns(ctx, chunk, after)
}

// SetHorizon sets a table's eviction horizon and reclaims the retained
// log below it. Events arriving below it count as applied and write
// nothing; rebuilds never read below it (SSP/1 §13.4, §13.5). It returns
// how many log entries were reclaimed.
func (n *Node) SetHorizon(ctx context.Context, schema, table string, h messages.HLC) (int, error) {
	if n.isClosed() {
		return 0, ErrClosed
	}
	var reclaimed int
	err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
		t := persistence.TableKey{Schema: schema, Table: table}
		if err := tx.SetHorizon(t, h); err != nil {
			return err
		}
		var err error
		reclaimed, err = tx.DeleteEventsBelow(t, h)
		return err
	})
	return reclaimed, err
}

// Horizon returns a table's eviction horizon.
func (n *Node) Horizon(ctx context.Context, schema, table string) (messages.HLC, error) {
	var h messages.HLC
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		h, err = tx.Horizon(persistence.TableKey{Schema: schema, Table: table})
		return err
	})
	return h, err
}
