package reconcile

import (
	"bytes"
	"slices"
	"sort"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// Index is one group's keys, ordered, with partial LtHash16 sums, so the
// count and sum of any range of keys at or above any bound cost
// O(sites · log n) additions of sums and at most a few leaves' worth of
// key expansions, and the keys of a range come out in O(their number).
//
// Layout: one run per signing site (keys are ordered (site, HLC, id), so
// a site's keys are contiguous and "HLC ≥ bound" is a suffix of each run:
// a range from a bound is one slice per run, never a scan). A run holds
// its keys in leaves of LeafKeys to 2·LeafKeys keys, and a Fenwick tree
// over the leaves' sums (2 KiB each). A prefix of a run sums O(log leaves)
// tree nodes plus at most LeafKeys expansions of the keys of the leaf it
// ends in (from whichever end of the leaf is nearer).
//
// Memory: 56 bytes per key, plus one 2 KiB tree node per leaf: at most
// 2048/LeafKeys = 32 bytes per key in leaves that inserts filled, so at
// most 88 bytes per key, and 2 KiB more per (group, site) for a run's
// last, partly filled leaf. A leaf that removals shrink below
// LeafKeys/2 is merged with a neighbour, so the bound holds after
// removals too (up to 2·2048/LeafKeys bytes per key, 120 in all).
//
// Appending at the end of a run (a site's newer events: the common case)
// costs one expansion and O(log leaves) tree updates; an insert or removal
// in the middle costs the same, plus O(leaves of the run) additions of
// sums when a leaf splits or merges (once per LeafKeys/2 changes to it).
// An Index is not safe for concurrent use.
type Index struct {
	runs    []*siteRun // ascending by site
	n       int
	version uint64 // changed by every change: a view's memo is of one version
}

// LeafKeys is the smallest number of keys of a full leaf.
const LeafKeys = 64

type siteRun struct {
	site   [16]byte
	leaves [][]Key      // each sorted and non-empty; ascending across leaves
	start  []int        // start[i]: the keys of the leaves before i; len(leaves)+1
	fen    []lthash.Sum // Fenwick tree over the leaves' sums, 1-based
}

// NewIndex builds the index of keys (sorted ascending, no duplicates).
func NewIndex(keys []Key) *Index {
	x := &Index{}
	for len(keys) > 0 {
		site := keys[0][:16]
		j := sort.Search(len(keys), func(i int) bool { return !bytes.Equal(keys[i][:16], site) })
		x.runs = append(x.runs, newRun(keys[:j]))
		x.n += j
		keys = keys[j:]
	}
	return x
}

func newRun(keys []Key) *siteRun {
	r := &siteRun{}
	copy(r.site[:], keys[0][:16])
	var sums []lthash.Sum
	for len(keys) > 0 {
		n := min(len(keys), 2*LeafKeys)
		if len(keys) > 2*LeafKeys && len(keys)-n < LeafKeys {
			n = len(keys) - LeafKeys
		}
		leaf := slices.Clone(keys[:n])
		r.leaves = append(r.leaves, leaf)
		sums = append(sums, sumOf(leaf))
		keys = keys[n:]
	}
	r.rebuild(sums)
	return r
}

// sumOf expands and adds keys.
func sumOf(keys []Key) lthash.Sum {
	var s lthash.Sum
	for i := range keys {
		s.Add(keys[i][:])
	}
	return s
}

// Len returns the number of keys.
func (x *Index) Len() int { return x.n }

// rebuild sets the tree from the leaves' sums (consumed) and recounts.
func (r *siteRun) rebuild(sums []lthash.Sum) {
	l := len(sums)
	r.fen = make([]lthash.Sum, l+1)
	copy(r.fen[1:], sums)
	for i := 1; i <= l; i++ {
		if p := i + i&-i; p <= l {
			r.fen[p].Combine(&r.fen[i])
		}
	}
	r.start = make([]int, l+1)
	for i, leaf := range r.leaves {
		r.start[i+1] = r.start[i] + len(leaf)
	}
}

// sums returns the leaves' sums (inverting the tree; O(leaves)).
func (r *siteRun) sums() []lthash.Sum {
	s := slices.Clone(r.fen[1:])
	l := len(s)
	for i := l; i >= 1; i-- {
		if p := i + i&-i; p <= l {
			s[p-1].Subtract(&s[i-1])
		}
	}
	return s
}

func (r *siteRun) len() int { return r.start[len(r.leaves)] }

// prefixLeaves returns the sum of leaves [0, i).
func (r *siteRun) prefixLeaves(i int) lthash.Sum {
	var s lthash.Sum
	for ; i > 0; i -= i & -i {
		s.Combine(&r.fen[i])
	}
	return s
}

// update adds (or removes) the element x to leaf i's sum.
func (r *siteRun) update(i int, x *lthash.Element, remove bool) {
	for j := i + 1; j < len(r.fen); j += j & -j {
		if remove {
			r.fen[j].RemoveElement(x)
		} else {
			r.fen[j].AddElement(x)
		}
	}
}

// locate returns the leaf holding rank p and p's offset in it (for p ==
// len: the last leaf and its length).
func (r *siteRun) locate(p int) (leaf, off int) {
	i := sort.Search(len(r.leaves), func(i int) bool { return r.start[i+1] > p })
	if i == len(r.leaves) {
		i--
	}
	return i, p - r.start[i]
}

// rank returns the number of keys of the run below k (a key or a prefix).
func (r *siteRun) rank(k []byte) int {
	i := sort.Search(len(r.leaves), func(i int) bool { return bytes.Compare(r.leaves[i][0][:], k) >= 0 })
	if i == 0 {
		return 0
	}
	leaf := r.leaves[i-1]
	j := sort.Search(len(leaf), func(j int) bool { return bytes.Compare(leaf[j][:], k) >= 0 })
	return r.start[i-1] + j
}

// at returns the key of rank p.
func (r *siteRun) at(p int) Key {
	i, off := r.locate(p)
	return r.leaves[i][off]
}

// prefix returns the sum of the keys of rank below p, and the keys it
// expanded.
func (r *siteRun) prefix(p int) (lthash.Sum, int) {
	if p == 0 {
		return lthash.Sum{}, 0
	}
	i, off := r.locate(p)
	leaf := r.leaves[i]
	if off <= len(leaf)/2 {
		s := r.prefixLeaves(i)
		for k := range leaf[:off] {
			s.Add(leaf[k][:])
		}
		return s, off
	}
	s := r.prefixLeaves(i + 1)
	for k := off; k < len(leaf); k++ {
		s.Remove(leaf[k][:])
	}
	return s, len(leaf) - off
}

// sum returns the sum of the keys of rank [lo, hi), and the keys it
// expanded.
func (r *siteRun) sum(lo, hi int) (lthash.Sum, int) {
	if hi-lo <= LeafKeys {
		var s lthash.Sum
		for p := lo; p < hi; {
			i, off := r.locate(p)
			n := min(len(r.leaves[i])-off, hi-p)
			for _, k := range r.leaves[i][off : off+n] {
				s.Add(k[:])
			}
			p += n
		}
		return s, hi - lo
	}
	s, a := r.prefix(hi)
	l, b := r.prefix(lo)
	s.Subtract(&l)
	return s, a + b
}

// keys appends the keys of rank [lo, hi) to out.
func (r *siteRun) keys(out []Key, lo, hi int) []Key {
	for p := lo; p < hi; {
		i, off := r.locate(p)
		n := min(len(r.leaves[i])-off, hi-p)
		out = append(out, r.leaves[i][off:off+n]...)
		p += n
	}
	return out
}

// leafFor returns the leaf k belongs in: the last whose first key is at
// or below k (the first leaf for a key below every key).
func (r *siteRun) leafFor(k Key) int {
	i := sort.Search(len(r.leaves), func(i int) bool { return bytes.Compare(r.leaves[i][0][:], k[:]) > 0 })
	return max(i-1, 0)
}

// findRun returns the index of the run of k's site, or where it goes.
func (x *Index) findRun(site []byte) (int, bool) {
	i := sort.Search(len(x.runs), func(i int) bool { return bytes.Compare(x.runs[i].site[:], site) >= 0 })
	return i, i < len(x.runs) && bytes.Equal(x.runs[i].site[:], site)
}

// Insert adds k; it reports false if k was already there.
func (x *Index) Insert(k Key) bool {
	ri, ok := x.findRun(k[:16])
	if !ok {
		x.version++
		x.runs = slices.Insert(x.runs, ri, newRun([]Key{k}))
		x.n++
		return true
	}
	r := x.runs[ri]
	i := r.leafFor(k)
	leaf := r.leaves[i]
	j, found := slices.BinarySearchFunc(leaf, k, func(a, b Key) int { return bytes.Compare(a[:], b[:]) })
	if found {
		return false
	}
	x.version++
	r.leaves[i] = slices.Insert(leaf, j, k)
	for p := i + 1; p < len(r.start); p++ {
		r.start[p]++
	}
	var e lthash.Element
	e.Expand(k[:])
	r.update(i, &e, false)
	x.n++
	if len(r.leaves[i]) > 2*LeafKeys {
		r.split(i)
	}
	return true
}

// split divides leaf i in two halves.
func (r *siteRun) split(i int) {
	leaf := r.leaves[i]
	a, b := leaf[:len(leaf)/2:len(leaf)/2], slices.Clone(leaf[len(leaf)/2:])
	sb := sumOf(b)
	if i == len(r.leaves)-1 {
		// The last leaf (appends): move b's sum to a new last leaf, with
		// O(log leaves) tree updates instead of a rebuild.
		for j := i + 1; j < len(r.fen); j += j & -j {
			r.fen[j].Subtract(&sb)
		}
		r.leaves[i] = a
		r.leaves = append(r.leaves, b)
		l := len(r.leaves)
		// fen[l] covers leaves (l - lowbit(l), l]: b's sum plus the
		// leaves (l-lowbit(l), l-1], which are prefix sums' difference.
		node := r.prefixLeaves(l - 1)
		lo := r.prefixLeaves(l - l&-l)
		node.Subtract(&lo)
		node.Combine(&sb)
		r.fen = append(r.fen, node)
		r.start = append(r.start, r.start[l-1])
		r.start[l-1] = r.start[l-2] + len(a)
		return
	}
	sums := r.sums()
	sa := sums[i]
	sa.Subtract(&sb)
	sums[i] = sa
	sums = slices.Insert(sums, i+1, sb)
	r.leaves[i] = a
	r.leaves = slices.Insert(r.leaves, i+1, b)
	r.rebuild(sums)
}

// Remove deletes k; it reports false if k was not there.
func (x *Index) Remove(k Key) bool {
	ri, ok := x.findRun(k[:16])
	if !ok {
		return false
	}
	r := x.runs[ri]
	i := r.leafFor(k)
	leaf := r.leaves[i]
	j, found := slices.BinarySearchFunc(leaf, k, func(a, b Key) int { return bytes.Compare(a[:], b[:]) })
	if !found {
		return false
	}
	x.version++
	var e lthash.Element
	e.Expand(k[:])
	r.update(i, &e, true)
	r.leaves[i] = slices.Delete(leaf, j, j+1)
	for p := i + 1; p < len(r.start); p++ {
		r.start[p]--
	}
	x.n--
	switch {
	case r.len() == 0:
		x.runs = slices.Delete(x.runs, ri, ri+1)
	case len(r.leaves[i]) < LeafKeys/2 && len(r.leaves) > 1:
		r.merge(i)
	}
	return true
}

// merge joins leaf i with a neighbour (and splits the result again if it
// is over full).
func (r *siteRun) merge(i int) {
	sums := r.sums()
	if i == len(r.leaves)-1 {
		i--
	}
	joined := append(slices.Clone(r.leaves[i]), r.leaves[i+1]...)
	s := sums[i]
	s.Combine(&sums[i+1])
	sums[i] = s
	sums = slices.Delete(sums, i+1, i+2)
	r.leaves[i] = joined
	r.leaves = slices.Delete(r.leaves, i+1, i+2)
	r.rebuild(sums)
	if len(joined) > 2*LeafKeys {
		r.split(i)
	}
}

// RemoveBelow deletes every key with an HLC below h (an eviction: a
// prefix of each run) and returns how many it deleted.
func (x *Index) RemoveBelow(h messages.HLC) int {
	x.version++
	removed := 0
	kept := x.runs[:0]
	for _, r := range x.runs {
		var bound [24]byte
		copy(bound[:16], r.site[:])
		putHLC(bound[16:], h)
		p := r.rank(bound[:])
		if p == 0 {
			kept = append(kept, r)
			continue
		}
		removed += p
		if p == r.len() {
			continue
		}
		i, off := r.locate(p)
		sums := r.sums()[i:]
		leaf := slices.Clone(r.leaves[i][off:])
		for _, k := range r.leaves[i][:off] {
			sums[0].Remove(k[:])
		}
		r.leaves = append([][]Key{leaf}, r.leaves[i+1:]...)
		r.rebuild(sums)
		if len(leaf) < LeafKeys/2 && len(r.leaves) > 1 {
			r.merge(0)
		}
		kept = append(kept, r)
	}
	clear(x.runs[len(kept):])
	x.runs = kept
	x.n -= removed
	return removed
}

func putHLC(b []byte, h messages.HLC) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(h)
		h >>= 8
	}
}

