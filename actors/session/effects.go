package session

import (
	"github.com/syncmesh/syncmesh/actors/inbound"
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
	// session is the new session record (nil: unchanged). It is encoded
	// in the committer's transaction, and only when no later item of the
	// same transaction writes the peer's record (superseded): one
	// encoding, seal and put per peer and transaction, however many
	// ratchet steps of that peer the transaction holds. Records are
	// immutable values, so reading it there races with nothing.
	session    *ratchet.SessionRecord
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
}

func (w *writes) setSession(rec ratchet.SessionRecord) { w.session = &rec }

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
// committer's goroutine inside the transaction and read there by the
// item's done (or set before the item is submitted).
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
	if w.session != nil && !w.superseded {
		raw, err := ratchet.MarshalState(*w.session)
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
	if w.deleteOutbound {
		had, err := tx.DeletePendingOutbound(w.peer, w.id)
		if err != nil {
			return err
		}
		if had {
			st.Cleared++
		}
		st.OutboundChanged = true
	}
	return nil
}
