package memory_test

import (
	"context"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

func openMemory(t *testing.T) (persistence.SyncStore, func() persistence.SyncStore) {
	s := memory.New()
	cur := s
	t.Cleanup(func() { _ = cur.Close() })
	return s, func() persistence.SyncStore {
		_ = cur.Close()
		cur = cur.Reopen()
		return cur
	}
}

func TestContract(t *testing.T) { storetest.RunSyncStore(t, openMemory) }

// TestManySmallUpdates checks that the copy-on-write image keeps per-Update
// cost independent of the store's size closely enough for property tests
// with thousands of events (correctness only; see BenchmarkAppend for cost).
func TestManySmallUpdates(t *testing.T) {
	s := memory.New()
	ctx := context.Background()
	const n = 5000
	for i := 1; i <= n; i++ {
		err := s.Update(ctx, func(tx persistence.SyncTx) error {
			var id persistence.EventID
			id[0], id[1], id[2] = byte(i>>16), byte(i>>8), byte(i)
			_, err := tx.AppendEvent(persistence.StoredEvent{ID: id, Schema: "s", Table: "t", RowKey: []byte{byte(i % 10)}, HLC: messages.HLC(i)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err := s.View(ctx, func(r persistence.SyncReader) error {
		seen := 0
		if err := r.RowEvents(persistence.TableKey{Schema: "s", Table: "t"}, []byte{3}, func(persistence.StoredEvent) (bool, error) {
			seen++
			return true, nil
		}); err != nil {
			return err
		}
		if seen != n/10 {
			t.Fatalf("RowEvents visited %d, want %d", seen, n/10)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func BenchmarkAppend(b *testing.B) {
	s := memory.New()
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		_ = s.Update(ctx, func(tx persistence.SyncTx) error {
			var id persistence.EventID
			id[0], id[1], id[2], id[3] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
			_, err := tx.AppendEvent(persistence.StoredEvent{ID: id, Schema: "s", Table: "t", RowKey: []byte{byte(i)}, HLC: messages.HLC(i)})
			return err
		})
	}
}
