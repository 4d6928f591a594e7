package main

import (
	"context"
	"testing"
)

// The README's main job must keep working: it fails on divergence, a
// missing resurrection notice or an unexpected outcome.
func TestQuickstartRuns(t *testing.T) {
	if err := run(context.Background(), t.TempDir()); err != nil {
		t.Fatal(err)
	}
}
