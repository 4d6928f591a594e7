package runtime

import (
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// A local write the chokepoint drops (its table outside Config.Scope)
// is an error matching ErrNotApplied and ErrOutOfScope, not a nil error.
func TestLocalWriteOutOfScopeIsAnError(t *testing.T) {
	n := openTestNode(t, Config{Scope: []string{"app/*"}})
	n.define(TableDef{Schema: "other", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}})
	out, err := n.Upsert(n.ctx, "other", "t", map[string]any{"id": 1}, map[string]any{"a": 1})
	var na *NotAppliedError
	if !errors.Is(err, ErrNotApplied) || !errors.Is(err, ErrOutOfScope) || !errors.As(err, &na) {
		t.Fatalf("out-of-scope Upsert: outcome %v, err %v", out, err)
	}
	if na.Outcome.Kind != messages.Dropped || na.Outcome.Reason != messages.ReasonOutOfScope || out != na.Outcome {
		t.Fatalf("error carries %v, returned %v", na.Outcome, out)
	}
	if _, err := n.Delete(n.ctx, "other", "t", map[string]any{"id": 1}); !errors.Is(err, ErrOutOfScope) {
		t.Fatalf("out-of-scope Delete: %v", err)
	}
	// An in-scope write still succeeds with a nil error.
	n.define(defT)
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": 1}); err != nil {
		t.Fatalf("in-scope Upsert: %v", err)
	}
}
