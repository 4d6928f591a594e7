package runtime

import (
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
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
