package inbound

import (
	"crypto/subtle"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// This file is the deterministic core of the inbound store (docs/architecture.md,
// "Practices": deterministic core, thin actor shell): pure functions of
// (stored state of one (sender, id), input) → (outcome, effects). They do
// no I/O; the sender's peer actor (actors/session) reads the state, calls
// them and hands the effects to the store's committer (writes in one
// transaction with the ratchet step; the ACK leaves after it is durable).

// Outcome is what a decision resolved to.
type Outcome uint8

// Outcomes. The receive path yields Delivery, AlreadyCommitted,
// AlreadyDiscarded or Acknowledgement; a finalization yields Committed,
// Discarded, AlreadyCommitted or AlreadyDiscarded (docs/protocol.md, commit boundary,
// "Public API" and "Discard").
const (
	OutcomeNone Outcome = iota
	OutcomeDelivery
	OutcomeAlreadyCommitted
	OutcomeAlreadyDiscarded
	OutcomeAcknowledgement
	OutcomeCommitted
	OutcomeDiscarded
	// OutcomeHeld: a held receipt from the recipient of a sent message
	// (docs/protocol.md, "Held receipt"): not an ACK, the message stays
	// pending.
	OutcomeHeld
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case OutcomeDelivery:
		return "DELIVERY"
	case OutcomeAlreadyCommitted:
		return "ALREADY_COMMITTED"
	case OutcomeAlreadyDiscarded:
		return "ALREADY_DISCARDED"
	case OutcomeAcknowledgement:
		return "ACKNOWLEDGEMENT"
	case OutcomeCommitted:
		return "COMMITTED"
	case OutcomeDiscarded:
		return "DISCARDED"
	case OutcomeHeld:
		return "HELD"
	}
	return "NONE"
}

// State is what the store holds for one (sender, logical id), read inside
// the transaction that will run the decision's effects.
type State struct {
	Pending   *persistence.PendingInbound
	Processed *persistence.ProcessedInbound
	// SenderPending is how many messages the sender has pending (read only
	// when a cap applies and the message is new).
	SenderPending int
	// PendingDigest, when set, is the ApplicationMessageDigest of the
	// pending entry's body, known to the deciding actor (it made the entry
	// durable): DecideFinalize takes it instead of decoding Pending.Frame,
	// which may then be nil. DecideReceive does not use it.
	PendingDigest *[32]byte
}

// Effects are the writes and actions a decision asks the shell to run. The
// writes go into the decision's transaction; Ack runs after it committed,
// outside it.
type Effects struct {
	// PersistStep: write the envelope's ratchet step with the other
	// writes. When false the step is rolled back (not adopted).
	PersistStep bool
	// PutPending: store this new pending entry (the store assigns Sequence).
	PutPending *persistence.PendingInbound
	// CountDelivery: record one more hand-off of the stored pending entry
	// (a sender's retry of a pending message is delivered again; its
	// count is persisted in the receive's own transaction).
	CountDelivery bool
	// DeletePending: remove the pending entry of the key.
	DeletePending bool
	// PutProcessed: write this processed entry.
	PutProcessed *persistence.ProcessedInbound
	// DeleteOutbound: clear the pending outbound message the ACK names.
	DeleteOutbound bool
	// Ack: encrypt an ACK for the key (its ratchet step written with the
	// other writes) and hand it to the transport after the transaction is
	// durable.
	Ack bool
	// Held: encrypt a held receipt for the key, naming the digest of the
	// pending body, as the ACK is (its step written with the other
	// writes, handed over once they are durable): the sender stops
	// resending on its short schedule.
	Held bool
}

// Decision is the result of a decide function: an outcome with its
// effects, or an error (then there are no effects: nothing changes and the
// ratchet step, if any, rolls back).
type Decision struct {
	Outcome Outcome
	Effects Effects
	// Pending is the stored pending entry a Delivery of a still-pending
	// message returns (same sequence and receive time on every
	// redelivery); for a new message it is Effects.PutPending.
	Pending *persistence.PendingInbound
	// Plaintext is the application body of a Delivery.
	Plaintext []byte
	// New reports a first acceptance (Effects.PutPending is set).
	New bool
	// Cleared reports, for an Acknowledgement, that a pending outbound
	// message was cleared.
	Cleared bool
	Err     error
}

