package main

import (
	"context"
	"testing"

	"github.com/syncmesh/syncmesh/runtime"
)

// The README's main job must keep working: it fails on divergence, a
// missing resurrection notice, an unexpected outcome, or a message not
// delivered, committed and acknowledged.
func TestQuickstartRuns(t *testing.T) {
	if err := run(context.Background(), t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// Regression: the start-up of a node whose table has grown since (an
// AddColumn by a newer release, then a rollback to this build, or a plain
// restart) must not fail on the schema.
func TestStartTablesAfterAddColumn(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func() *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: []byte("quickstart-mesh"), Name: "alice", SyncInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	if err := startTables(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := n.AddColumn(ctx, "app", "todos", "priority"); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = open()
	defer n.Close()
	if err := startTables(ctx, n); err != nil {
		t.Fatalf("restart with the older definition: %v", err)
	}
}
