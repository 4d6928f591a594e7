package runtime

import "testing"

func counterValue(t *testing.T, n *testNode, name string) float64 {
	t.Helper()
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func TestOutcomeMetricsByReason(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	p := newPeer(t, 1)
	n.apply(p.upsert(hlcAt(n.wall.MS(), 1), 1, map[string]any{"a": "x"})) // untrusted → dropped
	n.trust(p)
	n.apply(p.upsert(hlcAt(n.wall.MS(), 2), 1, map[string]any{"a": "x"}))
	if got := counterValue(t, n, "syncmesh_sync_events_total"); got != 2 {
		t.Fatalf("events_total = %v", got)
	}
}