// ReceiveInput is a decrypted application message.
type ReceiveInput struct {
	Sender messages.DeviceAddress
	ID     messages.LogicalMessageID
	Body   []byte
	// Frame is the encoded SecurePayload frame (what is stored pending).
	Frame []byte
	// Now is the client clock, Unix milliseconds.
	Now int64
	// MaxPendingPerSender caps the sender's pending messages (0: no cap).
	MaxPendingPerSender int
	// HeldReceipts: answer a copy of a pending message with a held
	// receipt (off only while some senders run a build that cannot read
	// one: docs/protocol.md, "Held receipt").
	HeldReceipts bool
}

// DecideReceive decides an application message (docs/protocol.md, commit boundary,
// "Transactions", Receive; lifecycle table):
//
//   - processed: the body's digest must equal the stored one (a legacy
//     entry, marked by a migration, has no digest and matches any body) → AlreadyCommitted or
//     AlreadyDiscarded, ACK again; else LogicalMessageConflict, no ACK;
//   - pending: the body must equal the stored body (constant time) →
//     Delivery of the stored message, no second row, no ACK, and a held
//     receipt when HeldReceipts is set (the copy shows the sender is
//     waiting for an ACK the application's commit has not given yet);
//     else LogicalMessageConflict, the pending body is not overwritten;
//   - otherwise: a new pending entry (refused with ErrSenderBacklogFull
//     past the per-sender cap) → Delivery, no ACK.
//
// Every accepted duplicate still persists its ratchet step: the retry is a
// fresh encryption and the ratchet is never rewound. An error persists
// nothing, so that ratchet step rolls back like a malformed frame.
func DecideReceive(st State, in ReceiveInput) Decision {
	if p := st.Processed; p != nil {
		if p.Digest == nil && !p.Legacy {
			// Only a migrated entry carries no digest (the stores refuse
			// and never return one without the legacy marker).
			return Decision{Err: fmt.Errorf("inbound: processed entry of %s/%s without digest or legacy marker: %w", in.Sender, in.ID, persistence.ErrCorrupt)}
		}
		if p.Digest != nil {
			d := digest.ApplicationMessage(in.Body)
			if !digest.Equal(d, *p.Digest) {
				return Decision{Err: &ConflictError{Sender: in.Sender, ID: in.ID, Finalized: true}}
			}
		}
		out := OutcomeAlreadyCommitted
		if p.Finalization == persistence.FinalizationDiscarded {
			out = OutcomeAlreadyDiscarded
		}
		return Decision{Outcome: out, Effects: Effects{PersistStep: true, Ack: true}}
	}
	if p := st.Pending; p != nil {
		stored, err := StoredBody(p)
		if err != nil {
			return Decision{Err: err}
		}
		// Constant time over the contents (a length difference is
		// public: it is visible in the ciphertext size anyway).
		if subtle.ConstantTimeCompare(stored, in.Body) != 1 {
			return Decision{Err: &ConflictError{Sender: in.Sender, ID: in.ID}}
		}
		return Decision{Outcome: OutcomeDelivery, Effects: Effects{PersistStep: true, CountDelivery: true, Held: in.HeldReceipts}, Pending: p, Plaintext: stored}
	}
	if in.MaxPendingPerSender > 0 && st.SenderPending >= in.MaxPendingPerSender {
		return Decision{Err: &BacklogFullError{Sender: in.Sender, Pending: st.SenderPending, Limit: in.MaxPendingPerSender}}
	}
	// Deliveries 1: the hand-off that follows this receive is counted in
	// its transaction.
	p := &persistence.PendingInbound{Sender: in.Sender, ID: in.ID, ReceivedAt: in.Now, Frame: in.Frame, Deliveries: 1}
	return Decision{Outcome: OutcomeDelivery, Effects: Effects{PersistStep: true, PutPending: p}, Pending: p, Plaintext: in.Body, New: true}
}

// DecideAck decides a received ACK frame: the ratchet step is persisted
// and the pending outbound message it names, if any, is cleared
// (Acknowledgement, cleared = whether there was one).
func DecideAck(outboundPending bool) Decision {
	return Decision{Outcome: OutcomeAcknowledgement, Effects: Effects{PersistStep: true, DeleteOutbound: outboundPending}, Cleared: outboundPending}
}

// FinalizeInput is a commit (Reason 0, Finalization committed) or discard
// request.
type FinalizeInput struct {
	Sender       messages.DeviceAddress
	ID           messages.LogicalMessageID
	Finalization persistence.Finalization
	Reason       persistence.DiscardReason
	// Now is the client clock, Unix milliseconds.
	Now int64
}

