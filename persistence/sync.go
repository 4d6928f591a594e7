package persistence

import (
	"context"

	"github.com/syncmesh/syncmesh/messages"
)

// EventID is the BLAKE3-256 of a signed event's bytes as received.
type EventID = messages.EventID

// GroupKey names a sync group: SSP/1 materializes events grouped per
// (site_id, schema, table).
type GroupKey struct {
	Site   messages.SiteID
	Schema string
	Table  string
}

// TableKey names a table.
type TableKey struct {
	Schema string
	Table  string
}

// TableDef is a destination table: its key columns and its value columns.
type TableDef struct {
	Schema     string
	Table      string
	KeyColumns []string
	Columns    []string
	// Types declares column types, key and value columns alike, by name;
	// a column absent from it is messages.TypeAny (and so is every column
	// of a definition stored before types existed). Local writes are
	// checked against it; received values are kept whatever their type.
	Types map[string]messages.ColumnType
	// Indexes are the table's secondary indexes, each over one or more of
	// its columns (key or value), maintained with the rows in the same
	// transaction (index.go).
	Indexes []IndexDef
}

// TypeOf returns column's declared type (TypeAny when none, or one this
// build does not know).
func (d TableDef) TypeOf(column string) messages.ColumnType {
	t := d.Types[column]
	if !t.Known() {
		return messages.TypeAny
	}
	return t
}

// StoredEvent is one entry of the retained event log.
type StoredEvent struct {
	ID  EventID
	Seq uint64 // local log sequence, assigned by AppendEvent; strictly increasing, never reused
	Raw []byte // the signed event (COSE_Sign1) exactly as received; sealed at rest
	// Index fields, kept in plaintext so lookups need not open Raw.
	Site   messages.SiteID
	HLC    messages.HLC
	Schema string
	Table  string
	RowKey []byte // the encoded row key (messages.Columns.Encode)
	// Prepared, when set by the store's PrepareEvents, is work AppendEvent
	// uses instead of redoing it; it is never stored or read back.
	Prepared *PreparedEvent
}

// Cell is one materialized column: its value (possibly the CBOR null) and
// the clock of the write that set it. A column absent from Row.Cells was
// never materialized, which is not the same as null (SSP/1 §13.6).
type Cell struct {
	Value messages.Value
	Clock messages.Clock
}

// Row is the materialized state of one row.
type Row struct {
	Schema string
	Table  string
	Key    messages.Columns // the row key columns
	// Exists is the outcome of the highest existence event (SSP/1 §13.2).
	Exists bool
	// Existence is the clock of that event; zero when none was applied.
	Existence messages.Clock
	// Tomb is the highest delete ever applied to the row (SSP/1 §13.3).
	Tomb messages.Clock
	// Cells holds the materialized value columns.
	Cells map[string]Cell
}

// SyncReader is the read side of a sync transaction.
type SyncReader interface {
	// Table returns a table definition; ok is false when it is not defined.
	Table(t TableKey) (def TableDef, ok bool, err error)
	// Tables lists every defined table.
	Tables() ([]TableDef, error)

	// Event looks up a retained event by id. site and h are the event's
	// own (from its signed payload, known once its signature is verified):
	// the id index is keyed by (site, HLC, id), so a site's events, which
	// arrive roughly in HLC order, are inserted next to each other instead
	// of at random places of a large index. An id stored with another site
	// or HLC is not found.
	Event(site messages.SiteID, h messages.HLC, id EventID) (ev StoredEvent, ok bool, err error)
	// EventIDsAt returns the ids of the retained events site signed with
	// HLC h, ascending, at most limit of them (limit ≤ 0: all). An honest
	// site has at most one: more are an equivocation (SSP/1 §13.5 forbids
	// HLC reuse). The apply path asks for two, so a site that
	// signs many events with one HLC cannot make each arrival cost more.
	EventIDsAt(site messages.SiteID, h messages.HLC, limit int) ([]EventID, error)
	// SiteEventIDs calls fn, in (HLC, id) order, for the retained events
	// site signed with an HLC in [from, to], until fn returns false or an
	// error. It reads only the (site, HLC, id) index: a joiner answers a
	// sender's probe with it (what it already holds of a range).
	SiteEventIDs(site messages.SiteID, from, to messages.HLC, fn func(h messages.HLC, id EventID) (bool, error)) error
	// EventsAfter calls fn for retained events with Seq > after, in Seq
	// order, until fn returns false or limit events were visited (limit ≤ 0: no limit).
	EventsAfter(after uint64, limit int, fn func(StoredEvent) (bool, error)) error
	// RowEvents calls fn for every retained event of one row, in no
	// particular order.
	RowEvents(t TableKey, rowKey []byte, fn func(StoredEvent) (bool, error)) error
	// TableEvents calls fn for every retained event of one table.
	TableEvents(t TableKey, fn func(StoredEvent) (bool, error)) error
	// LastSeq returns the highest sequence ever assigned (0 if none).
	LastSeq() (uint64, error)

	// Row returns a materialized row; ok is false when the row has no state.
	Row(t TableKey, rowKey []byte) (row Row, ok bool, err error)
	// Rows calls fn for the table's rows in the natural order of their
	// keys (RowStorageKey: key columns in the table's order, each value
	// by persistence/ordkey), starting after the row whose encoded key is
	// after (nil: from the start), until fn returns false. rowKey is the
	// row's encoded key (messages.Columns.Encode).
	Rows(t TableKey, after []byte, fn func(rowKey []byte, row Row) (bool, error)) error
	// IndexRange calls fn, in order, for the entries of the table's index
	// called index from the first at or after from (nil: the first), with
	// their rows, until fn returns false. An index entry is IndexEntry's
	// (existing rows only); index "" is the rows themselves, every row,
	// each entry its RowStorageKey. An index the table does not declare
	// is ErrNotFound.
	IndexRange(t TableKey, index string, from []byte, fn func(entry []byte, row Row) (bool, error)) error

	// Horizon returns a table's eviction horizon (0 when none was set).
	Horizon(t TableKey) (messages.HLC, error)

	// HeldGroups lists the groups held for a missing table.
	HeldGroups() ([]GroupKey, error)
	// HeldEvents returns the log sequences held in a group, ascending.
	HeldEvents(g GroupKey) ([]uint64, error)

	// Meta returns a node-level value (identity, mesh id, clock high-water…).
	Meta(key string) (value []byte, ok bool, err error)
	// SealedMeta returns a node-level secret stored sealed as record type t.
	SealedMeta(t RecordType, key string) (value []byte, ok bool, err error)

	// Keys returns the trusted-peer keyring entries.
	Keys() ([]KeyEntry, error)

	SyncDeliveryReader
	EventRangeReader
	ChangeReader
}