// segments calls f with each run's ranks [lo, hi) of the keys in [lower,
// upper) (upper nil: +∞) with an HLC at or above from, in key order.
func (x *Index) segments(from messages.HLC, lower, upper []byte, f func(r *siteRun, lo, hi int) bool) {
	i := 0
	if len(lower) > 0 {
		// The first run with keys at or above lower: a site at or above
		// lower's first 16 bytes.
		i, _ = x.findRun(lower[:min(16, len(lower))])
	}
	for ; i < len(x.runs); i++ {
		r := x.runs[i]
		if upper != nil && bytes.Compare(r.site[:], upper) >= 0 {
			return
		}
		var b [24]byte
		copy(b[:16], r.site[:])
		putHLC(b[16:], from)
		lo := 0
		if from > 0 {
			lo = r.rank(b[:])
		}
		if len(lower) > 0 && bytes.Compare(lower, b[:]) > 0 {
			lo = max(lo, r.rank(lower))
		}
		hi := r.len()
		if upper != nil {
			hi = r.rank(upper)
		}
		if lo < hi && !f(r, lo, hi) {
			return
		}
	}
}

// View returns the index's keys at or above min as a View. The view reads
// the index: it is valid until the index next changes.
func (x *Index) View(min messages.HLC) View { return &indexView{x: x, min: min} }

