package runtime

import (
	"slices"
	"sync"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// keyIndex keeps, per reconciled group, the sorted keys of its retained
// events from its horizon up, so a reconciliation does not read them from
// the store again: loading them costs a store read and decode per event
// (the bolt table index is in HLC order and names events by sequence),
// which is what a request naming a new bound each time made the node pay.
// It is brought up to date from the log by sequence (the events appended
// since: work the node's own writes cause, not a peer's requests) and
// checked against the store's count from the horizon, kept with the range
// sums; a difference (an eviction, a purge, anything it did not see) makes
// it read the group again. Memory: 56 bytes per retained event of the
// groups reconciled.
type keyIndex struct {
	mu     sync.Mutex
	groups map[reconcile.Group]*groupKeys
	reads  uint64 // events read from the store, for tests and benchmarks
}

type groupKeys struct {
	seq  uint64          // the log sequence the keys are current to
	h    messages.HLC    // the horizon they start at
	keys []reconcile.Key // sorted; never changed in place (readers share it)
}

// maxIndexCatchUp bounds the events read to bring a group up to date;
// past it the group is read again from the table index.
const maxIndexCatchUp = 1 << 16

// keys returns the group's keys at or above the horizon h (count of them
// per the store: want), current to the log's last sequence. The slice is
// shared: callers copy before changing it.
func (x *keyIndex) keys(tx persistence.SyncReader, g reconcile.Group, h messages.HLC, want uint64) ([]reconcile.Key, error) {
	last, err := tx.LastSeq()
	if err != nil {
		return nil, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	t := persistence.TableKey{Schema: g.Schema, Table: g.Table}
	gk := x.groups[g]
	if gk != nil && gk.h == h && gk.seq < last && last-gk.seq <= maxIndexCatchUp {
		var added []reconcile.Key
		err := tx.EventsAfter(gk.seq, 0, func(ev persistence.StoredEvent) (bool, error) {
			x.reads++
			if ev.Schema == g.Schema && ev.Table == g.Table && ev.HLC >= h {
				added = append(added, messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID))
			}
			return true, nil
		})
		if err != nil {
			return nil, err
		}
		if len(added) > 0 {
			merged := make([]reconcile.Key, 0, len(gk.keys)+len(added))
			merged = append(append(merged, gk.keys...), added...)
			gk = &groupKeys{seq: last, h: h, keys: reconcile.NewSet(merged).Keys()}
		} else {
			gk = &groupKeys{seq: last, h: h, keys: gk.keys}
		}
		x.groups[g] = gk
	}
	if gk != nil && gk.h == h && gk.seq == last && uint64(len(gk.keys)) == want {
		return gk.keys, nil
	}
	var keys []reconcile.Key
	if err := tx.TableEventKeys(t, h, func(k persistence.EventKey) (bool, error) {
		x.reads++
		keys = append(keys, messages.NewReconcileKey(k.Site, k.HLC, k.ID))
		return true, nil
	}); err != nil {
		return nil, err
	}
	if x.groups == nil {
		x.groups = map[reconcile.Group]*groupKeys{}
	}
	if gk == nil || gk.seq <= last { // an older snapshot does not replace a newer one
		x.groups[g] = &groupKeys{seq: last, h: h, keys: keys}
	}
	return keys, nil
}

// from returns the keys of keys (sorted) with an HLC at or above min, in a
// new slice the caller owns.
func from(keys []reconcile.Key, min messages.HLC) []reconcile.Key {
	out := make([]reconcile.Key, 0, len(keys))
	for i := range keys {
		if keys[i].HLC() >= min {
			out = append(out, keys[i])
		}
	}
	return slices.Clip(out)
}
