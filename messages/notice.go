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

func (Resurrection) notice()   {}
func (PartialRebuild) notice() {}
func (EventDropped) notice()   {}
func (EventRejected) notice()  {}
func (GroupHeld) notice()      {}
func (GroupReleased) notice()  {}
func (ColumnsIgnored) notice() {}
