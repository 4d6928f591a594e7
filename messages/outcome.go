package messages

import "fmt"

// OutcomeKind is the verdict of the apply chokepoint on one signed event
// (SSP/1 §12, §13.6).
type OutcomeKind uint8

// Outcome kinds. The numbers are part of the wire format of push results.
const (
	// Applied: the event passed every check and was materialized (or lay
	// below the table's eviction horizon, which counts as applied and writes
	// nothing).
	Applied OutcomeKind = 1
	// Duplicate: an event with the same id was applied before; a no-op.
	Duplicate OutcomeKind = 2
	// Dropped: the event will never apply; it is not retained and the
	// watermark advances past it.
	Dropped OutcomeKind = 3
	// Rejected: the event may apply later (clock skew); it is not retained
	// and the watermark does not advance past it.
	Rejected OutcomeKind = 4
	// Held: the destination table is missing; the group is held, the event
	// retained, and it is retried when the table is defined.
	Held OutcomeKind = 5
)

// String returns a readable form of the OutcomeKind.
func (k OutcomeKind) String() string {
	switch k {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Dropped:
		return "dropped"
	case Rejected:
		return "rejected"
	case Held:
		return "held"
	}
	return fmt.Sprintf("outcome(%d)", uint8(k))
}

// Reason says why an event was dropped or rejected.
type Reason uint8

// Reasons. The numbers are part of the wire format of push results.
const (
	ReasonNone Reason = 0
	// Signature verification failed: unknown kid, invalid signature,
	// malformed COSE, site not the signer's, or an HLC above the signer's
	// retirement cutoff (SSP/1 §12 step 1).
	ReasonSignature Reason = 1
	// The event is more than the skew bound in the receiver's future (§12 step 2).
	ReasonClockSkew Reason = 2
	// The event is outside the receiver's scope (§12 step 3).
	ReasonOutOfScope Reason = 3
	// The signed payload is not a valid event.
	ReasonMalformed Reason = 4
	// row_key is null or an empty map (§13.6).
	ReasonEmptyRowKey Reason = 5
	// row_key names a column the destination table does not have (§13.6).
	ReasonUnknownKeyColumn Reason = 6
	// row_key lacks one of the destination table's key columns: the key
	// does not resolve as a whole (§13.6: "either the whole key resolves or
	// the event does not apply").
	ReasonIncompleteKey Reason = 7
	// The destination table is missing and the signer's held quota is
	// full: rejected (not retained, re-offered), never dropped (§13.6).
	ReasonHeldQuota Reason = 8
)

// String returns a readable form of the Reason.
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonSignature:
		return "signature"
	case ReasonClockSkew:
		return "clock_skew"
	case ReasonOutOfScope:
		return "out_of_scope"
	case ReasonMalformed:
		return "malformed"
	case ReasonEmptyRowKey:
		return "empty_row_key"
	case ReasonUnknownKeyColumn:
		return "unknown_key_column"
	case ReasonIncompleteKey:
		return "incomplete_key"
	case ReasonHeldQuota:
		return "held_quota"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Outcome is the apply chokepoint's verdict on one signed event.
type Outcome struct {
	Kind   OutcomeKind `cbor:"1,keyasint"`
	Reason Reason      `cbor:"2,keyasint,omitempty"`
	ID     EventID     `cbor:"3,keyasint"`
	// Site, Schema, Table and HLC are set once the event was authenticated.
	Site   SiteID `cbor:"4,keyasint,omitempty"`
	Schema string `cbor:"5,keyasint,omitempty"`
	Table  string `cbor:"6,keyasint,omitempty"`
	HLC    HLC    `cbor:"7,keyasint,omitempty"`
	// BelowHorizon marks an Applied event that lay below the eviction
	// horizon and wrote nothing (SSP/1 §13.5).
	BelowHorizon bool `cbor:"8,keyasint,omitempty"`
	// Detail is a human-readable cause for dropped and rejected events.
	Detail string `cbor:"9,keyasint,omitempty"`
}

// String returns a readable form of the Outcome.
func (o Outcome) String() string {
	s := o.Kind.String()
	if o.Reason != ReasonNone {
		s += " (" + o.Reason.String() + ")"
	}
	if o.BelowHorizon {
		s += " (below horizon)"
	}
	return s
}

// AdvancesWatermark reports whether a receiver's applied watermark may move
// past this event (SSP/1 §13.6, the Watermark column).
func (o Outcome) AdvancesWatermark() bool {
	switch o.Kind {
	case Applied, Duplicate, Dropped:
		return true
	}
	return false
}
