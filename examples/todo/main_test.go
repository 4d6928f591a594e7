package main

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/runtime"
)

// The todo app runs to the end: carol's live list equals the query on
// every node, the typed column refuses a text, the index query finds the
// done todos, and the live query reported entries and leaves.
func TestTodoRuns(t *testing.T) {
	res, err := run(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	wantOpen := []string{"pay rent", "fix bike", "buy oat milk"} // due 20, 30, 50
	if !slices.Equal(res.Live, wantOpen) {
		t.Fatalf("carol's live list %v, want %v", res.Live, wantOpen)
	}
	for name, open := range res.Open {
		if !slices.Equal(open, wantOpen) {
			t.Fatalf("%s: open todos %v, want %v", name, open, wantOpen)
		}
	}
	if want := []string{"water plants", "call mum"}; !slices.Equal(res.Done, want) { // due 10, 40
		t.Fatalf("done todos %v, want %v", res.Done, want)
	}
	if !errors.Is(res.TypeRefused, runtime.ErrTypeMismatch) {
		t.Fatalf("text into the bool column: %v, want ErrTypeMismatch", res.TypeRefused)
	}
	if res.Events[runtime.LiveEnter] != 5 || res.Events[runtime.LiveLeave] != 2 || res.Events[runtime.LiveUpdate] != 1 {
		t.Fatalf("live events %v: want 5 enters, 1 update, 2 leaves", res.Events)
	}
}