type indexView struct {
	x   *Index
	min messages.HLC
	// memo keeps the last prefix sums this view computed: the ranges of
	// one round share their cuts (a range's end is the next one's start,
	// and every site's first cut is the bound), so each is expanded once.
	memo map[prefixAt]lthash.Sum
}

type prefixAt struct {
	r       *siteRun
	rank    int
	version uint64
}

// maxMemo bounds a view's memo (2 KiB a prefix).
const maxMemo = 64

// sum is r.sum through the view's memo of prefixes.
func (v *indexView) sum(r *siteRun, lo, hi int) (lthash.Sum, int) {
	if hi-lo <= LeafKeys {
		return r.sum(lo, hi)
	}
	s, a := v.prefix(r, hi)
	l, b := v.prefix(r, lo)
	s.Subtract(&l)
	return s, a + b
}

func (v *indexView) prefix(r *siteRun, p int) (lthash.Sum, int) {
	k := prefixAt{r, p, v.x.version}
	if s, ok := v.memo[k]; ok {
		return s, 0
	}
	s, c := r.prefix(p)
	if v.memo == nil || len(v.memo) == maxMemo {
		v.memo = make(map[prefixAt]lthash.Sum, maxMemo)
	}
	v.memo[k] = s
	return s, c
}

func (v *indexView) Len() int { return v.Count(nil, nil) }

