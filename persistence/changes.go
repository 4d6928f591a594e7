package persistence

import "github.com/syncmesh/syncmesh/messages"

// ChangeCause says what made a row change.
type ChangeCause uint8

// Change causes. A change is recorded in the transaction that wrote the
// row, so the log never names a change that did not commit, and a
// committed change is never missing from it.
const (
	// CauseEvent: one event was materialized (a local write, a received
	// event, or a held event released by DefineTable). RowChange.Event is
	// that event's clock.
	CauseEvent ChangeCause = 1
	// CauseAddColumn: AddColumn rebuilt the new column from the retained
	// log (SSP/1 §13.6); no new event. RowChange.Event is zero.
	CauseAddColumn ChangeCause = 2
)

// String names the cause.
func (c ChangeCause) String() string {
	switch c {
	case CauseEvent:
		return "event"
	case CauseAddColumn:
		return "add_column"
	}
	return "unknown"
}

// RowChange is one entry of the change log: what one write of one row
// changed in its materialized state. A write changes a row when it changes
// its existence, existence clock, tombstone clock, or any cell's value or
// clock (a cell written, overwritten or cleared); a write that leaves the
// stored row as it was (a duplicate, a losing LWW write, a delete older
// than everything) is not a change and is not logged.
type RowChange struct {
	// Seq is the change sequence, assigned by AppendChange: strictly
	// increasing across the store's tables, never reused.
	Seq    uint64
	Schema string
	Table  string
	Key    messages.Columns
	// The row's state after the change.
	Exists    bool
	Existence messages.Clock
	Tomb      messages.Clock
	// Cells holds the value columns whose value or clock changed, with
	// their new state.
	Cells map[string]Cell
	// Cleared lists the value columns whose cell went away (a delete
	// cleared them: they read as null at the Tomb clock), sorted.
	Cleared []string
	Cause   ChangeCause
	// Event is the clock (HLC, site, id) of the event that caused the
	// change when Cause is CauseEvent; zero otherwise.
	Event messages.Clock
}

// ChangeReader reads the change log.
type ChangeReader interface {
	// ChangesAfter calls fn for the retained changes of table t with
	// Seq > after, in Seq order, until fn returns false or limit changes
	// were visited (limit ≤ 0: no limit).
	ChangesAfter(t TableKey, after uint64, limit int, fn func(RowChange) (bool, error)) error
	// ChangeTablesAfter calls fn with the table and sequence of each
	// retained change with Seq > after, in Seq order, until fn returns
	// false, without decoding the changes (a writer finds which tables
	// its transaction changed, to wake only their watchers).
	ChangeTablesAfter(after uint64, fn func(t TableKey, seq uint64) bool) error
	// ChangeBounds returns the oldest retained change sequence (0 when
	// none is retained) and the highest ever assigned (0 when none).
	ChangeBounds() (oldest, last uint64, err error)
}

// ChangeWriter appends to and trims the change log.
type ChangeWriter interface {
	// AppendChange adds a change, assigning c.Seq (returned).
	AppendChange(c RowChange) (seq uint64, err error)
	// TrimChanges deletes the changes whose sequences are not among the
	// newest keep sequence numbers (last-keep+1 … last) and returns how
	// many it deleted; trimmed, when not nil, is called with the table and
	// sequence of each deleted change, oldest first. The highest assigned
	// sequence is kept, so a sequence is never reused. keep counts
	// numbers, not changes: a caller that raised the sequence
	// (RaiseChangeSeq) widens it by the numbers skipped.
	TrimChanges(keep uint64, trimmed func(t TableKey, seq uint64)) (int, error)
	// RaiseChangeSeq makes the next assigned change sequence greater than
	// floor (nothing when the last assigned is at or above it already).
	// The sequences skipped are never assigned. A node whose store was
	// restored from a copy raises it past every sequence it assigned
	// before, which a mark kept outside the store records.
	RaiseChangeSeq(floor uint64) error
}
