package memory

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// msgKey is the identity of a commit-boundary record: (peer, logical id).
type msgKey struct {
	peer messages.DeviceAddress
	id   messages.LogicalMessageID
}

// inboundState holds the commit-boundary records (persistence/inbound.go).
// A committed inboundState is never mutated: the first write of an Update
// copies it (the copy-on-write maps clone only the shards it writes) and
// the commit swaps the pointer, so Views keep a consistent snapshot.
// Stored byte slices are private copies, never handed out.
type inboundState struct {
	pending                         cowMap[msgKey, persistence.PendingInbound]
	processed                       cowMap[msgKey, persistence.ProcessedInbound]
	outbound                        cowMap[msgKey, persistence.PendingOutbound]
	retired                         cowMap[msgKey, persistence.RetiredOutbound]
	nPending, nProcessed, nOutbound int
	nRetired                        int
	lastPendingSeq, lastOutboundSeq uint64
}

// inboundGen numbers the write transactions of the inbound maps.
var inboundGen atomic.Uint64

func newInboundState() *inboundState { return &inboundState{} }

func (s *inboundState) clone() *inboundState {
	c := *s
	g := inboundGen.Add(1)
	c.pending.begin(g)
	c.processed.begin(g)
	c.outbound.begin(g)
	c.retired.begin(g)
	return &c
}

// inRead returns the state a read sees: the staged one, else the committed one.
func (t *deliveryTxn) inRead() *inboundState {
	if t.in != nil {
		return t.in
	}
	return t.d.in
}

// inWrite returns the staged state, cloning the committed one first.
func (t *deliveryTxn) inWrite() *inboundState {
	if t.in == nil {
		t.in = t.d.in.clone()
	}
	return t.in
}

func (t *deliveryTxn) PendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingInbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.PendingInbound{}, false, err
	}
	if err := checkPeer(sender); err != nil {
		return persistence.PendingInbound{}, false, err
	}
	p, ok := t.inRead().pending.get(msgKey{sender, id})
	if !ok {
		return persistence.PendingInbound{}, false, nil
	}
	p.Frame = cloneNonNil(p.Frame)
	return p, true, nil
}

func (t *deliveryTxn) PendingInboundAfter(after uint64, sender *messages.DeviceAddress, fn func(persistence.PendingInbound) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	if sender != nil {
		if err := checkPeer(*sender); err != nil {
			return err
		}
	}
	var list []persistence.PendingInbound
	t.inRead().pending.each(func(_ msgKey, p persistence.PendingInbound) {
		if p.Sequence > after && (sender == nil || p.Sender == *sender) {
			list = append(list, p)
		}
	})
	slices.SortFunc(list, func(a, b persistence.PendingInbound) int { return cmpU64(a.Sequence, b.Sequence) })
	for _, p := range list {
		if err := t.check(false); err != nil {
			return err
		}
		p.Frame = cloneNonNil(p.Frame)
		cont, err := fn(p)
		if err != nil || !cont {
			return err
		}
	}
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cloneNonNil(b []byte) []byte { return append([]byte{}, b...) }

func (t *deliveryTxn) PendingInboundCount(sender *messages.DeviceAddress) (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	s := t.inRead()
	if sender == nil {
		return s.nPending, nil
	}
	if err := checkPeer(*sender); err != nil {
		return 0, err
	}
	n := 0
	s.pending.each(func(k msgKey, _ persistence.PendingInbound) {
		if k.peer == *sender {
			n++
		}
	})
	return n, nil
}

func (t *deliveryTxn) ProcessedInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.ProcessedInbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.ProcessedInbound{}, false, err
	}
	if err := checkPeer(sender); err != nil {
		return persistence.ProcessedInbound{}, false, err
	}
	p, ok := t.inRead().processed.get(msgKey{sender, id})
	if ok && p.Digest != nil {
		d := *p.Digest
		p.Digest = &d
	}
	return p, ok, nil
}

func (t *deliveryTxn) ProcessedInboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.inRead().nProcessed, nil
}

func (t *deliveryTxn) PendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingOutbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.PendingOutbound{}, false, err
	}
	if err := checkPeer(recipient); err != nil {
		return persistence.PendingOutbound{}, false, err
	}
	p, ok := t.inRead().outbound.get(msgKey{recipient, id})
	if !ok {
		return persistence.PendingOutbound{}, false, nil
	}
	p.Body = cloneNonNil(p.Body)
	return p, true, nil
}

func (t *deliveryTxn) PendingOutboundAfter(after uint64, recipient *messages.DeviceAddress, fn func(persistence.PendingOutbound) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	if recipient != nil {
		if err := checkPeer(*recipient); err != nil {
			return err
		}
	}
	var list []persistence.PendingOutbound
	t.inRead().outbound.each(func(_ msgKey, p persistence.PendingOutbound) {
		if p.Sequence > after && (recipient == nil || p.Recipient == *recipient) {
			list = append(list, p)
		}
	})
	slices.SortFunc(list, func(a, b persistence.PendingOutbound) int { return cmpU64(a.Sequence, b.Sequence) })
	for _, p := range list {
		if err := t.check(false); err != nil {
			return err
		}
		p.Body = cloneNonNil(p.Body)
		cont, err := fn(p)
		if err != nil || !cont {
			return err
		}
	}
	return nil
}

