package main

import (
	"context"
	"testing"
)

// The README's main job must keep working: it fails on divergence, a
// missing resurrection notice, an unexpected outcome, or a message not
// delivered, committed and acknowledged.
func TestQuickstartRuns(t *testing.T) {
	if err := run(context.Background(), t.TempDir()); err != nil {
		t.Fatal(err)
	}
}
