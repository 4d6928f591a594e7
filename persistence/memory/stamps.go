package memory

import (
	"bytes"
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
