package runtime

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"sort"

	"github.com/syncmesh/syncmesh/actors/materialize"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TableDef defines a table: its key columns and its value columns.
type TableDef = persistence.TableDef

// CellState says whether a column was written, cleared by a delete, or
// never materialized (which is not a null: SSP/1 §13.6).
type CellState = materialize.CellState

// Cell states.
const (
	Unmaterialized = materialize.Unmaterialized
	Written        = materialize.Written
	Cleared        = materialize.Cleared
)

// ColumnType is a column's declared type (TableDef.Types).
type ColumnType = messages.ColumnType

// Column types (see messages.ColumnType).
const (
	TypeAny       = messages.TypeAny
	TypeInteger   = messages.TypeInteger
	TypeFloat     = messages.TypeFloat
	TypeText      = messages.TypeText
	TypeBytes     = messages.TypeBytes
	TypeBool      = messages.TypeBool
	TypeTimestamp = messages.TypeTimestamp
)

// TypeError is the error of a value not of its column's declared type:
// a local write refused, or a received cell read back (see Row.Value).
// It matches ErrTypeMismatch.
type TypeError = messages.TypeError

// Cell is one column of a row as a reader sees it.
type Cell struct {
	State CellState
	// Type is the column's declared type on this node. A received value
	// may be of another kind (it is kept as signed): Row.Value then fails
	// with a *TypeError.
	Type ColumnType
	// Value is the encoded CBOR value: messages.Null for an explicit or
	// cleared null, nil when Unmaterialized. Decode with Value.Decode.
	Value messages.Value
	// Clock is the clock of the write (or the tombstone clock for a
	// cleared cell); zero when Unmaterialized.
	Clock messages.Clock
}

// Row is a materialized row.
type Row struct {
	Schema, Table string
	Key           messages.Columns
	// Exists is false for a tombstoned row (only visible with IncludeDeleted).
	Exists    bool
	Existence messages.Clock
	Tomb      messages.Clock
	// Cells has one entry per value column of the table.
	Cells map[string]Cell
	// Cursor is the row's position in the order of the Query that
	// returned it (Query.After resumes after it); nil from other reads.
	Cursor Cursor
}

// Value decodes column col into out. It reports the column's state; out
// is untouched unless the state is Written or Cleared. A value that is not
// of the column's declared type (received from a node that declares
// another) is an error matching ErrTypeMismatch, and out is untouched:
// never a silent zero.
func (r Row) Value(col string, out any) (CellState, error) {
	c, ok := r.Cells[col]
	if !ok || c.State == Unmaterialized {
		return Unmaterialized, nil
	}
	if err := c.Type.Check(col, c.Value); err != nil {
		return c.State, err
	}
	return c.State, c.Value.Decode(out)
}

func viewRow(def TableDef, pr persistence.Row) Row {
	r := Row{Schema: pr.Schema, Table: pr.Table, Key: pr.Key, Exists: pr.Exists, Existence: pr.Existence, Tomb: pr.Tomb, Cells: map[string]Cell{}}
	for name, v := range materialize.View(def, pr) {
		r.Cells[name] = Cell{State: v.State, Type: def.TypeOf(name), Value: v.Value.Clone(), Clock: v.Clock}
	}
	return r
}

func encodeColumns(m map[string]any) (messages.Columns, error) {
	out := make(messages.Columns, len(m))
	for k, v := range m {
		if raw, ok := v.(messages.Value); ok {
			if err := messages.Wellformed(raw); err != nil {
				return nil, fmt.Errorf("runtime: column %q: %w", k, err)
			}
			out[k] = raw.Clone()
			continue
		}
		enc, err := messages.NewValue(v)
		if err != nil {
			return nil, fmt.Errorf("runtime: column %q: %w", k, err)
		}
		out[k] = enc
	}
	return out, nil
}

// Upsert writes columns of one row as a new signed event and applies it
// through the apply chokepoint. values may hold nil for an explicit null
// cell; a messages.Value is taken as already encoded. Key values are
// normalized (see NormalizeKey). It returns once the event is durable; an
// event the chokepoint did not apply is an error matching ErrNotApplied.
func (n *Node) Upsert(ctx context.Context, schema, table string, key, values map[string]any) (messages.Outcome, error) {
	if values == nil {
		values = map[string]any{}
	}
	return n.write(ctx, schema, table, key, values, false)
}

// Delete tombstones one row as a new signed event.
func (n *Node) Delete(ctx context.Context, schema, table string, key map[string]any) (messages.Outcome, error) {
	return n.write(ctx, schema, table, key, nil, true)
}