// SyncTx is a read-write sync transaction.
type SyncTx interface {
	SyncReader
	// PutTable stores or replaces a table definition.
	PutTable(def TableDef) error
	// AppendEvent adds an event to the log, assigning ev.Seq (the assigned
	// value is returned). An id already present returns ErrDuplicate and
	// changes nothing. An id determines its site and HLC (it hashes the
	// signed bytes that hold them); the store relies on it (see Event).
	AppendEvent(ev StoredEvent) (seq uint64, err error)
	// DeleteEventsBelow removes the table's retained events whose HLC is
	// strictly below h (reclamation below an eviction horizon) and returns
	// how many it removed.
	DeleteEventsBelow(t TableKey, h messages.HLC) (int, error)
	// PutRow stores a row's state (replacing the previous one) and moves
	// its entries in the table's indexes (IndexEntry) in the same
	// transaction.
	PutRow(row Row) error
	// IndexRow puts row's entry in the table's index called index (an
	// index built from the rows after it was declared); a tombstoned row
	// has none. Putting it again changes nothing.
	IndexRow(t TableKey, index string, row Row) error
	// SetHorizon stores a table's eviction horizon.
	SetHorizon(t TableKey, h messages.HLC) error
	// HoldEvent records that the event at seq waits in group g for its table.
	HoldEvent(g GroupKey, seq uint64) error
	// ReleaseGroup forgets every held entry of g.
	ReleaseGroup(g GroupKey) error
	// PutMeta stores a node-level value.
	PutMeta(key string, value []byte) error
	// PutSealedMeta stores a node-level secret sealed as record type t.
	PutSealedMeta(t RecordType, key string, value []byte) error
	// PutKey stores or replaces a keyring entry (keyed by Kid).
	PutKey(k KeyEntry) error

	SyncDeliveryWriter
	ChangeWriter
}

// KeyEntry is one trusted signer: kid → site id, Ed25519 public key and an
// optional retirement cutoff (events with an HLC above it fail verification).
type KeyEntry struct {
	Kid       []byte
	Site      messages.SiteID
	PublicKey []byte
	Cutoff    messages.HLC // 0: not retired
}

// SyncStore is the sync plane's storage.
type SyncStore interface {
	// Update runs fn in one read-write transaction. When Update returns
	// nil every write of fn is durable; when fn returns an error nothing it
	// wrote is kept.
	Update(ctx context.Context, fn func(tx SyncTx) error) error
	// View runs fn in a read-only transaction over a consistent snapshot.
	View(ctx context.Context, fn func(tx SyncReader) error) error
	// Close releases the store. Calls after Close return ErrClosed.
	Close() error
	// PrepareEvents does the pure storage work of evs ahead of the
	// transaction that appends them, on the caller's goroutine, and records
	// it in each event's Prepared (persistence.PrepareEvents does it for a
	// store that seals with a Sealer, or none, and PreparedSums is its
	// transaction side). It reads no state and may run concurrently with
	// anything; it never fails (AppendEvent redoes what was not prepared).
	PrepareEvents(evs []*StoredEvent)
}
