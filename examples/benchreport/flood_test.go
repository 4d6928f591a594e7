package main

import (
	"context"
	"testing"
)

// TestFloodTrialSmoke runs each arm of the flood section with a few
// messages (no timing checked): floodTrial fails unless every forged
// envelope was decided (refused or failed), every message acknowledged
// and nothing left pending; the throttled flood gets at most the
// requester's burst of bundles, the unthrottled one all of them.
func TestFloodTrialSmoke(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name            string
		flood, throttle bool
	}{{"quiet", false, false}, {"flood", true, true}, {"unthrottled", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			r, err := floodTrial(ctx, 10, c.flood, c.throttle, 40, 60)
			if err != nil {
				t.Fatal(err)
			}
			if r.P99 <= 0 || r.Median <= 0 || r.Median > r.P99 {
				t.Fatalf("latencies: %+v", r)
			}
			switch {
			case !c.flood && (r.Forged != 0 || r.Bundles != 0):
				t.Fatalf("quiet arm flooded: %+v", r)
			case c.flood && r.Forged != 40:
				t.Fatalf("%d of 40 forged envelopes decided", r.Forged)
			case c.throttle && (r.Bundles < 32 || r.Bundles > 40):
				t.Fatalf("throttled flood: %d bundles served, want the burst of 32 (plus the refill of a few seconds)", r.Bundles)
			case c.flood && !c.throttle && r.Bundles != 60:
				t.Fatalf("unthrottled flood: %d of 60 bundles served", r.Bundles)
			}
		})
	}
}
