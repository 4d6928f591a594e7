package runtime

import (
	"context"
	"testing"
)

// TestStoreCommitsCountsWrites: a bbolt node's counters move with its
// write transactions (a DefineTable is one sync-plane commit, a read is
// none); an in-memory node reports zero.
func TestStoreCommitsCountsWrites(t *testing.T) {
	ctx := context.Background()
	n, err := Open(ctx, Config{Dir: t.TempDir(), MeshID: []byte("m"), NoSync: true, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	before := n.StoreCommits()
	if err := n.DefineTable(ctx, TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	mid := n.StoreCommits()
	if mid.Sync <= before.Sync || mid.Delivery != before.Delivery {
		t.Fatalf("after DefineTable: %+v, before %+v", mid, before)
	}
	if _, err := n.LastSeq(ctx); err != nil {
		t.Fatal(err)
	}
	if after := n.StoreCommits(); after != mid {
		t.Fatalf("a read committed: %+v, before %+v", after, mid)
	}
	m, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if c, w := m.StoreCommits(), m.DeliveryStoreWrites(); c != (StoreCommits{}) || w != (StoreWrites{}) {
		t.Fatalf("in-memory node: %+v, %+v", c, w)
	}
}