func (v *indexView) Count(lower, upper []byte) int {
	n := 0
	v.x.segments(v.min, lower, upper, func(_ *siteRun, lo, hi int) bool { n += hi - lo; return true })
	return n
}

func (v *indexView) Sites(lower, upper []byte) int {
	n := 0
	v.x.segments(v.min, lower, upper, func(*siteRun, int, int) bool { n++; return true })
	return n
}

func (v *indexView) List(lower, upper []byte) []Key {
	var out []Key
	v.x.segments(v.min, lower, upper, func(r *siteRun, lo, hi int) bool { out = r.keys(out, lo, hi); return true })
	return out
}

func (v *indexView) At(lower, upper []byte, i int) (k Key) {
	v.x.segments(v.min, lower, upper, func(r *siteRun, lo, hi int) bool {
		if i < hi-lo {
			k = r.at(lo + i)
			return false
		}
		i -= hi - lo
		return true
	})
	return k
}

func (v *indexView) RangeSum(lower, upper []byte) (uint64, lthash.Sum, int) {
	var total lthash.Sum
	var n uint64
	cost := 0
	v.x.segments(v.min, lower, upper, func(r *siteRun, lo, hi int) bool {
		s, c := v.sum(r, lo, hi)
		total.Combine(&s)
		n += uint64(hi - lo)
		cost += c + 1
		return true
	})
	return n, total, cost
}

func (v *indexView) Has(k Key) bool {
	if k.HLC() < v.min {
		return false
	}
	ri, ok := v.x.findRun(k[:16])
	if !ok {
		return false
	}
	r := v.x.runs[ri]
	p := r.rank(k[:])
	return p < r.len() && r.at(p) == k
}
