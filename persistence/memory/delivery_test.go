package memory_test

import (
	"testing"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

func openMemoryDelivery(t *testing.T) (persistence.DeliveryStore, func() persistence.DeliveryStore) {
	s := memory.NewDelivery()
	cur := s
	t.Cleanup(func() { _ = cur.Close() })
	return s, func() persistence.DeliveryStore {
		_ = cur.Close()
		cur = cur.Reopen()
		return cur
	}
}

func TestDeliveryContract(t *testing.T) { storetest.RunDeliveryStore(t, openMemoryDelivery) }
