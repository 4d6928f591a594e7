package replicate

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syncmesh/syncmesh/messages"
)

// The push receive counter has one series per outcome — applied,
// duplicate, dropped — rather than one verdict="done" for all three;
// the three add up to the push result's Applied.
func TestReceiveCounterSplitsByOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	dup := applied(gT)
	dup.Kind = messages.Duplicate
	drop := applied(gU)
	drop.Kind, drop.Reason = messages.Dropped, messages.ReasonOutOfScope
	forged := messages.Outcome{Kind: messages.Dropped, Reason: messages.ReasonSignature} // unauthenticated: no site
	quota := applied(gU)
	quota.Kind, quota.Reason = messages.Rejected, messages.ReasonHeldQuota
	outs := []messages.Outcome{applied(gT), applied(gU), dup, drop, forged, held(gT), quota}
	res, _ := record(t, st, push(0, 7, []uint64{1, 2, 3, 4, 5, 6, 7}), outs...)
	m.received("a", res, outs)

	want := map[string]float64{"applied": 2, "duplicate": 1, "dropped": 2, "retry": 2, "held_quota": 1}
	for outcome, n := range want {
		if got := testutil.ToFloat64(m.recv.WithLabelValues("a", outcome)); got != n {
			t.Errorf("outcome=%s: %v, want %v", outcome, got, n)
		}
	}
	if got := testutil.CollectAndCount(m.recv); got != len(want) {
		t.Errorf("%d series, want %d (no lumped \"done\")", got, len(want))
	}
	if sum := want["applied"] + want["duplicate"] + want["dropped"]; uint64(sum) != res.Applied {
		t.Errorf("applied+duplicate+dropped = %v, push result Applied = %d", sum, res.Applied)
	}
}
