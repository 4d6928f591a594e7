package persistence

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// This file holds the commit-boundary records of the delivery plane
// (docs/protocol.md, commit boundary, "Storage"): pending inbound messages (accepted
// by the ratchet, not yet finalized by the application), processed inbound
// entries (committed or discarded; kept for duplicate suppression until
// pruned) and pending outbound messages (sent, not yet acknowledged). They
// are read and written through DeliveryReader and DeliveryTx, so a ratchet
// step and the row it produced commit in one transaction.

// Finalization is how the application finalized an inbound message.
type Finalization uint8

// Finalizations. Numbers are part of the storage format.
const (
	// FinalizationCommitted: the application applied the message
	// (commitReceivedMessage).
	FinalizationCommitted Finalization = 1
	// FinalizationDiscarded: the application can never apply the message
	// (discardReceivedMessage).
	FinalizationDiscarded Finalization = 2
)

// Valid reports whether f is a known finalization.
func (f Finalization) Valid() bool {
	return f == FinalizationCommitted || f == FinalizationDiscarded
}

// String returns "committed", "discarded" or "finalization(n)".
func (f Finalization) String() string {
	switch f {
	case FinalizationCommitted:
		return "committed"
	case FinalizationDiscarded:
		return "discarded"
	}
	return fmt.Sprintf("finalization(%d)", uint8(f))
}

// DiscardReason is the closed set of reasons an application gives when it
// discards a received message. The reason is stored with the processed
// entry and readable by the receiver only; it is never sent to the sender
// (an ACK does not say whether the message was committed or discarded).
type DiscardReason uint8

// Discard reasons. Numbers are part of the storage format.
const (
	// DiscardMalformed: the body is not what the application can parse.
	DiscardMalformed DiscardReason = 1
	// DiscardUnsupported: a well-formed message of a kind or version the
	// application does not support.
	DiscardUnsupported DiscardReason = 2
	// DiscardRejectedByPolicy: the application's policy refuses it.
	DiscardRejectedByPolicy DiscardReason = 3
	// DiscardExpired: the message arrived too late to be useful.
	DiscardExpired DiscardReason = 4
	// DiscardOther: any other permanent reason.
	DiscardOther DiscardReason = 5
)

// Valid reports whether r is one of the closed set of reasons.
func (r DiscardReason) Valid() bool { return r >= DiscardMalformed && r <= DiscardOther }

// String returns the reason's name.
func (r DiscardReason) String() string {
	switch r {
	case DiscardMalformed:
		return "malformed"
	case DiscardUnsupported:
		return "unsupported"
	case DiscardRejectedByPolicy:
		return "rejected_by_policy"
	case DiscardExpired:
		return "expired"
	case DiscardOther:
		return "other"
	}
	return fmt.Sprintf("discard_reason(%d)", uint8(r))
}

// PendingInbound is a received application message that is waiting for the
// application to commit or discard it. The pair (Sender, ID) is unique;
// Sequence is assigned by the store, persistent, strictly increasing and
// never reused (docs/protocol.md, commit boundary, "Public API"). At rest Frame is
// sealed as RecordPendingFrame with identity
// sealed.MessageIdentity(sender user, u32be sender device, id); Sequence,
// the ids and ReceivedAt stay plaintext metadata.
type PendingInbound struct {
	Sender   messages.DeviceAddress
	ID       messages.LogicalMessageID
	Sequence uint64
	// ReceivedAt is the client clock at acceptance, in Unix milliseconds.
	ReceivedAt int64
	// Frame is the encoded SecurePayload ApplicationMessage frame.
	Frame []byte
	// Deliveries counts the hand-offs of the message to the application
	// recorded so far, across restarts: PutPendingInbound stores the value
	// given (the receive path gives 1, counting the hand-off that follows
	// it in the receive's own transaction) and CountInboundDelivery adds
	// one. A record written before the count existed reads as 1 (it may
	// have been handed over once).
	Deliveries uint32
}

// ProcessedInbound is the entry kept for a finalized inbound message, for
// duplicate suppression until pruned. An entry is never replaced. At rest
// Finalization, FinalizedAt, Digest, Reason and Legacy are sealed together
// as RecordProcessedEntry with identity sealed.MessageIdentity(sender
// user, u32be sender device, id); only the ids and a time index for
// pruning stay plaintext (docs/delivery.md, "Sealed pins and processed
// entries").
type ProcessedInbound struct {
	Sender       messages.DeviceAddress
	ID           messages.LogicalMessageID
	Finalization Finalization
	// FinalizedAt is the client clock at the commit or discard, in Unix
	// milliseconds (the stored precision).
	FinalizedAt int64
	// Digest is ApplicationMessageDigest v1 of the finalized body. It is
	// nil only on a legacy entry (Legacy set), which matches any body.
	Digest *[32]byte
	// Reason is set for a discarded entry only (0 for a committed one).
	Reason DiscardReason
	// Legacy marks a committed entry brought over from an older schema
	// that kept no digest (the spec's legacy rule). Only
	// LegacyImporter.ImportLegacyProcessed writes it; PutProcessedInbound
	// refuses it, and a stored entry without digest that lacks the marker
	// reads as ErrCorrupt.
	Legacy bool
}

