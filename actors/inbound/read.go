// Package inbound holds the delivery plane's commit-boundary decisions
// (docs/protocol.md, commit boundary): a received message stays pending (sealed
// frame, persistent sequence, receive time) until the application commits
// or discards it; only then is it acknowledged; processed ids are kept for
// duplicate suppression until the application prunes them.
//
// The decisions are the pure functions of core.go ((stored state of one
// (sender, id), input) → (outcome, effects)). They are made by the actor
// that owns the sender — actors/session's peer actor, which also owns the
// sender's ratchet — and their writes are run by the store's one committer
// in the same transaction as the ratchet step. This file holds the reads,
// which run in read transactions (persistence.DeliveryStore.View).
package inbound

import (
	"bytes"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxPageSize is the largest page of pending messages
// (docs/protocol.md, commit boundary: PendingReceivedMessagePage.MAX_SIZE = 100).
const MaxPageSize = 100

// ReceivedMessage is a message delivered to the application: pending
// until committed or discarded. Sequence and ReceivedAt are the same on
// every redelivery; Plaintext is a copy the caller owns.
type ReceivedMessage struct {
	Sender     messages.DeviceAddress
	ID         messages.LogicalMessageID
	Sequence   uint64
	ReceivedAt time.Time
	Plaintext  []byte
	// Deliveries is the persisted count of hand-offs of the message to
	// the application, this one included (persistence.PendingInbound.Deliveries).
	Deliveries int
}

// Page is one page of pending messages in sequence order. Next is the
// cursor for the following page (the last sequence seen; the request's
// cursor when the page is empty); More reports whether more messages
// follow.
type Page struct {
	Messages []ReceivedMessage
	Next     uint64
	More     bool
}

// ReadState reads what the store holds for (sender, id).
func ReadState(r persistence.DeliveryReader, sender messages.DeviceAddress, id messages.LogicalMessageID) (State, error) {
	var st State
	pr, ok, err := r.ProcessedInbound(sender, id)
	if err != nil {
		return st, err
	}
	if ok {
		st.Processed = &pr
	}
	p, ok, err := r.PendingInbound(sender, id)
	if err != nil {
		return st, err
	}
	if ok {
		st.Pending = &p
	}
	return st, nil
}

// ReadPage reads up to limit pending messages with a sequence greater than
// after, of *sender when it is not nil (limit+1 entries are looked at, to
// know whether more follow). A damaged frame is persistence.ErrCorrupt.
func ReadPage(r persistence.DeliveryReader, after uint64, limit int, sender *messages.DeviceAddress) (Page, error) {
	page := Page{Next: after}
	err := r.PendingInboundAfter(after, sender, func(p persistence.PendingInbound) (bool, error) {
		if len(page.Messages) == limit {
			page.More = true
			return false, nil
		}
		body, err := StoredBody(&p)
		if err != nil {
			return false, err
		}
		page.Messages = append(page.Messages, Message(p, body))
		page.Next = p.Sequence
		return true, nil
	})
	if err != nil {
		return Page{}, err
	}
	return page, nil
}

// Message builds the ReceivedMessage of a pending entry with its body
// (copied: the caller owns it; never nil).
func Message(p persistence.PendingInbound, body []byte) ReceivedMessage {
	b := bytes.Clone(body)
	if b == nil {
		b = []byte{}
	}
	return ReceivedMessage{Sender: p.Sender, ID: p.ID, Sequence: p.Sequence, ReceivedAt: time.UnixMilli(p.ReceivedAt), Plaintext: b,
		Deliveries: int(p.Deliveries)}
}
