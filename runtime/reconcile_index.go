package runtime

import (
	"bytes"
	"sort"
	"sync"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// keyIndex keeps, per reconciled group, an ordered index of the keys of
// its retained events from its horizon up, with partial LtHash16 sums
// (reconcile.Index: one run per site, a Fenwick tree over leaves of 64 to
// 128 keys), so a reconciliation request reads nothing from the store and
// the count, sum and keys of any range, from any bound, cost O(sites ·
// log n) (a request naming a new bound each time used to make the node
// read and hash the whole table). It is built once, from the store, the
// first time a group is reconciled after Open, and then brought up to
// date from the log by sequence (the events appended since: work the
// node's own writes cause, not a peer's requests); an eviction (a higher
// horizon) removes each site's keys below it. It is checked against the
// store's count from the horizon, kept with the range sums: a difference
// (a purge, anything it did not see) makes it read the group again.
// Memory: at most 88 bytes per retained event of the groups reconciled
// (56 for the key, 32 for the partial sums; reconcile.Index), plus 2 KiB
// per (group, signing site); 120 per event at worst after removals.
// Nothing of it is stored: the bbolt layout is unchanged.
type keyIndex struct {
	mu     sync.RWMutex // views read under RLock; catch-up and rebuilds write
	groups map[reconcile.Group]*groupIndex
	reads  uint64 // events read from the store, for tests and benchmarks
}

type groupIndex struct {
	seq uint64       // the log sequence the index is current to
	h   messages.HLC // the horizon it starts at
	idx *reconcile.Index
}

// maxIndexCatchUp bounds the events read to bring a group up to date;
// past it the group is read again from the table index.
const maxIndexCatchUp = 1 << 16

// view returns a view of the group's keys at or above min (min ≥ the
// horizon h; count of keys from h per the store: want), current to the
// log's last sequence, and the events it read from the store to get
// there (0 when the index was current).
func (x *keyIndex) view(tx persistence.SyncReader, g reconcile.Group, h, min messages.HLC, want uint64) (reconcile.View, uint64, error) {
	last, err := tx.LastSeq()
	if err != nil {
		return nil, 0, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	before := x.reads
	gi := x.groups[g]
	if gi != nil && h > gi.h && gi.seq <= last {
		// An eviction raised the horizon: drop each site's keys below.
		gi.idx.RemoveBelow(h)
		gi.h = h
	}
	if gi != nil && gi.h == h && gi.seq < last && last-gi.seq <= maxIndexCatchUp {
		err := tx.EventsAfter(gi.seq, 0, func(ev persistence.StoredEvent) (bool, error) {
			x.reads++
			if ev.Schema == g.Schema && ev.Table == g.Table && ev.HLC >= h {
				gi.idx.Insert(messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID))
			}
			return true, nil
		})
		if err != nil {
			// The index may hold part of the events: read it again.
			delete(x.groups, g)
			return nil, x.reads - before, err
		}
		gi.seq = last
	}
	if gi == nil || gi.h != h || gi.seq != last || uint64(gi.idx.Len()) != want {
		var keys []reconcile.Key
		t := persistence.TableKey{Schema: g.Schema, Table: g.Table}
		if err := tx.TableEventKeys(t, h, func(k persistence.EventKey) (bool, error) {
			x.reads++
			keys = append(keys, messages.NewReconcileKey(k.Site, k.HLC, k.ID))
			return true, nil
		}); err != nil {
			return nil, x.reads - before, err
		}
		if x.groups == nil {
			x.groups = map[reconcile.Group]*groupIndex{}
		}
		gi = &groupIndex{seq: last, h: h, idx: reconcile.NewIndex(reconcile.NewSet(keys).Keys())}
		x.groups[g] = gi
	}
	return &lockedView{mu: &x.mu, v: gi.idx.View(min)}, x.reads - before, nil
}

// lockedView reads an index under the keyIndex's read lock: a catch-up
// may change the index between two calls (a session then sees the newer
// keys, which costs at most an extra round), never during one. A rebuilt
// group gets a new index; a view of the old one stays valid and stale.
type lockedView struct {
	mu *sync.RWMutex
	v  reconcile.View
}

func (l *lockedView) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.Len()
}

