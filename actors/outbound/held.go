package outbound

import (
	"time"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// This file is the sender's side of the held receipt (docs/protocol.md,
// "Held receipt"): the receiver tells, inside the ratchet session, that it
// durably holds a message pending its application's commit. The receipt
// is not an ACK: the message stays pending; the schedule only stops
// resending it on the short schedule and sends it again after
// RetryPolicy.HeldInterval, a safety net, until the ACK clears it.

// DefaultHeldInterval is RetryPolicy.HeldInterval's default: a held
// message is sent again this long after its last attempt or receipt.
const DefaultHeldInterval = 5 * time.Minute

// ReceiptVerdict is what a held receipt resolved to at its sender.
type ReceiptVerdict uint8

// Receipt verdicts: a closed set (the metric's label).
const (
	// ReceiptNone: the envelope was not a held receipt.
	ReceiptNone ReceiptVerdict = iota
	// ReceiptHeld: the receipt names a pending message and the digest of
	// its body: the message is held.
	ReceiptHeld
	// ReceiptStale: no message is pending under the id (its ACK came
	// first, or it was abandoned): nothing changes.
	ReceiptStale
	// ReceiptMismatch: a message is pending under the id but its body's
	// digest is another: the receipt holds another body (the id was
	// reused after an Abandon) and is ignored.
	ReceiptMismatch
)

// String returns the verdict's label: held, stale, mismatch (none for
// ReceiptNone).
func (v ReceiptVerdict) String() string {
	switch v {
	case ReceiptHeld:
		return "held"
	case ReceiptStale:
		return "stale"
	case ReceiptMismatch:
		return "mismatch"
	}
	return "none"
}

// DecideReceipt decides a held receipt naming receipt (an
// ApplicationMessageDigest) against the pending outbound row of its id
// (nil: none is pending). Only ReceiptHeld changes the schedule.
func DecideReceipt(pending *persistence.PendingOutbound, receipt [messages.HeldDigestSize]byte) ReceiptVerdict {
	if pending == nil {
		return ReceiptStale
	}
	if !digest.Equal(digest.ApplicationMessage(pending.Body), receipt) {
		return ReceiptMismatch
	}
	return ReceiptHeld
}

// heldInterval is HeldInterval or its default.
func (p RetryPolicy) heldInterval() time.Duration {
	if p.HeldInterval > 0 {
		return p.HeldInterval
	}
	return DefaultHeldInterval
}

// NextDue returns when a pending message to to under id, tried attempts
// times and last at last, is due again. heldAt is when its last held
// receipt arrived (zero: none): a held message is due HeldInterval after
// the later of its last attempt and the receipt; any other one DelayOf
// after its last attempt. A held message stays held until its ACK clears
// it: the safety-net resend does not make it due on the short schedule
// again (the receiver answers that copy with another receipt).
func (p RetryPolicy) NextDue(to messages.DeviceAddress, id messages.LogicalMessageID, attempts int, last, heldAt time.Time) time.Time {
	if !heldAt.IsZero() {
		from := last
		if heldAt.After(from) {
			from = heldAt
		}
		return from.Add(p.heldInterval())
	}
	return last.Add(p.DelayOf(to, id, attempts))
}

// maxHeldMarks bounds the held receipts an Outbox remembers (a mark is
// made only for a pending row whose digest matched, and a pass drops the
// marks of rows no longer pending: the bound matters only with more
// pending messages than this). Past it a receipt changes nothing and the
// message keeps the short schedule.
const maxHeldMarks = 1 << 16

// Held records that the receiver of (to, id) holds it pending (a held
// receipt whose verdict was ReceiptHeld, at the client clock): the retry
// schedule sends it again only after RetryPolicy.HeldInterval. Kept in
// memory: after a restart the message is resent once on the short
// schedule, and the receiver's receipt for that copy holds it again.
func (o *Outbox) Held(to messages.DeviceAddress, id messages.LogicalMessageID) {
	now := o.cfg.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	k := msgKey{to, id}
	if _, ok := o.held[k]; !ok && len(o.held) >= maxHeldMarks {
		return
	}
	o.held[k] = now
}

// HeldCount returns how many pending messages are held by their receiver
// (as far as this process has seen receipts).
func (o *Outbox) HeldCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.held)
}