func (t *deliveryTxn) PendingOutboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.inRead().nOutbound, nil
}

func (t *deliveryTxn) PutPendingInbound(p persistence.PendingInbound) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(p.Sender); err != nil {
		return 0, err
	}
	k := msgKey{p.Sender, p.ID}
	if _, ok := t.inRead().pending.get(k); ok {
		return 0, fmt.Errorf("memory: pending inbound %s/%s: %w", p.Sender, p.ID, persistence.ErrDuplicate)
	}
	s := t.inWrite()
	s.lastPendingSeq++
	p.Sequence = s.lastPendingSeq
	p.Frame = cloneNonNil(p.Frame)
	s.pending.put(k, p)
	s.nPending++
	return p.Sequence, nil
}

func (t *deliveryTxn) CountInboundDelivery(sender messages.DeviceAddress, id messages.LogicalMessageID) (uint32, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(sender); err != nil {
		return 0, err
	}
	k := msgKey{sender, id}
	p, ok := t.inRead().pending.get(k)
	if !ok {
		return 0, fmt.Errorf("memory: pending inbound %s/%s: %w", sender, id, persistence.ErrNotFound)
	}
	// The stored Frame is never mutated (copy-on-write), so the entry can
	// be put back as is with the new count.
	p.Deliveries++
	t.inWrite().pending.put(k, p)
	return p.Deliveries, nil
}

func (t *deliveryTxn) DeletePendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	if err := t.check(true); err != nil {
		return false, err
	}
	if err := checkPeer(sender); err != nil {
		return false, err
	}
	k := msgKey{sender, id}
	if _, ok := t.inRead().pending.get(k); !ok {
		return false, nil
	}
	s := t.inWrite()
	s.pending.del(k)
	s.nPending--
	return true, nil
}

func (t *deliveryTxn) PutProcessedInbound(p persistence.ProcessedInbound) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := persistence.CheckProcessedInbound(p); err != nil {
		return err
	}
	return t.putProcessed(p)
}

// putProcessed stores a checked processed entry (PutProcessedInbound and
// ImportLegacyProcessed).
func (t *deliveryTxn) putProcessed(p persistence.ProcessedInbound) error {
	k := msgKey{p.Sender, p.ID}
	if _, ok := t.inRead().processed.get(k); ok {
		return fmt.Errorf("memory: processed inbound %s/%s: %w", p.Sender, p.ID, persistence.ErrDuplicate)
	}
	if p.Digest != nil {
		d := *p.Digest
		p.Digest = &d
	}
	s := t.inWrite()
	s.processed.put(k, p)
	s.nProcessed++
	return nil
}

// ImportLegacyProcessed implements persistence.LegacyImporter: the same
// contract as the bbolt store (there the marker is sealed), in one
// transaction.
func (s *DeliveryStore) ImportLegacyProcessed(ctx context.Context, entries []persistence.LegacyProcessed) error {
	return s.Update(ctx, func(ptx persistence.DeliveryTx) error {
		t := ptx.(*deliveryTxn)
		for _, e := range entries {
			p, err := persistence.CheckLegacyProcessed(e)
			if err != nil {
				return err
			}
			if err := t.check(true); err != nil {
				return err
			}
			if err := t.putProcessed(p); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *deliveryTxn) PruneProcessedInbound(cutoff int64) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	var drop []msgKey
	t.inRead().processed.each(func(k msgKey, p persistence.ProcessedInbound) {
		if p.FinalizedAt <= cutoff {
			drop = append(drop, k)
		}
	})
	if len(drop) == 0 {
		return 0, nil
	}
	s := t.inWrite()
	for _, k := range drop {
		s.processed.del(k)
	}
	s.nProcessed -= len(drop)
	return len(drop), nil
}

func (t *deliveryTxn) PutPendingOutbound(p persistence.PendingOutbound) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(p.Recipient); err != nil {
		return 0, err
	}
	k := msgKey{p.Recipient, p.ID}
	if _, ok := t.inRead().outbound.get(k); ok {
		return 0, fmt.Errorf("memory: pending outbound %s/%s: %w", p.Recipient, p.ID, persistence.ErrDuplicate)
	}
	s := t.inWrite()
	s.lastOutboundSeq++
	p.Sequence = s.lastOutboundSeq
	p.Body = cloneNonNil(p.Body)
	s.outbound.put(k, p)
	s.nOutbound++
	return p.Sequence, nil
}

func (t *deliveryTxn) MarkOutboundAttempt(recipient messages.DeviceAddress, id messages.LogicalMessageID, at int64) (uint32, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(recipient); err != nil {
		return 0, err
	}
	k := msgKey{recipient, id}
	p, ok := t.inRead().outbound.get(k)
	if !ok {
		return 0, fmt.Errorf("memory: pending outbound %s/%s: %w", recipient, id, persistence.ErrNotFound)
	}
	p.Attempts++
	p.LastAttemptAt = at
	t.inWrite().outbound.put(k, p)
	return p.Attempts, nil
}

func (t *deliveryTxn) DeletePendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	if err := t.check(true); err != nil {
		return false, err
	}
	if err := checkPeer(recipient); err != nil {
		return false, err
	}
	k := msgKey{recipient, id}
	if _, ok := t.inRead().outbound.get(k); !ok {
		return false, nil
	}
	s := t.inWrite()
	s.outbound.del(k)
	s.nOutbound--
	return true, nil
}
