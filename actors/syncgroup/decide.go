package syncgroup

import (
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Action is the storage work a Decision asks of the shell.
type Action uint8

// Actions.
const (
	// Nothing: no write (a duplicate, a dropped event, an event below the
	// horizon).
	Nothing Action = iota
	// Hold: append the event to the log and hold it in its group (§13.6).
	Hold
	// Materialize: append the event to the log (unless it is a released
	// held event, which is there already) and run the materializer on its
	// row.
	Materialize
)

// Input is everything Decide needs about one authenticated, in-scope
// event, read by the shell from the transaction before deciding.
type Input struct {
	ID    messages.EventID
	Event *messages.Event
	// Released marks a held event being materialized now that its table
	// exists: it is in the log already, and was surfaced when held.
	Released bool
	// Known: an event with this id is already in the log (§12 step 4);
	// StillHeld: and it is still held for its table. Ignored when Released.
	Known, StillHeld bool
	// Defined, Def and Horizon describe the destination table.
	Defined bool
	Def     persistence.TableDef
	Horizon messages.HLC
	// Stamped lists the retained events with the event's (site, HLC)
	// (persistence.SyncReader.EventIDsAt); read only for a new event.
	Stamped []messages.EventID
	// Kid and Cutoff name the signer's key when it was retired at
	// verification (Cutoff ≠ 0).
	Kid    []byte
	Cutoff messages.HLC
	// OverHeldQuota, read only for a new event of an undefined table, says
	// why holding it would pass its signer's held quota (held.go); empty:
	// within the quota.
	OverHeldQuota string
}

// Decision is Decide's verdict: the outcome, the storage action, and the
// notices that follow from the input alone (the materializer's own —
// resurrections, partial rebuilds, ignored columns — come from running it).
type Decision struct {
	Outcome messages.Outcome
	Action  Action
	// Append: the action appends the event to the log first (a new event
	// held or materialized; a released held event is in the log already).
	Append  bool
	Notices []messages.Notice
}

// Decide is the chokepoint's decision from step 4 on (SSP/1 §12, §13.5,
// §13.6) for one event, shared by the apply path and the release of a held
// group: idempotent insert, hold for a missing table, whole-key
// resolution, the eviction horizon; and the two surfacings of a hostile signer — a
// reused (site, HLC) and a new event of a retired key. It is a pure
// function of in.
func Decide(in Input) Decision {
	e := in.Event
	d := Decision{Outcome: messages.Outcome{ID: in.ID, Site: e.Site, Schema: e.Schema, Table: e.Table, HLC: e.HLC}}
	if !in.Released && in.Known {
		d.Outcome.Kind = messages.Duplicate
		if in.StillHeld {
			d.Outcome.Kind = messages.Held // still waiting for its table: the watermark must not pass it
		}
		return d
	}
	var reason messages.Reason
	var detail string
	if in.Defined {
		reason, detail = resolveKey(in.Def, e)
	}
	retains := false
	switch {
	case !in.Defined && in.OverHeldQuota != "" && !in.Released:
		// Past the signer's held quota the event is rejected in §13.6's
		// sense: nothing retained, watermark not advanced, re-offered.
		d.Outcome.Kind, d.Outcome.Reason, d.Outcome.Detail = messages.Rejected, messages.ReasonHeldQuota, in.OverHeldQuota
		d.Notices = append(d.Notices, messages.EventRejected{Outcome: d.Outcome})
		return d
	case !in.Defined:
		// §13.6: destination table missing → hold the group, retry later.
		d.Outcome.Kind, d.Action, retains = messages.Held, Hold, true
	case reason != messages.ReasonNone:
		// §13.6: the key does not resolve as a whole → dropped.
		d.Outcome.Kind, d.Outcome.Reason, d.Outcome.Detail = messages.Dropped, reason, detail
		d.Notices = append(d.Notices, messages.EventDropped{Outcome: d.Outcome})
	case e.HLC < in.Horizon:
		// §13.5: below the horizon counts as applied and writes nothing.
		d.Outcome.Kind, d.Outcome.BelowHorizon = messages.Applied, true
	default:
		d.Outcome.Kind, d.Action, retains = messages.Applied, Materialize, true
	}
	if in.Released {
		return d
	}
	d.Append = retains
	if retains {
		// A site reused an HLC (SSP/1 §13.5 forbids it): both events stay
		// and the materializer orders them by id; the later one says so.
		if i := slices.IndexFunc(in.Stamped, func(id messages.EventID) bool { return id != in.ID }); i >= 0 {
			d.Notices = append(d.Notices, messages.Equivocation{Site: e.Site, HLC: e.HLC, Schema: e.Schema, Table: e.Table,
				Retained: in.Stamped[i], Arrived: in.ID})
		}
	}
	if d.Action == Hold {
		d.Notices = append(d.Notices, messages.GroupHeld{Site: e.Site, Schema: e.Schema, Table: e.Table, EventID: in.ID})
	}
	if in.Cutoff != 0 {
		// §12 accepts it (HLC ≤ cutoff), and refusing it by arrival time
		// would let two nodes with the same events disagree (§13.5): it is
		// applied, and never silently.
		d.Notices = append(d.Notices, messages.RetiredKeyEvent{Site: e.Site, Kid: slices.Clone(in.Kid), Cutoff: in.Cutoff, HLC: e.HLC,
			Schema: e.Schema, Table: e.Table, EventID: in.ID, Outcome: d.Outcome.Kind})
	}
	return d
}
