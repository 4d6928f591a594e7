//go:build invariants

package clock

import (
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
)

// The HLC invariant fires when the clock's state is lowered behind its
// back (the injected fault: its last value set below what it issued, as a
// lost write or a bad merge would), and stays silent on the honest path.
func TestInvariantClockNeverReissues(t *testing.T) {
	var got []invariants.Violation
	defer invariants.SetHandler(func(v invariants.Violation) { got = append(got, v) })()
	w := &fakeWall{t: time.UnixMilli(1_000_000)}
	s := &store{}
	c := New(w.now, 0, s.persist, time.Second)
	first, err := c.Now()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Now(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("honest ticks reported %v", got)
	}
	c.mu.Lock()
	c.last = first - 1 // the injected fault
	c.mu.Unlock()
	again, err := c.Now()
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Fatalf("the lowered clock issued %d, want the re-issued %d", again, first)
	}
	if len(got) != 1 || !strings.Contains(got[0].Msg, "issued before") {
		t.Fatalf("violations = %v, want one re-issue", got)
	}
}

// A clock resumed from a persisted mark counts every value up to the mark
// as issued: the restart's honest path (wall clock behind the mark) stays
// silent and issues above it.
func TestInvariantResumedClockIssuesAboveItsMark(t *testing.T) {
	var got []invariants.Violation
	defer invariants.SetHandler(func(v invariants.Violation) { got = append(got, v) })()
	w := &fakeWall{t: time.UnixMilli(1_000)}
	s := &store{}
	mark := New(w.now, 0, s.persist, time.Second)
	h, err := mark.Now()
	if err != nil {
		t.Fatal(err)
	}
	hw := s.hw
	c := New(w.now, hw, s.persist, time.Second) // the restart, wall behind the mark
	next, err := c.Now()
	if err != nil || next <= hw || next <= h {
		t.Fatalf("resumed clock issued %d (%v), mark %d, previous run %d", next, err, hw, h)
	}
	if len(got) != 0 {
		t.Fatalf("violations = %v", got)
	}
}
