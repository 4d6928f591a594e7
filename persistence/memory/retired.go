package memory

import (
	"cmp"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func (t *deliveryTxn) RetiredOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (persistence.RetiredOutbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.RetiredOutbound{}, false, err
	}
	if err := checkPeer(recipient); err != nil {
		return persistence.RetiredOutbound{}, false, err
	}
	r, ok := t.inRead().retired.get(msgKey{recipient, id})
	return r, ok, nil
}

func (t *deliveryTxn) RetiredOutboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.inRead().nRetired, nil
}

func (t *deliveryTxn) PutRetiredOutbound(r persistence.RetiredOutbound) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := persistence.CheckRetiredOutbound(r); err != nil {
		return 0, err
	}
	k := msgKey{r.Recipient, r.ID}
	_, had := t.inRead().retired.get(k)
	s := t.inWrite()
	s.retired.put(k, r)
	if !had {
		s.nRetired++
	}
	if s.nRetired <= persistence.MaxRetiredOutbound {
		return 0, nil
	}
	return t.dropRetired(s.nRetired-persistence.MaxRetiredOutbound, nil), nil
}

func (t *deliveryTxn) PruneRetiredOutbound(cutoff int64) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	return t.dropRetired(-1, &cutoff), nil
}

// dropRetired removes the oldest retired entries (by RetiredAt, then the
// bolt store's key order: user, device, id): at most limit
// of them (-1: no limit), only those at or before *cutoff when it is set.
func (t *deliveryTxn) dropRetired(limit int, cutoff *int64) int {
	var all []persistence.RetiredOutbound
	t.inRead().retired.each(func(_ msgKey, r persistence.RetiredOutbound) {
		if cutoff == nil || r.RetiredAt <= *cutoff {
			all = append(all, r)
		}
	})
	slices.SortFunc(all, func(a, b persistence.RetiredOutbound) int {
		return cmp.Or(cmp.Compare(a.RetiredAt, b.RetiredAt), cmp.Compare(a.Recipient.User, b.Recipient.User), cmp.Compare(a.Recipient.Device, b.Recipient.Device),
			slices.Compare(a.ID[:], b.ID[:]))
	})
	if limit >= 0 && len(all) > limit {
		all = all[:limit]
	}
	if len(all) == 0 {
		return 0
	}
	s := t.inWrite()
	for _, r := range all {
		s.retired.del(msgKey{r.Recipient, r.ID})
	}
	s.nRetired -= len(all)
	return len(all)
}

func (t *deliveryTxn) OutboundSequence() (uint64, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.inRead().lastOutboundSeq, nil
}

func (t *deliveryTxn) RaiseOutboundSequence(floor uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	if floor > t.inRead().lastOutboundSeq {
		t.inWrite().lastOutboundSeq = floor
	}
	return nil
}
