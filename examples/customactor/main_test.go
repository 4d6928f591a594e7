package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
)

// TestCustomActorFeedsTheSyncPlane runs the demo and checks what it
// claims: both messages reached the peer's synced table, the message
// interrupted between write and commit was redelivered after the restart,
// rewritten onto the same row and committed, the sender holds no pending
// message (its ACKs arrived), nothing is pending at the receiver, and the
// actor received the ColumnsIgnored notice.
func TestCustomActorFeedsTheSyncPlane(t *testing.T) {
	var log bytes.Buffer
	out, err := run(context.Background(), t.TempDir(), &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	bodies := map[string]bool{}
	for _, b := range out.AliceRows {
		bodies[b] = true
	}
	if len(out.AliceRows) != 2 || !bodies["hello bob"] || !bodies["are you there?"] {
		t.Fatalf("alice's table: %v; want both messages", out.AliceRows)
	}
	if out.BobRows != 2 {
		t.Fatalf("bob's table has %d rows; the rewrite must land on the same row (want 2)", out.BobRows)
	}
	if out.BobPending != 0 || out.AlicePendingSent != 0 {
		t.Fatalf("pending at the end: bob received %d, alice sent %d", out.BobPending, out.AlicePendingSent)
	}
	// Before the crash: two writes, one commit (the second was interrupted).
	if out.WritesBefore != 2 || out.CommitsBefore != 1 {
		t.Fatalf("before the crash: %d writes, %d commits; want 2, 1", out.WritesBefore, out.CommitsBefore)
	}
	// After the restart the new actor got the pending message again.
	if out.WritesAfter != 1 || out.CommitsAfter != 1 {
		t.Fatalf("after the restart: %d writes, %d commits; want 1, 1", out.WritesAfter, out.CommitsAfter)
	}
	if len(out.Processed) != 2 {
		t.Fatalf("bob's processed records: %d; want both messages", len(out.Processed))
	}
	for id, p := range out.Processed {
		if p.Finalization != persistence.FinalizationCommitted {
			t.Fatalf("message %s finalized as %v; want committed", id, p.Finalization)
		}
	}
	var ignored *messages.ColumnsIgnored
	for _, n := range out.Notices {
		if ci, ok := n.(messages.ColumnsIgnored); ok {
			ignored = &ci
		}
	}
	if ignored == nil || len(ignored.Columns) != 1 || ignored.Columns[0] != "note" || ignored.Schema != inboxSchema {
		t.Fatalf("notices: %+v; want ColumnsIgnored{note} on %s", out.Notices, inboxSchema)
	}
	// alice's Watch saw one change per event bob pushed, each naming bob's site.
	if len(out.AliceChanges) != out.Offered || out.Offered == 0 {
		t.Fatalf("alice watched %d changes for %d events pushed", len(out.AliceChanges), out.Offered)
	}
	for _, c := range out.AliceChanges {
		if c.Cause != runtime.CauseEvent || c.Event.Site != out.BobSite || !c.Exists {
			t.Fatalf("change %+v: want an existing row changed by an event of bob's site", c)
		}
	}
	for _, want := range []string{"simulated crash", "reopening", "ACK for"} {
		if !strings.Contains(log.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, log.String())
		}
	}
}
