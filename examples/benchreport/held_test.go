package main

import (
	"context"
	"testing"
	"time"
)

// TestHeldTrialSmoke runs both arms of the held section with a few
// messages held 2.5 s (no timing checked): heldTrial fails unless every
// message was committed and acknowledged. With receipts the first copy of
// each message is answered and no second copy follows; without, none is
// answered.
func TestHeldTrialSmoke(t *testing.T) {
	ctx := context.Background()
	const n = 4
	with, err := heldTrial(ctx, n, 2500*time.Millisecond, true)
	if err != nil {
		t.Fatal(err)
	}
	if with.Receipts < 1 || with.Receipts > n || with.Resends > n {
		t.Fatalf("with receipts: %+v, want at most one resend and one receipt per message", with)
	}
	without, err := heldTrial(ctx, n, 2500*time.Millisecond, false)
	if err != nil {
		t.Fatal(err)
	}
	if without.Receipts != 0 {
		t.Fatalf("without receipts: %+v, want none", without)
	}
}
