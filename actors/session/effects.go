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
	// otpk is the one-time prekey an accepted initiation consumed: it is
	// removed from the stored prekey store (ErrUnknownPrekey when another
	// initiation consumed it first: one-time prekeys are single use).
	otpk *uint32
	// session is the new encoded session record (nil: unchanged).
	session []byte

	// putPending stores a new pending inbound entry; the sequence the
	// store assigns goes to slot.
	putPending *persistence.PendingInbound
	slot       *seqSlot
	// maxPending is the global pending cap checked before putPending
	// (0: none).
	maxPending int
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
	if w.otpk != nil {
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
		if ps, err = ps.ConsumeOneTime(*w.otpk); err != nil {
			return err
		}
		if err := putPrekeys(tx, ps); err != nil {
			return err
		}
	}
	if w.session != nil {
		if err := tx.PutSession(w.peer, w.session); err != nil {
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