func (n *Node) write(ctx context.Context, schema, table string, key, values map[string]any, del bool) (messages.Outcome, error) {
	if n.isClosed() {
		return messages.Outcome{}, ErrClosed
	}
	def, err := n.table(ctx, schema, table)
	if err != nil {
		return messages.Outcome{}, err
	}
	e, err := localEvent(n.signer.Site(), def, key, values, del)
	if err != nil {
		return messages.Outcome{}, err
	}
	if err := n.awaitClock(ctx); err != nil { // restore.go: Config.Restored
		return messages.Outcome{}, err
	}
	// Issue the HLC and register the write as in flight in one step: the
	// group's own watermark stays below it until it is durable (§14.2).
	g := persistence.GroupKey{Site: e.Site, Schema: schema, Table: table}
	if e.HLC, err = n.own.Begin(g, n.clock.Now); err != nil {
		return messages.Outcome{}, err
	}
	raw, err := n.signer.Sign(e, n.meshID)
	if err != nil {
		n.own.End(g, e.HLC, true) // never applied: nothing can commit
		return messages.Outcome{}, err
	}
	// One apply path for local and remote events (SSP/1 §12).
	out, err := n.apply.Apply(ctx, raw)
	n.own.End(g, e.HLC, err == nil)
	return out, localOutcome(schema, table, out, err)
}

// Sign encodes and signs an event with the node's key without applying
// it (tools and tests). The event's Site is set to the node's; a zero HLC
// is replaced by a fresh one from the node's clock. A caller-chosen HLC is
// durably reserved first, so the node never issues it to another event
// (SSP/1 §13.5).
func (n *Node) Sign(e *messages.Event) ([]byte, error) {
	c := *e
	c.Site = n.signer.Site()
	if c.HLC == 0 {
		h, err := n.clock.Now()
		if err != nil {
			return nil, err
		}
		c.HLC = h
	} else if err := n.clock.Reserve(c.HLC); err != nil {
		return nil, err
	}
	return n.signer.Sign(&c, n.meshID)
}

// NextHLC issues a fresh HLC from the node's clock: above every HLC the
// node issued or observed, durable across restarts.
func (n *Node) NextHLC() (messages.HLC, error) { return n.clock.Now() }

// ApplySigned runs one signed event (COSE_Sign1 bytes as received) through
// the apply chokepoint and returns its outcome once it is durable. The
// error is reserved for infrastructure failures: a forged, malformed,
// out-of-scope or skewed event is an outcome, never an error.
func (n *Node) ApplySigned(ctx context.Context, raw []byte) (messages.Outcome, error) {
	if n.isClosed() {
		return messages.Outcome{}, ErrClosed
	}
	out, err := n.apply.Apply(ctx, raw)
	if err == nil {
		n.noteOwnEvents([]messages.Outcome{out}) // restore.go
	}
	return out, err
}

// ApplySignedBatch applies many signed events, verifying signatures in
// parallel; outcomes are in input order. One bad event never stops the
// events behind it.
func (n *Node) ApplySignedBatch(ctx context.Context, raws [][]byte) ([]messages.Outcome, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	return n.applyReceived(ctx, raws) // restore.go
}

func (n *Node) table(ctx context.Context, schema, table string) (def TableDef, err error) {
	err = n.store.View(ctx, func(tx persistence.SyncReader) error {
		_, def, err = requireTable(tx, schema, table)
		return err
	})
	return def, err
}

// requireTable looks a table up, failing with ErrUnknownTable.
func requireTable(tx persistence.SyncReader, schema, table string) (persistence.TableKey, TableDef, error) {
	t := persistence.TableKey{Schema: schema, Table: table}
	def, ok, err := tx.Table(t)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s.%s", ErrUnknownTable, schema, table)
	}
	return t, def, err
}

// Get reads one row. ok is false when the row has no state or is
// tombstoned.
func (n *Node) Get(ctx context.Context, schema, table string, key map[string]any) (Row, bool, error) {
	k, err := encodeKey(key)
	if err != nil {
		return Row{}, false, err
	}
	var row Row
	var found bool
	err = n.store.View(ctx, func(tx persistence.SyncReader) error {
		t, def, err := requireTable(tx, schema, table)
		if err != nil {
			return err
		}
		pr, ok, err := tx.Row(t, k.Encode())
		if err != nil || !ok {
			return err
		}
		row, found = viewRow(def, pr), pr.Exists
		return nil
	})
	return row, found, err
}

// ScanOptions tune Scan.
type ScanOptions struct {
	// After resumes after the row of this encoded key (Row.Key.Encode()),
	// in Scan's order.
	After []byte
	// IncludeDeleted also visits tombstoned rows.
	IncludeDeleted bool
}

