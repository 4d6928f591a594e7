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
			// Every delivery commit writes at least a changed leaf and the
			// meta page.
			if w := r.Writes; w.Commits == 0 || w.Commits > r.SenderCommits+r.ReceiverCommits || w.Pages < 2*w.Commits || w.Bytes < 1024*w.Pages {
				t.Fatalf("delivery writes: %+v of %d commits", w, r.SenderCommits+r.ReceiverCommits)
			}
		})
	}
	if _, err := smTrial(ctx, smFlows[0], 0); err != nil {
		t.Fatalf("setup-only trial (the strace baseline): %v", err)
	}
}

// TestParseStrace counts call starts, not their resumptions, and only
// the openat calls that ask for synchronous writes.
func TestParseStrace(t *testing.T) {
	const trace = `4242  openat(AT_FDCWD, "/tmp/js/msgs/1.blk", O_RDWR|O_CREAT|O_CLOEXEC, 0640) = 7
4242  fsync(7)                          = 0
4243  fdatasync(9 <unfinished ...>
4244  fdatasync(9)                      = 0
4243  <... fdatasync resumed>)          = 0
4245  openat(AT_FDCWD, "/tmp/js/obs/work/o.dat.tmp", O_WRONLY|O_CREAT|O_TRUNC|O_SYNC|O_CLOEXEC, 0640) = 11
4245  openat(AT_FDCWD, "/tmp/x", O_WRONLY|O_DSYNC|O_CLOEXEC, 0640 <unfinished ...>
4245  +++ exited with 0 +++
`
	got := parseStrace(trace)
	if want := (syncCalls{fsync: 1, fdatasync: 2, osync: 2}); got != want {
		t.Fatalf("parseStrace = %+v, want %+v", got, want)
	}
	if got.total() != 5 || got.minus(syncCalls{fsync: 1}).total() != 4 {
		t.Fatalf("total %d, minus %+v", got.total(), got.minus(syncCalls{fsync: 1}))
	}
	if got := parseStrace(""); got != (syncCalls{}) {
		t.Fatalf("empty trace: %+v", got)
	}
}
