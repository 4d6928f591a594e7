package memory

import (
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// sumKey names one range sum: a table's events signed by one site.
type sumKey struct {
	t    persistence.TableKey
	site messages.SiteID
}

// changeSum adds ev's key to (or removes it from) its (table, site) sum,
// in the transaction that appends or deletes ev, as the bolt store does.
// Committed sums are immutable: a change stores a new copy.
func (s *state) changeSum(ev *persistence.StoredEvent, add bool) {
	s.resolveSums() // a removal must find the prepared additions made
	k := sumKey{persistence.TableKey{Schema: ev.Schema, Table: ev.Table}, ev.Site}
	var r persistence.RangeSum
	if old, ok := s.sums.get(k); ok {
		r = *old
	}
	key := persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID}
	if add {
		r.Add(key)
	} else {
		r.Remove(key)
	}
	if r.Count == 0 {
		s.sums.del(k)
		return
	}
	s.sums.put(k, &r)
}

// resolveSums adds the prepared shares of the events appended so far
// (persistence.PreparedSums) to the sums.
func (s *state) resolveSums() {
	s.psums.Resolve(func(tk persistence.TableKey, site messages.SiteID, count int64, sum *lthash.Sum) {
		k := sumKey{tk, site}
		var r persistence.RangeSum
		if old, ok := s.sums.get(k); ok {
			r = *old
		}
		r.Count += uint64(count)
		r.Sum.Combine(sum)
		s.sums.put(k, &r)
	})
}

// TableEventSum returns the sum of the keys TableEventKeys lists from
// min: the table's per-site sums less its retained events below min.
func (t *txn) TableEventSum(k persistence.TableKey, min messages.HLC) (persistence.RangeSum, error) {
	var total persistence.RangeSum
	if err := t.check(false); err != nil {
		return total, err
	}
	t.st.resolveSums()
	t.st.sums.each(func(sk sumKey, r *persistence.RangeSum) {
		if sk.t == k {
			total.Combine(r)
		}
	})
	if min == 0 {
		return total, nil
	}
	seqs, _ := t.st.tableEvents.get(k)
	for _, seq := range seqs {
		ev, ok := t.st.events.get(seq)
		if !ok {
			return total, fmt.Errorf("memory: table index points at missing seq %d: %w", seq, persistence.ErrCorrupt)
		}
		if ev.HLC < min {
			total.Remove(persistence.EventKey{Site: ev.Site, HLC: ev.HLC, ID: ev.ID})
		}
	}
	return total, nil
}
