package session

import (
	"fmt"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// writes are the storage effects of one decision of a peer actor, as data:
// the decision fills them in, the committer runs them inside its shared
// transaction (run), in this order. Everything in one writes value commits
// or rolls back together: the ratchet step with the pending row it
// produced, the commit with the ACK's ratchet step, the outbound row with
// its encryption.
type writes struct {
	peer messages.DeviceAddress
	id   messages.LogicalMessageID

	// deleteSession drops the stored session record (ResetSession, or an
	// accepted identity change).
	deleteSession bool
	// pin pins this identity for peer (first contact, AcceptIdentity).
	pin *ratchet.IdentityPublic
	// accept is the initiation an envelope was accepted under: applied to
	// the stored prekey store (its one-time prekey consumed, or a
	// last-resort initiation's id recorded), refused when another copy was
	// accepted first (ErrUnknownPrekey, ErrReplay).
	accept *ratchet.AcceptedInitiation
	// session is the new session record (nil: unchanged), base the record
	// its step started from (what is stored once the earlier items of its
	// chain are: a chain stops at its first failed item). The record is
	// stored without its skipped keys, each key being an entry of its own
	// (no step rewrites them all): every item writes the keys its step added or
	// consumed (ratchet.SkippedKeyChanges of base and session), and the
	// record itself is encoded only when no later item of the same
	// transaction writes the peer's record (superseded): one encoding,
	// seal and put per peer and transaction, however many ratchet steps of
	// that peer the transaction holds. Records are immutable values, so
	// reading them there races with nothing.
	session    *ratchet.SessionRecord
	base       ratchet.SessionRecord
	superseded bool

	// putPending stores a new pending inbound entry; the sequence the
	// store assigns goes to slot.
	putPending *persistence.PendingInbound
	slot       *seqSlot
	// maxPending is the global pending cap checked before putPending
	// (0: none).
	maxPending int
	// countDelivery records one more hand-off of the pending entry of
	// (peer, id); the new count goes to deliveries.
	countDelivery bool
	deliveries    uint32
	// deletePending removes the pending entry of (peer, id).
	deletePending bool
	// verifySeq, when not 0, is the sequence of the pending entry the
	// decision was made on without a read transaction (an entry the peer
	// actor remembers): the entry is read inside the item's transaction
	// and must be readable — a record damaged at rest is
	// persistence.ErrCorrupt, never finalized — and still that one.
	verifySeq uint64
	// putProcessed writes the processed entry of (peer, id).
	putProcessed *persistence.ProcessedInbound

	// putOutbound stores a new pending outbound message (sequence to
	// outSlot); markAttempt records one more hand-off of (peer, id) at
	// attemptAt; deleteOutbound clears (peer, id) (ACK or Abandon).
	putOutbound    *persistence.PendingOutbound
	outSlot        *seqSlot
	markAttempt    bool
	attemptAt      int64
	deleteOutbound bool
	// cleared: deleteOutbound found the row (set in the transaction);
	// ackDecides: the ACK's decision is made on it (receiveReq).
	cleared, ackDecides bool
	// checkHeld, when set, is a held receipt's digest to decide on the
	// pending outbound row of (peer, id) inside the transaction; the
	// verdict goes to receipt.
	checkHeld *[32]byte
	receipt   outbound.ReceiptVerdict
	// retire is the retired entry written after deleteOutbound (Abandon,
	// or an ACK decided on a row the actor holds); with ackDecides, the
	// row the delete finds is retired as acknowledged at retireAt. unknownAck: the ACK named an id neither pending nor retired
	// (set in the transaction).
	retire     *persistence.RetiredOutbound
	retireAt   int64
	unknownAck bool
}

// setSession records a step from base to rec. One writes value may hold
// several steps (a receive and its ACK): base stays the first one's.
func (w *writes) setSession(base, rec ratchet.SessionRecord) {
	if w.session == nil {
		w.base = base
	}
	w.session = &rec
}

// loadRecord reads peer's session record and joins the skipped keys
// stored beside it; has is false when there is no record.
func loadRecord(r persistence.DeliveryReader, peer messages.DeviceAddress) (rec ratchet.SessionRecord, has bool, err error) {
	raw, has, err := r.Session(peer)
	if err != nil || !has {
		return rec, has, err
	}
	var keys []ratchet.SkippedKey
	if err := r.SkippedKeys(peer, func(seq uint64, entry []byte) (bool, error) {
		keys = append(keys, ratchet.SkippedKey{Seq: seq, Entry: entry})
		return true, nil
	}); err != nil {
		return rec, false, err
	}
	if rec, err = ratchet.UnmarshalStateWithKeys(raw, keys); err != nil {
		return rec, false, corrupt("session record", err)
	}
	return rec, true, nil
}

// putSkipped writes the skipped keys the step added or changed and deletes
// those it consumed, evicted or expired. After a delete of the session in
// the same writes, everything the record holds is new.
func (w *writes) putSkipped(tx persistence.DeliveryTx) error {
	base := w.base
	if w.deleteSession {
		base = ratchet.SessionRecord{}
	}
	put, del := ratchet.SkippedKeyChanges(base, *w.session)
	for _, seq := range del {
		if err := tx.DeleteSkippedKey(w.peer, seq); err != nil {
			return err
		}
	}
	for _, k := range put {
		if err := tx.PutSkippedKey(w.peer, k.Seq, k.Entry); err != nil {
			return err
		}
	}
	return nil
}

// supersede marks, among items in transaction order, every session record
// write that a later item overwrites for the same peer (the last one
// wins: a delete in between is run all the same and the later put comes
// after it). Called before each attempt of a transaction, since a retry
// runs without the failed items.
func supersede(items []*item) {
	last := map[messages.DeviceAddress]*writes{}
	for _, it := range items {
		w := it.writes
		if w == nil || w.session == nil {
			continue
		}
		if prev := last[w.peer]; prev != nil {
			prev.superseded = true
		}
		w.superseded = false
		last[w.peer] = w
	}
}

// seqSlot receives a store-assigned sequence. It is written by the
// committer's goroutine inside the transaction and read by the item's
// done on the replier goroutine, which receives the commit's answers
// after that (or set before the item is submitted).
type seqSlot struct{ v uint64 }

func (w *writes) run(tx persistence.DeliveryTx, st *Stats) error {
	if w.putPending != nil && w.maxPending > 0 {
		// First, before any write: a refusal leaves nothing of the item.
		n, err := tx.PendingInboundCount(nil)
		if err != nil {
			return err
		}
		if n >= w.maxPending {
			return &inbound.BacklogFullError{Sender: w.peer, Pending: n, Limit: w.maxPending, Global: true}
		}
	}
	if w.verifySeq != 0 {
		p, ok, err := tx.PendingInbound(w.peer, w.id)
		if err != nil {
			return err
		}
		if !ok || p.Sequence != w.verifySeq {
			return fmt.Errorf("%w: the pending entry of %s/%s is not the one its actor remembers", ErrStaleState, w.peer, w.id)
		}
	}
	if w.deleteSession {
		if err := tx.DeleteSession(w.peer); err != nil {
			return err
		}
	}
	if w.pin != nil {
		if err := tx.PutPin(w.peer, *w.pin); err != nil {
			return err
		}
	}
	if w.accept != nil {
		raw, ok, err := tx.Prekeys()
		if err != nil {
			return err
		}
		if !ok {
			return ErrNoIdentity
		}
		ps, err := ratchet.UnmarshalPrekeyStore(raw)
		if err != nil {
			return corrupt("prekeys", err)
		}
		if ps, err = ps.Accept(*w.accept); err != nil {
			return err
		}
		if err := putPrekeys(tx, ps); err != nil {
			return err
		}
	}
	if w.session != nil {
		if err := w.putSkipped(tx); err != nil {
			return err
		}
	}
	if w.session != nil && !w.superseded {
		raw, err := ratchet.MarshalStateWithoutKeys(*w.session)
		if err != nil {
			return err
		}
		if err := tx.PutSession(w.peer, raw); err != nil {
			return err
		}
	}
	if w.putPending != nil {
		seq, err := tx.PutPendingInbound(*w.putPending)
		if err != nil {
			return err
		}
		w.slot.v = seq
	}
	if w.countDelivery {
		n, err := tx.CountInboundDelivery(w.peer, w.id)
		if err != nil {
			return err
		}
		w.deliveries = n
	}
	if w.deletePending {
		if _, err := tx.DeletePendingInbound(w.peer, w.id); err != nil {
			return err
		}
	}
	if p := w.putProcessed; p != nil {
		if err := tx.PutProcessedInbound(*p); err != nil {
			return err
		}
		if p.Finalization == persistence.FinalizationDiscarded {
			st.Discarded++
		} else {
			st.Committed++
		}
	}
	if w.putOutbound != nil {
		if err := checkReuse(tx, w.putOutbound); err != nil {
			return err
		}
		seq, err := tx.PutPendingOutbound(*w.putOutbound)
		if err != nil {
			return err
		}
		w.outSlot.v = seq
		st.OutboundChanged = true
	}
	if w.markAttempt {
		if _, err := tx.MarkOutboundAttempt(w.peer, w.id, w.attemptAt); err != nil {
			return err
		}
		st.OutboundChanged = true
	}
	if w.checkHeld != nil {
		p, ok, err := tx.PendingOutbound(w.peer, w.id)
		if err != nil {
			return err
		}
		var row *persistence.PendingOutbound
		if ok {
			row = &p
		}
		w.receipt = outbound.DecideReceipt(row, *w.checkHeld)
	}
	if w.deleteOutbound {
		if err := w.clearOutbound(tx, st); err != nil {
			return err
		}
	}
	return nil
}

// clearOutbound removes the pending outbound row of (peer, id) and keeps
// its retired entry (docs/protocol.md, commit boundary, "Sender side").
func (w *writes) clearOutbound(tx persistence.DeliveryTx, st *Stats) error {
	if w.ackDecides {
		// The row's body is read in the delete's own transaction: its
		// digest is what a late ACK of this id may only clear again.
		p, ok, err := tx.PendingOutbound(w.peer, w.id)
		if err != nil {
			return err
		}
		if ok {
			w.retire = &persistence.RetiredOutbound{Recipient: w.peer, ID: w.id, How: persistence.RetiredAcknowledged,
				RetiredAt: w.retireAt, Digest: digest.ApplicationMessage(p.Body)}
		} else {
			_, known, err := tx.RetiredOutbound(w.peer, w.id)
			if err != nil {
				return err
			}
			if !known {
				// Remembered, so that a copy of this ACK is not reported
				// again and the id goes to no other body.
				w.unknownAck = true
				if _, err := tx.PutRetiredOutbound(persistence.RetiredOutbound{Recipient: w.peer, ID: w.id,
					How: persistence.RetiredLost, RetiredAt: w.retireAt}); err != nil {
					return err
				}
			}
		}
	}
	had, err := tx.DeletePendingOutbound(w.peer, w.id)
	if err != nil {
		return err
	}
	w.cleared = had
	if had {
		st.Cleared++
		st.OutboundChanged = true
	}
	if w.retire != nil && (had || !w.ackDecides) {
		if _, err := tx.PutRetiredOutbound(*w.retire); err != nil {
			return err
		}
	}
	return nil
}

// checkReuse refuses a new pending row under an id retired with another
// body: the receiver may still finalize the retired body and ACK the id,
// and the ACK would clear this one (docs/protocol.md, commit boundary,
// "Same logical ID, other body"). The same body may go out again.
func checkReuse(tx persistence.DeliveryTx, p *persistence.PendingOutbound) error {
	r, ok, err := tx.RetiredOutbound(p.Recipient, p.ID)
	if err != nil || !ok {
		return err
	}
	if r.How == persistence.RetiredLost || r.Digest != digest.ApplicationMessage(p.Body) {
		return fmt.Errorf("%w: %s/%s was %s with another body", ErrLogicalIDReused, p.Recipient, p.ID, r.How)
	}
	return nil
}