// PendingOutbound is a sent application message kept until the
// recipient's ACK arrives or the application abandons it. (Recipient, ID)
// is unique; Sequence is assigned by the store, strictly increasing and
// never reused. At rest Body is sealed as RecordOutboundBody with identity
// sealed.MessageIdentity(recipient user, u32be recipient device, id).
type PendingOutbound struct {
	Recipient messages.DeviceAddress
	ID        messages.LogicalMessageID
	Sequence  uint64
	// CreatedAt is the client clock when Send stored it (Unix ms).
	CreatedAt int64
	// Attempts counts hand-offs to the transport (first send included).
	Attempts uint32
	// LastAttemptAt is the client clock of the last hand-off (Unix ms; 0:
	// none yet).
	LastAttemptAt int64
	// Body is the application message body.
	Body []byte
}

// Retirement is how a sent message stopped being pending outbound.
type Retirement uint8

// Retirements. Numbers are part of the storage format.
const (
	// RetiredAbandoned: the application abandoned it (Abandon).
	RetiredAbandoned Retirement = 1
	// RetiredAcknowledged: the recipient's ACK cleared it.
	RetiredAcknowledged Retirement = 2
	// RetiredLost: the recipient ACKed an id the store did not hold (a
	// message a rolled-back store lost). Its body is not known: Digest is
	// zero and no body may be sent under the id.
	RetiredLost Retirement = 3
)

// Valid reports whether r is a known retirement.
func (r Retirement) Valid() bool { return r >= RetiredAbandoned && r <= RetiredLost }

// String returns "abandoned", "acknowledged", "lost" or "retirement(n)".
func (r Retirement) String() string {
	switch r {
	case RetiredAbandoned:
		return "abandoned"
	case RetiredAcknowledged:
		return "acknowledged"
	case RetiredLost:
		return "lost"
	}
	return fmt.Sprintf("retirement(%d)", uint8(r))
}

// MaxRetiredOutbound bounds the retired outbound entries a delivery store
// keeps: PutRetiredOutbound past it removes the oldest first (by
// RetiredAt, then key). Both stores keep the same bound.
const MaxRetiredOutbound = 1 << 16

// RetiredOutbound is what a sender keeps of a message it no longer holds
// pending (abandoned, or cleared by an ACK): the digest of its body. An
// ACK names only the logical id (the frozen ACK frame), so a late ACK of
// this body would clear whatever is pending under the id by then; the
// sender refuses another body under a retired id (docs/protocol.md,
// commit boundary, "Same logical ID, other body"), and an ACK of an id it
// neither holds pending nor retired is one it lost (a rolled-back store).
// (Recipient, ID) is unique. At rest How, RetiredAt and Digest are sealed
// together as RecordRetiredOutbound with identity
// sealed.MessageIdentity(recipient user, u32be recipient device, id); the
// ids and a time index for pruning stay plaintext. Kept until pruned
// (PruneRetiredOutbound) or pushed out by MaxRetiredOutbound.
type RetiredOutbound struct {
	Recipient messages.DeviceAddress
	ID        messages.LogicalMessageID
	How       Retirement
	// RetiredAt is the client clock at the abandon or the ACK (Unix ms).
	RetiredAt int64
	// Digest is ApplicationMessageDigest v1 of the body (zero for
	// RetiredLost).
	Digest [32]byte
}

// CheckRetiredOutbound validates r as PutRetiredOutbound does and as a
// store checks it on read (a stored entry that fails it is ErrCorrupt).
func CheckRetiredOutbound(r RetiredOutbound) error {
	if err := r.Recipient.Validate(); err != nil {
		return fmt.Errorf("persistence: retired outbound: %w: %w", ErrInvalidRecord, err)
	}
	if !r.How.Valid() {
		return fmt.Errorf("persistence: retired outbound: %s: %w", r.How, ErrInvalidRecord)
	}
	if r.How == RetiredLost && r.Digest != ([32]byte{}) {
		return fmt.Errorf("persistence: retired outbound: a lost entry with a digest: %w", ErrInvalidRecord)
	}
	return nil
}