func (l *lockedView) Count(lower, upper []byte) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.Count(lower, upper)
}

func (l *lockedView) Sites(lower, upper []byte) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.Sites(lower, upper)
}

func (l *lockedView) List(lower, upper []byte) []reconcile.Key {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.List(lower, upper)
}

func (l *lockedView) At(lower, upper []byte, i int) reconcile.Key {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.At(lower, upper, i)
}

func (l *lockedView) RangeSum(lower, upper []byte) (uint64, lthash.Sum, int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.RangeSum(lower, upper)
}

func (l *lockedView) Has(k reconcile.Key) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.v.Has(k)
}

// withDropped is a view and a few more keys it does not hold (a peer's
// dropped events, at most 4 096): their sums are expanded per request,
// charged as their count.
type withDropped struct {
	v     reconcile.View
	extra []reconcile.Key // sorted, none in v
}

func (w *withDropped) span(lower, upper []byte) []reconcile.Key {
	i := sort.Search(len(w.extra), func(i int) bool { return bytes.Compare(w.extra[i][:], lower) >= 0 })
	j := len(w.extra)
	if upper != nil {
		j = sort.Search(len(w.extra), func(i int) bool { return bytes.Compare(w.extra[i][:], upper) >= 0 })
	}
	return w.extra[i:max(i, j)]
}

func (w *withDropped) Len() int { return w.v.Len() + len(w.extra) }

func (w *withDropped) Count(lower, upper []byte) int {
	return w.v.Count(lower, upper) + len(w.span(lower, upper))
}

func (w *withDropped) Sites(lower, upper []byte) int {
	n := w.v.Sites(lower, upper)
	e := w.span(lower, upper)
	for i := range e {
		if i > 0 && bytes.Equal(e[i][:16], e[i-1][:16]) {
			continue
		}
		// A site the view holds none of in the range counts once more.
		lo, hi := e[i][:16], siteAfter(e[i][:16])
		if bytes.Compare(lower, lo) > 0 {
			lo = lower
		}
		if hi == nil || (upper != nil && bytes.Compare(upper, hi) < 0) {
			hi = upper
		}
		if w.v.Count(lo, hi) == 0 {
			n++
		}
	}
	return n
}

// siteAfter returns the smallest 16-byte prefix above every key of site
// (nil: none, the site is all ones).
func siteAfter(site []byte) []byte {
	out := bytes.Clone(site)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i]++; out[i] != 0 {
			return out
		}
	}
	return nil
}

func (w *withDropped) List(lower, upper []byte) []reconcile.Key {
	return reconcile.NewSet(append(w.v.List(lower, upper), w.span(lower, upper)...)).Keys()
}

func (w *withDropped) At(lower, upper []byte, i int) reconcile.Key {
	e := w.span(lower, upper)
	// e[j]'s rank in the union is j plus the view's keys below it.
	before := 0
	for j := range e {
		r := j + w.v.Count(lower, e[j][:])
		if r == i {
			return e[j]
		}
		if r > i {
			break
		}
		before = j + 1
	}
	return w.v.At(lower, upper, i-before)
}

func (w *withDropped) RangeSum(lower, upper []byte) (uint64, lthash.Sum, int) {
	n, sum, cost := w.v.RangeSum(lower, upper)
	for _, k := range w.span(lower, upper) {
		sum.Add(k[:])
		n++
		cost++
	}
	return n, sum, cost
}

func (w *withDropped) Has(k reconcile.Key) bool {
	_, ok := sort.Find(len(w.extra), func(i int) int { return bytes.Compare(k[:], w.extra[i][:]) })
	return ok || w.v.Has(k)
}
