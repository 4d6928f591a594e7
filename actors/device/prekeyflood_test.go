package device_test

import (
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
)

// TestAttackBundleFloodKeepsInitiationInFlight: alice
// takes one of bob's bundles and sends her first message; before it
// arrives, 1 100 bundle requests (more than MaxOneTime, 1 000) are served
// by bob. The one-time prekey alice's initiation names is younger than
// the minimum age, so it is still held: her message is delivered and
// committed, and the flood got last-resort bundles instead.
func TestAttackBundleFloodKeepsInitiationInFlight(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	sm := a.send(b, "in flight")
	for i := 0; i < 1100; i++ {
		if _, err := b.d.Bundle(bg); err != nil {
			t.Fatalf("bundle %d: %v", i, err)
		}
	}
	r, err := b.recv(b.takeOne())
	if err != nil {
		t.Fatalf("alice's initiation after 1 100 bundle requests: %v", err)
	}
	if r.Kind != device.Delivery || string(r.Message.Plaintext) != "in flight" {
		t.Fatalf("alice's initiation: %+v", r)
	}
	if c := b.commit(a, sm.ID); c.Status != device.Committed {
		t.Fatalf("commit: %+v", c)
	}
	a.pump()
	if p := a.sentPending(); len(p) != 0 {
		t.Fatalf("alice still has %d pending after bob's ACK", len(p))
	}
}