// UnixMilli converts t to the stored millisecond precision, truncating
// (docs/protocol.md, commit boundary: received_at is whole milliseconds).
func UnixMilli(t time.Time) int64 { return t.UnixMilli() }

// InboundReader is the read side of the commit-boundary records; it is
// part of DeliveryReader.
type InboundReader interface {
	// PendingInbound returns the pending entry of (sender, id).
	PendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (PendingInbound, bool, error)
	// PendingInboundAfter calls fn with the pending entries whose sequence
	// is strictly greater than after, in sequence order, only those of
	// *sender when sender is not nil, until fn returns false or an error
	// (which it returns). fn must not write to the transaction.
	PendingInboundAfter(after uint64, sender *messages.DeviceAddress, fn func(PendingInbound) (bool, error)) error
	// PendingInboundCount returns how many entries are pending, of *sender
	// when sender is not nil, else in total.
	PendingInboundCount(sender *messages.DeviceAddress) (int, error)
	// ProcessedInbound returns the processed entry of (sender, id).
	ProcessedInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (ProcessedInbound, bool, error)
	// ProcessedInboundCount returns how many processed entries are kept.
	ProcessedInboundCount() (int, error)
	// PendingOutbound returns the pending outbound message (recipient, id).
	PendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (PendingOutbound, bool, error)
	// PendingOutboundAfter is PendingInboundAfter for pending outbound
	// messages, filtered by recipient when recipient is not nil.
	PendingOutboundAfter(after uint64, recipient *messages.DeviceAddress, fn func(PendingOutbound) (bool, error)) error
	// PendingOutboundCount returns how many outbound messages are pending.
	PendingOutboundCount() (int, error)
	// RetiredOutbound returns the retired entry of (recipient, id).
	RetiredOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (RetiredOutbound, bool, error)
	// RetiredOutboundCount returns how many retired entries are kept.
	RetiredOutboundCount() (int, error)
	// OutboundSequence returns the highest pending outbound sequence ever
	// assigned (0: none), or the floor RaiseOutboundSequence set, whichever
	// is higher: the number of sends the store accepted. A mark kept
	// outside the store compares it with a copy of it: a store below the
	// mark lost the sends in between (a restored copy).
	OutboundSequence() (uint64, error)
}

// InboundWriter is the write side of the commit-boundary records; it is
// part of DeliveryTx.
type InboundWriter interface {
	// PutPendingInbound stores a new pending entry and returns the
	// sequence assigned to it (the next one, never reused). A second entry
	// for (p.Sender, p.ID) fails with ErrDuplicate; p.Sequence is ignored.
	PutPendingInbound(p PendingInbound) (sequence uint64, err error)
	// CountInboundDelivery records one more hand-off of the pending entry
	// of (sender, id) to the application and returns the new count
	// (PendingInbound.Deliveries); ErrNotFound when it is not pending.
	CountInboundDelivery(sender messages.DeviceAddress, id messages.LogicalMessageID) (uint32, error)
	// DeletePendingInbound removes the pending entry of (sender, id) and
	// reports whether there was one.
	DeletePendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (bool, error)
	// PutProcessedInbound stores a processed entry. An existing entry is
	// never replaced: ErrDuplicate. An invalid Finalization, a Reason
	// outside the closed set on a discarded entry, a missing Digest or a
	// Legacy marker is ErrInvalidRecord (legacy entries come only from
	// LegacyImporter).
	PutProcessedInbound(p ProcessedInbound) error
	// PruneProcessedInbound removes every processed entry whose
	// FinalizedAt ≤ cutoff (Unix ms) and returns how many it removed.
	PruneProcessedInbound(cutoff int64) (int, error)
	// PutPendingOutbound stores a new pending outbound message and returns
	// its sequence; ErrDuplicate when (Recipient, ID) is already pending.
	PutPendingOutbound(p PendingOutbound) (sequence uint64, err error)
	// MarkOutboundAttempt records one more hand-off of a pending outbound
	// message at time at (Unix ms) and returns the new attempt count;
	// ErrNotFound when it is not pending.
	MarkOutboundAttempt(recipient messages.DeviceAddress, id messages.LogicalMessageID, at int64) (uint32, error)
	// DeletePendingOutbound removes a pending outbound message and reports
	// whether there was one.
	DeletePendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (bool, error)
	// PutRetiredOutbound stores (or replaces) the retired entry of
	// (r.Recipient, r.ID); past MaxRetiredOutbound entries it removes the
	// oldest (by RetiredAt, then key) and returns how many. An invalid
	// entry (CheckRetiredOutbound) is ErrInvalidRecord.
	PutRetiredOutbound(r RetiredOutbound) (evicted int, err error)
	// PruneRetiredOutbound removes every retired entry whose RetiredAt ≤
	// cutoff (Unix ms) and returns how many it removed.
	PruneRetiredOutbound(cutoff int64) (int, error)
	// RaiseOutboundSequence raises OutboundSequence to floor when it is
	// below (after a restore: the next send gets a sequence above every
	// one the lost copy assigned, and the loss is not reported again).
	RaiseOutboundSequence(floor uint64) error
}

