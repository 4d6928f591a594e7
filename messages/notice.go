package messages

// Notice is something the sync plane surfaces to the application: a
// resurrection, a partial rebuild, a dropped, rejected or held event, or
// ignored payload columns. Subscribers receive notices after the
// transaction that caused them is durable.
type Notice interface{ notice() }

// Resurrection: an upsert brought a tombstoned row back (SSP/1 §13.2).
type Resurrection struct {
	Schema, Table string
	Key           Columns
	By            Clock // the resurrecting upsert
	Tomb          Clock // the tombstone clock it beat
	EventID       EventID
}

// PartialRebuild: a resurrection rebuild could not be complete because the
// row's tombstone clock lies below the table's eviction horizon; columns
// whose only evidence lay between the two came back null (SSP/1 §13.4).
type PartialRebuild struct {
	Schema, Table string
	Key           Columns
	Tomb          Clock
	Horizon       HLC
	EventID       EventID
}

// RebuildCompleted: a row whose resurrection rebuild was bounded by an
// eviction horizon (see PartialRebuild) now holds the table's history
// from its tombstone clock up, taken back from a peer by rehydration
// (SSP/1 §13.5): its state is the complete rebuild.
type RebuildCompleted struct {
	Schema, Table string
	Key           Columns
	Tomb          Clock
	Horizon       HLC // the horizon the rebuild had been bounded by
}

// EventDropped: an event was dropped (it will not be retained).
type EventDropped struct{ Outcome Outcome }

// EventRejected: an event was rejected (clock skew); not retained, the
// sender re-offers it.
type EventRejected struct{ Outcome Outcome }

// GroupHeld: events for a missing table were held (SSP/1 §13.6).
type GroupHeld struct {
	Site          SiteID
	Schema, Table string
	EventID       EventID
}

// GroupReleased: a held group was materialized after its table was defined.
type GroupReleased struct {
	Site          SiteID
	Schema, Table string
	Events        int
}

// ColumnsIgnored: an upsert named payload columns the destination table
// does not have; the known columns were applied (SSP/1 §13.6).
type ColumnsIgnored struct {
	Schema, Table string
	EventID       EventID
	Columns       []string
}

// TypeMismatch: an upsert (or its key) carried values whose CBOR kind is
// not the type the receiving node declares for those columns. The values
// are signed and other nodes may declare other types, so they are kept
// and materialized as received (every node converges on the same bytes,
// SSP/1 §13.1); a reader of such a cell gets a typed decode error
// (ErrTypeMismatch), never a zero.
type TypeMismatch struct {
	Schema, Table string
	EventID       EventID
	// Columns are the mismatched columns, in name order.
	Columns []string
}

// Equivocation: two distinct events signed by one site carry one HLC
// (SSP/1 §13.5 forbids HLC reuse; a hostile site, or one restored from a
// stale backup, does it anyway). Both are applied and the conflict is
// resolved by event id, so every node holding both agrees; the notice is
// raised by the second of the pair to arrive. Attribution is by signature:
// Site signed both.
type Equivocation struct {
	Site          SiteID
	HLC           HLC
	Schema, Table string // of the arriving event
	// Retained is an event already in the log with the same (Site, HLC)
	// (the lowest id when there are several); Arrived is the new one.
	Retained, Arrived EventID
}

// RetiredKeyEvent: an event signed by a retired key arrived for the first
// time after the key's retirement. It is valid — its HLC is at or below
// the cutoff (SSP/1 §12) — and applied like any other, but whoever holds a
// stolen retired key can backdate writes this way, so it is never silent.
type RetiredKeyEvent struct {
	Site          SiteID
	Kid           []byte
	Cutoff        HLC // the key's retirement cutoff when the event arrived
	HLC           HLC
	Schema, Table string
	EventID       EventID
	Outcome       OutcomeKind // what the chokepoint did with it
}

// NoticesMissed: a subscriber fell behind by more notices than its queue
// holds, and Count notices that would have come here were not delivered
// to it. It takes their place in the order: everything before it was
// delivered, and what follows came after the missed ones. A hostile peer
// can cause one notice per event it sends; bounding each subscriber's
// queue keeps a slow callback from holding them all in memory.
type NoticesMissed struct{ Count uint64 }

func (NoticesMissed) notice()    {}
func (Resurrection) notice()     {}
func (Equivocation) notice()     {}
func (RetiredKeyEvent) notice()  {}
func (PartialRebuild) notice()   {}
func (RebuildCompleted) notice() {}
func (EventDropped) notice()     {}
func (EventRejected) notice()    {}
func (GroupHeld) notice()        {}
func (GroupReleased) notice()    {}
func (ColumnsIgnored) notice()   {}
func (TypeMismatch) notice()     {}
