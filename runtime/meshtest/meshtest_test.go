package meshtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtest"
)

var todos = runtime.TableDef{Schema: "app", Table: "todos", KeyColumns: []string{"id"}, Columns: []string{"title", "done"}}

func TestPartitionCrashHealConverges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := meshtest.New(t, meshtest.Options{Nodes: 3, Tables: []runtime.TableDef{todos}, Faults: runtime.Faults{Drop: 0.2, Duplicate: 0.2}})
	m.Partition([]string{"n0"}, []string{"n1", "n2"})
	for i, n := range m.Nodes() {
		if _, err := n.Upsert(ctx, "app", "todos", map[string]any{"id": 1}, map[string]any{"title": n.Name, "done": i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.SyncRound(ctx); err != nil {
		t.Fatal(err)
	}
	s0, _ := m.State(ctx, 0)
	s1, _ := m.State(ctx, 1)
	if s0 == s1 {
		t.Fatal("the partition did not separate n0")
	}
	if err := m.Restart(1); err != nil {
		t.Fatal(err)
	}
	m.Heal()
	m.SetFaults(runtime.Faults{})
	if err := m.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	row, ok, err := m.Node(2).Get(ctx, "app", "todos", map[string]any{"id": 1})
	if err != nil || !ok || !row.Exists {
		t.Fatalf("row: %+v %v %v", row, ok, err)
	}
}

func TestDevicesExchangeAndCommitAcrossTheMesh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := meshtest.New(t, meshtest.Options{Nodes: 2, Devices: true})
	a, b := m.Node(0), m.Node(1)
	if _, err := a.Send(ctx, b.Address, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	var msg runtime.ReceivedMessage
	select {
	case msg = <-b.Messages():
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	// A restart before the commit redelivers the message.
	if err := m.Restart(1); err != nil {
		t.Fatal(err)
	}
	b = m.Node(1)
	select {
	case again := <-b.Messages():
		if again.ID != msg.ID {
			t.Fatalf("redelivered %v, want %v", again.ID, msg.ID)
		}
	case <-ctx.Done():
		t.Fatal("not redelivered after the restart")
	}
	if res, err := b.CommitMessage(ctx, msg); err != nil || res.Status != runtime.Committed {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if err := m.Network().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	pending := 0
	for _, err := range a.PendingSent(ctx, 0, nil) {
		if err != nil {
			t.Fatal(err)
		}
		pending++
	}
	if pending != 0 {
		t.Fatal("the ACK did not clear the sender's pending message")
	}
}
