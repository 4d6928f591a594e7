package memory_test

import (
	"testing"

	"github.com/syncmesh/syncmesh/persistence/storetest"
)

func TestInboundContract(t *testing.T) { storetest.RunInboundStore(t, openMemoryDelivery) }
