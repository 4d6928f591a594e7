package session

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// The abandoned-id memory refuses only another body, and is bounded: past
// maxAbandonedIDs the oldest id is forgotten, the newest still known.
func TestAbandonedIDsBoundAndBody(t *testing.T) {
	var a abandonedIDs
	peer := messages.DeviceAddress{User: "bob", Device: 1}
	id := func(i int) messages.LogicalMessageID {
		return messages.LogicalMessageID{byte(i), byte(i >> 8), byte(i >> 16)}
	}
	a.add(peer, id(0), []byte("x"))
	if a.conflicts(peer, id(0), []byte("x")) || !a.conflicts(peer, id(0), []byte("y")) {
		t.Fatal("same body refused or other body accepted")
	}
	if a.conflicts(messages.DeviceAddress{User: "carol", Device: 1}, id(0), []byte("y")) {
		t.Fatal("the id of another peer refused")
	}
	for i := 1; i <= maxAbandonedIDs; i++ {
		a.add(peer, id(i), []byte("x"))
	}
	if len(a.m) != maxAbandonedIDs || len(a.order) != maxAbandonedIDs {
		t.Fatalf("%d ids, %d in order, cap %d", len(a.m), len(a.order), maxAbandonedIDs)
	}
	if a.conflicts(peer, id(0), []byte("y")) {
		t.Fatal("the oldest id is still remembered past the cap")
	}
	if !a.conflicts(peer, id(maxAbandonedIDs), []byte("y")) {
		t.Fatal("the newest id is forgotten")
	}
}
