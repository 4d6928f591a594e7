package inbound

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Direct tests of the pure decision core (docs/architecture.md, "Practices").

var (
	alice = messages.DeviceAddress{User: "alice", Device: 1}
	mid   = messages.LogicalMessageID{1, 2, 3}
)

// fataler is what the helpers need of testing.TB and *rapid.T.
type fataler interface{ Fatal(args ...any) }

func frameOf(t fataler, id messages.LogicalMessageID, body string) []byte {
	f, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: id, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func recvIn(t fataler, body string) ReceiveInput {
	return ReceiveInput{Sender: alice, ID: mid, Body: []byte(body), Frame: frameOf(t, mid, body), Now: 1234}
}

func pendingOf(t fataler, body string) *persistence.PendingInbound {
	return &persistence.PendingInbound{Sender: alice, ID: mid, Sequence: 7, ReceivedAt: 99, Frame: frameOf(t, mid, body)}
}

func processedOf(body string, f persistence.Finalization) *persistence.ProcessedInbound {
	d := digest.ApplicationMessage([]byte(body))
	p := &persistence.ProcessedInbound{Sender: alice, ID: mid, Finalization: f, FinalizedAt: 5, Digest: &d}
	if f == persistence.FinalizationDiscarded {
		p.Reason = persistence.DiscardOther
	}
	return p
}

func TestDecideReceiveNewStoresPendingNoAck(t *testing.T) {
	d := DecideReceive(State{}, recvIn(t, "b"))
	if d.Err != nil || d.Outcome != OutcomeDelivery || !d.New || d.Effects.PutPending == nil || !d.Effects.PersistStep || d.Effects.Ack {
		t.Fatalf("%+v", d)
	}
	if p := d.Effects.PutPending; p.ReceivedAt != 1234 || string(p.Frame) != string(frameOf(t, mid, "b")) || p.Sender != alice || p.ID != mid ||
		p.Deliveries != 1 || d.Effects.CountDelivery {
		t.Fatalf("pending entry %+v (the first hand-off is counted in the receive's put)", p)
	}
}

func TestDecideReceivePendingSameBodyRedeliversStored(t *testing.T) {
	p := pendingOf(t, "b")
	d := DecideReceive(State{Pending: p}, recvIn(t, "b"))
	if d.Err != nil || d.Outcome != OutcomeDelivery || d.New || d.Effects.PutPending != nil || !d.Effects.PersistStep || d.Effects.Ack {
		t.Fatalf("%+v", d)
	}
	if d.Pending != p || string(d.Plaintext) != "b" {
		t.Fatalf("redelivery of %+v / %q", d.Pending, d.Plaintext)
	}
	if !d.Effects.CountDelivery {
		t.Fatal("a redelivery on a sender's retry does not count the hand-off")
	}
}

// TestDecideReceiveHeldReceiptTable: a held receipt answers exactly a copy
// of a still-pending message, and only when HeldReceipts is on; never a
// first receipt, a finalized copy (that gets the ACK) or a conflict.
func TestDecideReceiveHeldReceiptTable(t *testing.T) {
	for _, c := range []struct {
		name string
		st   State
		body string
		on   bool
		want bool
	}{
		{"new message", State{}, "b", true, false},
		{"copy of a pending message", State{Pending: pendingOf(t, "b")}, "b", true, true},
		{"copy of a pending message, receipts off", State{Pending: pendingOf(t, "b")}, "b", false, false},
		{"pending, other body", State{Pending: pendingOf(t, "b")}, "x", true, false},
		{"copy of a committed message", State{Processed: processedOf("b", persistence.FinalizationCommitted)}, "b", true, false},
	} {
		in := recvIn(t, c.body)
		in.HeldReceipts = c.on
		d := DecideReceive(c.st, in)
		if d.Effects.Held != c.want {
			t.Errorf("%s: Held %v, want %v (%+v)", c.name, d.Effects.Held, c.want, d)
		}
		if d.Effects.Held && d.Effects.Ack {
			t.Errorf("%s: a held receipt and an ACK", c.name)
		}
	}
}

func TestDecideReceivePendingOtherBodyConflict(t *testing.T) {
	for _, other := range []string{"c", "bb", ""} {
		d := DecideReceive(State{Pending: pendingOf(t, "b")}, recvIn(t, other))
		var ce *ConflictError
		if !errors.As(d.Err, &ce) || ce.Finalized || d.Effects != (Effects{}) {
			t.Fatalf("body %q: %+v", other, d)
		}
	}
}

func TestDecideReceiveProcessed(t *testing.T) {
	for _, f := range []persistence.Finalization{persistence.FinalizationCommitted, persistence.FinalizationDiscarded} {
		d := DecideReceive(State{Processed: processedOf("b", f)}, recvIn(t, "b"))
		want := OutcomeAlreadyCommitted
		if f == persistence.FinalizationDiscarded {
			want = OutcomeAlreadyDiscarded
		}
		if d.Err != nil || d.Outcome != want || !d.Effects.Ack || !d.Effects.PersistStep || d.Plaintext != nil || d.Effects.PutPending != nil {
			t.Fatalf("%s: %+v", f, d)
		}
		d = DecideReceive(State{Processed: processedOf("b", f)}, recvIn(t, "x"))
		if !errors.Is(d.Err, ErrLogicalMessageConflict) || d.Effects.Ack {
			t.Fatalf("%s conflict: %+v", f, d)
		}
	}
	legacy := processedOf("b", persistence.FinalizationCommitted)
	legacy.Digest, legacy.Legacy = nil, true
	if d := DecideReceive(State{Processed: legacy}, recvIn(t, "anything")); d.Outcome != OutcomeAlreadyCommitted || !d.Effects.Ack {
		t.Fatalf("legacy: %+v", d)
	}
	legacy.Legacy = false // no digest, no marker: corrupt, never "any body"
	if d := DecideReceive(State{Processed: legacy}, recvIn(t, "anything")); !errors.Is(d.Err, persistence.ErrCorrupt) || d.Effects.Ack {
		t.Fatalf("no digest, no legacy marker: %+v", d)
	}
}

func TestDecideReceiveBacklogCap(t *testing.T) {
	in := recvIn(t, "b")
	in.MaxPendingPerSender = 3
	if d := DecideReceive(State{SenderPending: 2}, in); d.Err != nil || !d.New {
		t.Fatalf("below the cap: %+v", d)
	}
	d := DecideReceive(State{SenderPending: 3}, in)
	var bf *BacklogFullError
	if !errors.As(d.Err, &bf) || bf.Pending != 3 || bf.Limit != 3 || d.Effects.PersistStep {
		t.Fatalf("at the cap: %+v", d)
	}
	// A copy of a pending message is not new: never refused.
	if d := DecideReceive(State{Pending: pendingOf(t, "b"), SenderPending: 10}, in); d.Err != nil {
		t.Fatalf("pending copy past the cap: %+v", d)
	}
}

func TestDecideReceiveDamagedStoredFrameIsCorrupt(t *testing.T) {
	p := pendingOf(t, "b")
	p.Frame = []byte{0xff}
	if d := DecideReceive(State{Pending: p}, recvIn(t, "b")); !errors.Is(d.Err, persistence.ErrCorrupt) {
		t.Fatalf("%+v", d)
	}
	other := pendingOf(t, "b")
	other.Frame = frameOf(t, messages.LogicalMessageID{9}, "b")
	if d := DecideReceive(State{Pending: other}, recvIn(t, "b")); !errors.Is(d.Err, persistence.ErrCorrupt) {
		t.Fatalf("frame of another id: %+v", d)
	}
}

func TestDecideAck(t *testing.T) {
	if d := DecideAck(true); d.Outcome != OutcomeAcknowledgement || !d.Cleared || !d.Effects.DeleteOutbound || !d.Effects.PersistStep {
		t.Fatalf("%+v", d)
	}
	if d := DecideAck(false); d.Cleared || d.Effects.DeleteOutbound || !d.Effects.PersistStep {
		t.Fatalf("%+v", d)
	}
}

func finIn(f persistence.Finalization, r persistence.DiscardReason) FinalizeInput {
	return FinalizeInput{Sender: alice, ID: mid, Finalization: f, Reason: r, Now: 777}
}

func TestDecideFinalize(t *testing.T) {
	commit := finIn(persistence.FinalizationCommitted, 0)
	d := DecideFinalize(State{Pending: pendingOf(t, "b")}, commit)
	want := digest.ApplicationMessage([]byte("b"))
	if d.Err != nil || d.Outcome != OutcomeCommitted || !d.Effects.DeletePending || !d.Effects.Ack || d.Effects.PersistStep {
		t.Fatalf("commit pending: %+v", d)
	}
	if p := d.Effects.PutProcessed; p == nil || p.FinalizedAt != 777 || *p.Digest != want || p.Finalization != persistence.FinalizationCommitted || p.Reason != 0 {
		t.Fatalf("processed entry %+v", p)
	}
	discard := finIn(persistence.FinalizationDiscarded, persistence.DiscardExpired)
	d = DecideFinalize(State{Pending: pendingOf(t, "b")}, discard)
	if d.Outcome != OutcomeDiscarded || d.Effects.PutProcessed.Reason != persistence.DiscardExpired {
		t.Fatalf("discard pending: %+v", d)
	}
	for _, tc := range []struct {
		st   persistence.Finalization
		in   FinalizeInput
		want Outcome
	}{
		{persistence.FinalizationCommitted, commit, OutcomeAlreadyCommitted},
		{persistence.FinalizationCommitted, discard, OutcomeAlreadyCommitted},
		{persistence.FinalizationDiscarded, commit, OutcomeAlreadyDiscarded},
		{persistence.FinalizationDiscarded, discard, OutcomeAlreadyDiscarded},
	} {
		d := DecideFinalize(State{Processed: processedOf("b", tc.st)}, tc.in)
		if d.Outcome != tc.want || !d.Effects.Ack || d.Effects.PutProcessed != nil || d.Effects.DeletePending {
			t.Fatalf("%s then %s: %+v", tc.st, tc.in.Finalization, d)
		}
	}
	d = DecideFinalize(State{}, commit)
	if !errors.Is(d.Err, ErrReceivedMessageNotPending) || d.Effects != (Effects{}) {
		t.Fatalf("not pending: %+v", d)
	}
	for _, bad := range []FinalizeInput{finIn(persistence.FinalizationDiscarded, 0), finIn(persistence.FinalizationDiscarded, 77), finIn(persistence.FinalizationCommitted, persistence.DiscardOther)} {
		if d := DecideFinalize(State{Pending: pendingOf(t, "b")}, bad); !errors.Is(d.Err, ErrInvalidDiscardReason) {
			t.Fatalf("%+v: %+v", bad, d)
		}
	}
}

func TestPruneCutoffRoundsUpToMilliseconds(t *testing.T) {
	for _, tc := range []struct {
		age  time.Duration
		want int64
	}{
		{time.Millisecond, 999}, {1500 * time.Microsecond, 998}, {time.Nanosecond, 999}, {time.Second, 0}, {2 * time.Second, -1000},
	} {
		cut, prune, err := PruneCutoff(1000, RetentionPolicy{MaxAge: tc.age})
		if err != nil || !prune || cut != tc.want {
			t.Errorf("maxAge %v: cutoff %d %v %v, want %d", tc.age, cut, prune, err, tc.want)
		}
	}
	if _, prune, err := PruneCutoff(1000, RetentionPolicy{MaxAge: RetentionInfinite}); prune || err != nil {
		t.Fatal("INFINITE prunes")
	}
	for _, bad := range []time.Duration{0, -1} {
		if _, _, err := PruneCutoff(1000, RetentionPolicy{MaxAge: bad}); !errors.Is(err, ErrInvalidRetention) {
			t.Fatalf("maxAge %v: %v", bad, err)
		}
	}
}

// Property: whatever the stored state, a decision with an error has no
// effects; a Delivery never ACKs; an ACKing receive never stores a row.
func TestDecideReceiveProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		body := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(rt, "body")
		stored := rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(rt, "stored")
		var st State
		switch rapid.IntRange(0, 2).Draw(rt, "state") {
		case 1:
			st.Pending = pendingOf(rt, string(stored))
		case 2:
			st.Processed = processedOf(string(stored), persistence.Finalization(rapid.IntRange(1, 2).Draw(rt, "fin")))
			if rapid.Bool().Draw(rt, "legacy") {
				st.Processed.Digest, st.Processed.Legacy = nil, true
			}
		}
		st.SenderPending = rapid.IntRange(0, 5).Draw(rt, "senderPending")
		in := recvIn(rt, string(body))
		in.MaxPendingPerSender = rapid.IntRange(0, 5).Draw(rt, "cap")
		d := DecideReceive(st, in)
		if d.Err != nil {
			if d.Effects != (Effects{}) || d.Outcome != OutcomeNone {
				rt.Fatalf("error with effects: %+v", d)
			}
			return
		}
		if !d.Effects.PersistStep {
			rt.Fatalf("accepted without persisting the ratchet step: %+v", d)
		}
		if d.Outcome == OutcomeDelivery && (d.Effects.Ack || string(d.Plaintext) != string(body)) {
			rt.Fatalf("Delivery: %+v", d)
		}
		if d.Effects.Ack && d.Effects.PutPending != nil {
			rt.Fatalf("ACK with a new row: %+v", d)
		}
		if st.Pending != nil && string(stored) != string(body) {
			rt.Fatalf("pending conflict accepted: %+v", d)
		}
	})
}
