package replicate

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Regression (examples/mesh -join soak, 2 runs of 8 stuck for good): Begin
// held its lock while the clock issued, and issuing may write the clock's
// high water to the store, waiting for the store's writer; the push
// committer, holding the writer, asked Safe for the own watermarks of the
// push's result and waited for that lock: a deadlock. Safe must answer
// while an issue is in progress, with a value the issued HLC cannot be
// at or below.
func TestSafeAnswersDuringAnIssue(t *testing.T) {
	g := persistence.GroupKey{Schema: "app", Table: "t"}
	o := NewOwnWrites(10)
	if _, err := o.Begin(g, func() (messages.HLC, error) { return 15, nil }); err != nil {
		t.Fatal(err)
	}
	o.End(g, 15, true)
	type answer struct {
		h  messages.HLC
		ok bool
	}
	got := make(chan answer, 1)
	h, err := o.Begin(g, func() (messages.HLC, error) {
		go func() { h, ok := o.Safe(g); got <- answer{h, ok} }()
		select {
		case a := <-got:
			if !a.ok || a.h != 15 {
				t.Errorf("Safe during an issue: %v %v, want 15 (nothing issued above it is durable)", a.h, a.ok)
			}
		case <-time.After(20 * time.Second): // a deadlock detector, not a timing assertion
			t.Error("Safe waited for the issue in progress")
		}
		return 20, nil
	})
	if err != nil || h != 20 {
		t.Fatal(h, err)
	}
	if h, ok := o.Safe(g); !ok || h != 19 {
		t.Fatalf("Safe with 20 in flight: %v %v, want 19", h, ok)
	}
	o.End(g, 20, true)
	if h, ok := o.Safe(g); !ok || h != 20 {
		t.Fatalf("Safe after 20 is durable: %v %v", h, ok)
	}
}