// Scan visits a table's rows in the natural order of their keys (the
// order of Query by the key: key columns in the table's order, integers
// and floats numerically, text and bytes bytewise) until fn returns
// false, in one read transaction.
//
// Deprecated: use Rows, which returns an iter.Seq2 like every listing.
func (n *Node) Scan(ctx context.Context, schema, table string, opts ScanOptions, fn func(Row) bool) error {
	return n.store.View(ctx, func(tx persistence.SyncReader) error {
		t, def, err := requireTable(tx, schema, table)
		if err != nil {
			return err
		}
		return tx.Rows(t, opts.After, func(_ []byte, pr persistence.Row) (bool, error) {
			if !pr.Exists && !opts.IncludeDeleted {
				return true, ctx.Err()
			}
			return fn(viewRow(def, pr)), ctx.Err()
		})
	})
}

// Tables lists the defined tables.
func (n *Node) Tables(ctx context.Context) ([]TableDef, error) {
	var defs []TableDef
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		defs, err = tx.Tables()
		return err
	})
	return defs, err
}

// PeerKey is a trusted signer: a peer's key id, site id, Ed25519 public
// key, and optional retirement cutoff (0: none).
type PeerKey = sign.Key

// Trust adds or replaces a trusted signer in the keyring (persisted).
func (n *Node) Trust(ctx context.Context, k PeerKey) error {
	if len(k.PublicKey) != ed25519.PublicKeySize {
		return fmt.Errorf("runtime: trust: public key must be %d bytes", ed25519.PublicKeySize)
	}
	if len(k.Kid) == 0 {
		k.Kid = sign.KidFor(k.PublicKey)
	}
	if n.isClosed() {
		return ErrClosed
	}
	// ddl orders the keyring's in-memory copy with its stored one; the
	// store itself is written by the committer, like every sync write.
	n.ddl.Lock()
	defer n.ddl.Unlock()
	old, known := n.keyring.Load().Lookup(k.Kid)
	// A key verifies more than before when it is new, names another key
	// or site, or its cutoff is lifted or raised: events dropped under the
	// old entry may apply now, so every link repairs (reconcile.go).
	widened := !known || old.Site != k.Site || !bytes.Equal(old.PublicKey, k.PublicKey) ||
		(old.Cutoff != 0 && (k.Cutoff == 0 || k.Cutoff > old.Cutoff))
	next, err := n.keyring.Load().With(k)
	if err != nil {
		return err
	}
	if err := n.router.Write(ctx, func(tx persistence.SyncTx) error {
		return tx.PutKey(persistence.KeyEntry{Kid: k.Kid, Site: k.Site, PublicKey: k.PublicKey, Cutoff: k.Cutoff})
	}); err != nil {
		return err
	}
	n.keyring.Store(next)
	n.trusted(widened) // reconcile.go: forget drops; a widened key reconciles with every peer
	return nil
}

// Retire sets a signer's retirement cutoff: its events with an HLC above
// cutoff fail verification from now on.
func (n *Node) Retire(ctx context.Context, kid []byte, cutoff messages.HLC) error {
	k, ok := n.keyring.Load().Lookup(kid)
	if !ok {
		return fmt.Errorf("runtime: retire: %w", sign.ErrUnknownKid)
	}
	k.Cutoff = cutoff
	return n.Trust(ctx, k)
}

// TrustedKeys lists the keyring, sorted by kid.
func (n *Node) TrustedKeys() []PeerKey {
	keys := n.keyring.Load().Keys()
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare(keys[i].Kid, keys[j].Kid) < 0 })
	return keys
}

// Clock returns the node's last issued or observed HLC.
func (n *Node) Clock() messages.HLC { return n.clock.Last() }

// LogEntry is one event of the node's retained log.
type LogEntry struct {
	// Seq is the local log position: strictly increasing, never reused.
	Seq uint64
	ID  messages.EventID
	// Raw is the signed event exactly as received (or written locally).
	Raw    []byte
	Site   messages.SiteID
	HLC    messages.HLC
	Schema string
	Table  string
}

// Log returns up to limit retained events with Seq > after, in local log
// order: the node's own events and those it received, which is what a
// peer needs to catch up (a node offers every retained event, SSP/1 §14).
// limit ≤ 0 means 1 000.
//
// Deprecated: use LogEntries, which returns an iter.Seq2 like every
// listing.
func (n *Node) Log(ctx context.Context, after uint64, limit int) ([]LogEntry, error) {
	if limit <= 0 {
		limit = 1000
	}
	var out []LogEntry
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		return tx.EventsAfter(after, limit, func(se persistence.StoredEvent) (bool, error) {
			out = append(out, LogEntry{Seq: se.Seq, ID: se.ID, Raw: se.Raw, Site: se.Site, HLC: se.HLC, Schema: se.Schema, Table: se.Table})
			return true, ctx.Err()
		})
	})
	return out, err
}