// LegacyProcessed is a committed entry of an older schema that kept no
// digest, as a migration from that schema hands it to ImportLegacyProcessed.
type LegacyProcessed struct {
	Sender messages.DeviceAddress
	ID     messages.LogicalMessageID
	// FinalizedAt is the commit time to keep (Unix ms); a migration from a
	// schema without one stamps the upgrade time, so the entry gets a full
	// retention period from then on.
	FinalizedAt int64
}

// LegacyImporter is implemented by the delivery stores. It is the one
// writer of the legacy marker (the spec's legacy rule: an entry without
// digest acknowledges any body): a migration from an older schema calls
// it, nothing in the delivery plane does. On bbolt the marker is sealed
// inside the processed entry, so someone who can write the file but lacks
// the storage key cannot turn an entry into a legacy one.
type LegacyImporter interface {
	// ImportLegacyProcessed stores every entry as a committed processed
	// entry without digest, with the legacy marker, in one transaction: an
	// invalid address or an entry that already exists (ErrDuplicate) fails
	// the whole import and writes nothing.
	ImportLegacyProcessed(ctx context.Context, entries []LegacyProcessed) error
}

// CheckLegacyProcessed validates an imported legacy entry and returns the
// processed entry a store keeps for it.
func CheckLegacyProcessed(e LegacyProcessed) (ProcessedInbound, error) {
	if err := e.Sender.Validate(); err != nil {
		return ProcessedInbound{}, fmt.Errorf("persistence: legacy entry: %w: %w", ErrInvalidRecord, err)
	}
	return ProcessedInbound{Sender: e.Sender, ID: e.ID, Finalization: FinalizationCommitted, FinalizedAt: e.FinalizedAt, Legacy: true}, nil
}

// CheckProcessedInbound validates the fields of p a store checks on write
// through PutProcessedInbound: a digest is required and the legacy marker
// refused.
func CheckProcessedInbound(p ProcessedInbound) error {
	if err := checkProcessedFields(p); err != nil {
		return err
	}
	if p.Legacy {
		return fmt.Errorf("persistence: processed entry: the legacy marker is written only by ImportLegacyProcessed: %w", ErrInvalidRecord)
	}
	if p.Digest == nil {
		return fmt.Errorf("persistence: processed entry: no digest: %w", ErrInvalidRecord)
	}
	return nil
}

// CheckStoredProcessed reports whether p, as read back from a store, is
// consistent: the fields PutProcessedInbound checks, and a digest unless
// the entry carries the legacy marker (then no digest and committed). A
// store returns ErrCorrupt for an entry that fails it.
func CheckStoredProcessed(p ProcessedInbound) error {
	if err := checkProcessedFields(p); err != nil {
		return err
	}
	switch {
	case p.Legacy && (p.Digest != nil || p.Finalization != FinalizationCommitted):
		return fmt.Errorf("persistence: processed entry: legacy marker on a %s entry with digest %v: %w", p.Finalization, p.Digest != nil, ErrInvalidRecord)
	case !p.Legacy && p.Digest == nil:
		return fmt.Errorf("persistence: processed entry: no digest and no legacy marker: %w", ErrInvalidRecord)
	}
	return nil
}

func checkProcessedFields(p ProcessedInbound) error {
	if err := p.Sender.Validate(); err != nil {
		return fmt.Errorf("persistence: processed entry: %w: %w", ErrInvalidRecord, err)
	}
	if !p.Finalization.Valid() {
		return fmt.Errorf("persistence: processed entry: %s: %w", p.Finalization, ErrInvalidRecord)
	}
	if p.Finalization == FinalizationDiscarded && !p.Reason.Valid() {
		return fmt.Errorf("persistence: processed entry: %s: %w", p.Reason, ErrInvalidRecord)
	}
	if p.Finalization == FinalizationCommitted && p.Reason != 0 {
		return fmt.Errorf("persistence: processed entry: committed with a discard reason: %w", ErrInvalidRecord)
	}
	return nil
}
