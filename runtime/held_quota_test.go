package runtime

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/messages"
)

// TestHeldQuotaHoldsAfterEquivocationAndBackdatePushes: the simulation
// once saw a 1 100-event held flood produce no quota rejection right after
// two hostile pushes (an equivocation push, then a backdate push). The
// cause was the lossy network dropping that one flood push (re-run over 80
// seeds: every seed without a rejection had its flood lost in transit,
// every flood that arrived was rejected past the quota), not the quota.
// Here, on a lossless network, the same three pushes in a row leave the
// signer's held quota exact: 1 024 held, the other 76 rejected.
func TestHeldQuotaHoldsAfterEquivocationAndBackdatePushes(t *testing.T) {
	m := newTestMesh(t, 43, []string{"h", "r"}, nil)
	m.link("h", "r")
	h := &simHostile{n: m.nodes["h"].Node, net: m.net, log: bytes.Repeat([]byte{7}, 16), wall: m.nodes["h"].wall}
	r := m.nodes["r"]
	rng := rand.New(rand.NewPCG(43, 1))
	ctx := context.Background()
	h.push(ctx, "h", "r", &messages.SyncPush{Events: simEquivocate(t, rng, h)})
	h.push(ctx, "h", "r", &messages.SyncPush{Events: []messages.PushedEvent{simBackdate(t, rng, h)}})
	if got := counterValue(t, r, "syncmesh_sync_equivocations_total"); got == 0 {
		t.Fatal("the equivocation push was not applied")
	}
	const flood = 1100
	h.flood(ctx, t, "r", flood)
	if got, want := r.ReplicationStats().HeldQuotaRejections, uint64(flood-syncgroup.MaxHeldEventsPerSigner); got != want {
		t.Fatalf("%d held-quota rejections, want %d", got, want)
	}
}
