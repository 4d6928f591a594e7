package main

import (
	"context"
	"testing"
)

// TestDeliveryFlowsSmoke runs every syncmesh flow of the delivery section
// with a few messages (fsync on, as in make bench; no timing checked):
// smTrial fails unless every message was committed by the receiver's
// Handler and its ACK cleared the sender's pending entry, with nothing
// pending on either side after; the commit counters must have moved on
// both sides.
func TestDeliveryFlowsSmoke(t *testing.T) {
	ctx := context.Background()
	for _, f := range smFlows {
		t.Run(f.name, func(t *testing.T) {
			r, err := smTrial(ctx, f, 32)
			if err != nil {
				t.Fatal(err)
			}
			if r.Messages != 32 || r.Seconds <= 0 {
				t.Fatalf("ran %d messages in %v s, want 32", r.Messages, r.Seconds)
			}
			// Each message is at least a durable outbound row at the
			// sender and a durable pending row at the receiver.
			if r.SenderCommits == 0 || r.ReceiverCommits == 0 {
				t.Fatalf("commit counters did not move: %+v", r)
			}
		})
	}
	if _, err := smTrial(ctx, smFlows[0], 0); err != nil {
		t.Fatalf("setup-only trial (the strace baseline): %v", err)
	}
}

func TestParseStraceCount(t *testing.T) {
	const summary = `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 61.20    0.037110          72       515           fsync
 38.80    0.023530          45       520         3 fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.060640          58      1035         3 total
`
	for _, tc := range []struct {
		name, in string
		want     int
		bad      bool
	}{
		{"fsync and fdatasync rows", summary, 1035, false},
		{"no call traced: strace writes nothing", "", 0, false},
		{"not a summary", "strace: exec: No such file or directory\n", 0, true},
		{"bad calls column", "100.00 0.1 1 many  fsync\ntotal\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStraceCount(tc.in)
			if (err != nil) != tc.bad || got != tc.want {
				t.Fatalf("parseStraceCount = %d, %v; want %d (error: %v)", got, err, tc.want, tc.bad)
			}
		})
	}
}