// DecideFinalize decides a commit or discard (docs/protocol.md, commit boundary,
// "Transactions", Commit): a pending message is removed and its processed
// entry (finalization, time, digest, reason) written → COMMITTED or
// DISCARDED, then ACK; a finalized one → ALREADY_COMMITTED or
// ALREADY_DISCARDED (by how it was finalized), ACK again; otherwise
// ReceivedMessageNotPending and nothing changes.
func DecideFinalize(st State, in FinalizeInput) Decision {
	switch in.Finalization {
	case persistence.FinalizationCommitted:
		if in.Reason != 0 {
			return Decision{Err: fmt.Errorf("%w: a commit carries no reason", ErrInvalidDiscardReason)}
		}
	case persistence.FinalizationDiscarded:
		if !in.Reason.Valid() {
			return Decision{Err: fmt.Errorf("%w: %s", ErrInvalidDiscardReason, in.Reason)}
		}
	default:
		return Decision{Err: fmt.Errorf("%w: finalization %s", ErrInvalidConfig, in.Finalization)}
	}
	if p := st.Processed; p != nil {
		out := OutcomeAlreadyCommitted
		if p.Finalization == persistence.FinalizationDiscarded {
			out = OutcomeAlreadyDiscarded
		}
		return Decision{Outcome: out, Effects: Effects{Ack: true}}
	}
	p := st.Pending
	if p == nil {
		return Decision{Err: &NotPendingError{Sender: in.Sender, ID: in.ID}}
	}
	var d [32]byte
	if st.PendingDigest != nil {
		d = *st.PendingDigest
	} else {
		body, err := StoredBody(p)
		if err != nil {
			return Decision{Err: err}
		}
		d = digest.ApplicationMessage(body)
	}
	out := OutcomeCommitted
	if in.Finalization == persistence.FinalizationDiscarded {
		out = OutcomeDiscarded
	}
	return Decision{Outcome: out, Effects: Effects{
		DeletePending: true,
		PutProcessed: &persistence.ProcessedInbound{Sender: in.Sender, ID: in.ID, Finalization: in.Finalization,
			FinalizedAt: in.Now, Digest: &d, Reason: in.Reason},
		Ack: true,
	}}
}

// StoredBody decodes the application body of a stored pending frame. A
// frame that does not decode, or names another id, is a damaged record
// (persistence.ErrCorrupt), never "missing".
func StoredBody(p *persistence.PendingInbound) ([]byte, error) {
	sp, err := messages.DecodeSecurePayload(p.Frame)
	if err != nil {
		return nil, fmt.Errorf("inbound: stored frame of %s/%s: %w: %w", p.Sender, p.ID, persistence.ErrCorrupt, err)
	}
	if sp.Type != messages.PayloadApplicationMessage || sp.ID != p.ID {
		return nil, fmt.Errorf("inbound: stored frame of %s/%s is not its application message: %w", p.Sender, p.ID, persistence.ErrCorrupt)
	}
	return sp.Body, nil
}

// RetentionInfinite as a RetentionPolicy.MaxAge keeps every processed
// entry (the spec's Duration.INFINITE).
const RetentionInfinite = time.Duration(1<<63 - 1)

// RetentionPolicy says how long processed entries are kept for duplicate
// suppression (docs/protocol.md, commit boundary, "Processed-ID retention"). There
// is no default: MaxAge must be positive; RetentionInfinite prunes nothing.
type RetentionPolicy struct {
	MaxAge time.Duration
}

// PruneCutoff returns the cutoff of a prune at now (Unix ms): entries with
// finalizedAt ≤ cutoff are removed, with maxAge rounded up to whole
// milliseconds (an age equal to maxAge is pruned, one millisecond less is
// kept). prune is false for RetentionInfinite; maxAge ≤ 0 is
// ErrInvalidRetention.
func PruneCutoff(now int64, p RetentionPolicy) (cutoff int64, prune bool, err error) {
	if p.MaxAge <= 0 {
		return 0, false, fmt.Errorf("%w: %s", ErrInvalidRetention, p.MaxAge)
	}
	if p.MaxAge == RetentionInfinite {
		return 0, false, nil
	}
	ms := int64(p.MaxAge / time.Millisecond)
	if p.MaxAge%time.Millisecond != 0 {
		ms++
	}
	return now - ms, true, nil
}
