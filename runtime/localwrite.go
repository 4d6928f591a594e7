package runtime

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// Errors of local writes that could not apply (match with errors.Is).
var (
	// ErrNotApplied: a local Upsert or Delete went through the apply
	// chokepoint and was not applied (its outcome is in the
	// *NotAppliedError). The chokepoint dropped the event as SSP/1 §12
	// says; only the local API turns that into an error.
	ErrNotApplied = errors.New("runtime: local write not applied")
	// ErrOutOfScope: the write's table is outside Config.Scope, so the
	// node drops its own event (SSP/1 §12 step 3). Matches ErrNotApplied
	// too.
	ErrOutOfScope = errors.New("runtime: table outside the node's scope")
)

// NotAppliedError is the error of a local write whose event the
// chokepoint did not apply, with the outcome it got. It matches
// ErrNotApplied and, for a scope drop, ErrOutOfScope.
type NotAppliedError struct {
	Schema, Table string
	Outcome       messages.Outcome
}

// Error implements the error interface.
func (e *NotAppliedError) Error() string {
	return fmt.Sprintf("runtime: local write to %s.%s not applied: %s", e.Schema, e.Table, e.Outcome)
}

// Is matches ErrNotApplied, and ErrOutOfScope for a scope drop.
func (e *NotAppliedError) Is(target error) bool {
	return target == ErrNotApplied || target == ErrOutOfScope && e.Outcome.Reason == messages.ReasonOutOfScope
}

// localOutcome turns the chokepoint's verdict on a local write into the
// error the caller sees: nil only when the event applied.
func localOutcome(schema, table string, out messages.Outcome, err error) error {
	if err != nil || out.Kind == messages.Applied {
		return err
	}
	return &NotAppliedError{Schema: schema, Table: table, Outcome: out}
}
