package memory

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// stamp is a (site, HLC) pair: the memory analogue of the prefix of the
// bolt event index keyed by (site, HLC, id).
type stamp struct {
	site messages.SiteID
	hlc  messages.HLC
}

func compareIDs(a, b persistence.EventID) int { return bytes.Compare(a[:], b[:]) }

func (s *state) addStamp(ev persistence.StoredEvent) {
	k := stamp{ev.Site, ev.HLC}
	old, _ := s.stamps.get(k)
	ids := make([]persistence.EventID, 0, len(old)+1) // old is shared with snapshots
	ids = append(ids, old...)
	i, _ := slices.BinarySearchFunc(ids, ev.ID, compareIDs)
	s.stamps.put(k, slices.Insert(ids, i, ev.ID))
}

func (s *state) removeStamp(ev *persistence.StoredEvent) {
	k := stamp{ev.Site, ev.HLC}
	old, _ := s.stamps.get(k)
	ids := slices.DeleteFunc(slices.Clone(old), func(id persistence.EventID) bool { return id == ev.ID })
	if len(ids) == 0 {
		s.stamps.del(k)
		return
	}
	s.stamps.put(k, ids)
}

// EventIDsAt returns the ids of the retained events site signed with HLC
// h, ascending, at most limit (≤ 0: all).
func (t *txn) EventIDsAt(site messages.SiteID, h messages.HLC, limit int) ([]persistence.EventID, error) {
	if err := t.check(false); err != nil {
		return nil, err
	}
	ids, _ := t.st.stamps.get(stamp{site, h})
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	return slices.Clone(ids), nil
}

// SiteEventIDs calls fn for the retained events site signed with an HLC
// in [from, to], in (HLC, id) order. The memory store keeps its stamps in
// a map, so it collects and sorts them first.
func (t *txn) SiteEventIDs(site messages.SiteID, from, to messages.HLC, fn func(messages.HLC, persistence.EventID) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	var keys []stamp
	t.st.stamps.each(func(k stamp, _ []persistence.EventID) {
		if k.site == site && k.hlc >= from && k.hlc <= to {
			keys = append(keys, k)
		}
	})
	slices.SortFunc(keys, func(a, b stamp) int { return cmp.Compare(a.hlc, b.hlc) })
	for _, k := range keys {
		ids, _ := t.st.stamps.get(k)
		for _, id := range ids {
			if more, err := fn(k.hlc, id); err != nil || !more {
				return err
			}
		}
	}
	return nil
}
