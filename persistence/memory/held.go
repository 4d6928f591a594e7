package memory

import (
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func (t *txn) IsHeld(g persistence.GroupKey, seq uint64) (bool, error) {
	if err := t.check(false); err != nil {
		return false, err
	}
	s, _ := t.st.held.get(g)
	_, ok := slices.BinarySearch(s, seq)
	return ok, nil
}

func (t *txn) HeldUsage(site messages.SiteID) (persistence.HeldUsage, error) {
	if err := t.check(false); err != nil {
		return persistence.HeldUsage{}, err
	}
	u, _ := t.st.heldUsage.get(site)
	return u, nil
}

func (t *txn) addUsage(site messages.SiteID, events int, size int64) {
	u, _ := t.st.heldUsage.get(site)
	u.Events += events
	u.Bytes += size
	if u.Events <= 0 {
		t.st.heldUsage.del(site)
		return
	}
	t.st.heldUsage.put(site, u)
}

func (t *txn) eventSize(seq uint64) int64 {
	if ev, ok := t.st.events.get(seq); ok {
		return int64(len(ev.Raw))
	}
	return 0
}

func (t *txn) HoldEvent(g persistence.GroupKey, seq uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	s, _ := t.st.held.get(g)
	if _, ok := slices.BinarySearch(s, seq); ok {
		return nil
	}
	t.st.held.put(g, insertSorted(s, seq))
	t.addUsage(g.Site, 1, t.eventSize(seq))
	return nil
}

func (t *txn) ReleaseGroup(g persistence.GroupKey) error {
	if err := t.check(true); err != nil {
		return err
	}
	_, err := t.dropHeld(g, false)
	return err
}

func (t *txn) PurgeHeld(g persistence.GroupKey) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	return t.dropHeld(g, true)
}

func (t *txn) dropHeld(g persistence.GroupKey, purge bool) (int, error) {
	seqs, _ := t.st.held.get(g)
	if len(seqs) == 0 {
		return 0, nil
	}
	var size int64
	for _, seq := range seqs {
		size += t.eventSize(seq)
	}
	t.st.held.del(g)
	t.addUsage(g.Site, -len(seqs), -size)
	if purge {
		for _, seq := range seqs {
			t.deleteEvent(seq)
		}
	}
	return len(seqs), nil
}

// deleteEvent removes one event and its index entries (absent: nothing).
func (t *txn) deleteEvent(seq uint64) {
	ev, ok := t.st.events.get(seq)
	if !ok {
		return
	}
	t.st.events.del(seq)
	t.st.ids.del(ev.ID)
	t.st.changeSum(ev, false)
	rid := rowID{ev.Schema, ev.Table, string(ev.RowKey)}
	rs, _ := t.st.rowEvents.get(rid)
	delete(t.ownRow, rid)
	if rs = removeSorted(rs, seq); len(rs) == 0 {
		t.st.rowEvents.del(rid)
	} else {
		t.st.rowEvents.put(rid, rs)
	}
	k := persistence.TableKey{Schema: ev.Schema, Table: ev.Table}
	ts, _ := t.st.tableEvents.get(k)
	delete(t.ownTable, k)
	if ts = removeSorted(ts, seq); len(ts) == 0 {
		t.st.tableEvents.del(k)
	} else {
		t.st.tableEvents.put(k, ts)
	}
}
