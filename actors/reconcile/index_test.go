package reconcile

import (
	"bytes"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// refView is what an Index view must equal: the scan of a sorted slice.
type refView struct {
	keys []Key // sorted
	min  messages.HLC
	exp  map[Key]*lthash.Element
}

func (r *refView) span(lower, upper []byte) []Key {
	var out []Key
	for _, k := range r.keys {
		if k.HLC() >= r.min && bytes.Compare(k[:], lower) >= 0 && (upper == nil || bytes.Compare(k[:], upper) < 0) {
			out = append(out, k)
		}
	}
	return out
}

func (r *refView) sum(keys []Key) lthash.Sum {
	var s lthash.Sum
	for _, k := range keys {
		e := r.exp[k]
		if e == nil {
			e = new(lthash.Element)
			e.Expand(k[:])
			r.exp[k] = e
		}
		s.AddElement(e)
	}
	return s
}

// genBound draws a range bound: nil (+∞ or -∞), a prefix of a held key,
// or a key of its own, cut anywhere.
func genBound(t *rapid.T, keys []Key, label string) []byte {
	switch rapid.IntRange(0, 3).Draw(t, label+" kind") {
	case 0:
		return nil
	case 1:
		if len(keys) > 0 {
			k := keys[rapid.IntRange(0, len(keys)-1).Draw(t, label+" key")]
			return bytes.Clone(k[:rapid.IntRange(1, messages.ReconcileKeySize).Draw(t, label+" cut")])
		}
	}
	k := key(byte(rapid.IntRange(0, 4).Draw(t, label+" site")), messages.HLC(rapid.IntRange(0, 3000).Draw(t, label+" hlc")), 0)
	return bytes.Clone(k[:rapid.IntRange(1, messages.ReconcileKeySize).Draw(t, label+" cut")])
}

// TestPropertyIndexEqualsTheScan: under random inserts (at the end of a
// site's run and in its middle), removals, evictions below an HLC and
// rebuilds, every view of the index (any bound) answers every range's
// count, sites, keys, key at a rank, LtHash16 sum and membership exactly
// as a scan of the sorted keys does — across leaf splits and merges.
func TestPropertyIndexEqualsTheScan(t *testing.T) {
	exp := map[Key]*lthash.Element{}
	rapid.Check(t, func(t *rapid.T) {
		var held []Key
		next := map[byte]messages.HLC{}
		n := rapid.IntRange(0, 3*LeafKeys).Draw(t, "initial")
		for i := 0; i < n; i++ {
			site := byte(rapid.IntRange(1, 3).Draw(t, "site"))
			next[site] += messages.HLC(rapid.IntRange(1, 5).Draw(t, "step"))
			held = append(held, key(site, next[site], uint64(i)))
		}
		held = NewSet(held).Keys()
		x := NewIndex(slices.Clone(held))
		ops := rapid.IntRange(1, 60).Draw(t, "ops")
		id := uint64(1 << 20)
		for op := 0; op < ops; op++ {
			switch rapid.IntRange(0, 9).Draw(t, "op") {
			case 0, 1, 2, 3: // a burst of appends at a site's end (splits the last leaf)
				site := byte(rapid.IntRange(1, 4).Draw(t, "site"))
				for j := rapid.IntRange(1, 2*LeafKeys+1).Draw(t, "burst"); j > 0; j-- {
					next[site] += 1
					id++
					k := key(site, next[site]+1000, id)
					if !x.Insert(k) {
						t.Fatalf("insert of a new key reported present")
					}
					held = append(held, k)
				}
			case 4, 5: // inserts in the middle of runs (splits inner leaves)
				for j := rapid.IntRange(1, 2*LeafKeys+1).Draw(t, "burst"); j > 0; j-- {
					id++
					k := key(byte(rapid.IntRange(1, 4).Draw(t, "site")), messages.HLC(rapid.IntRange(0, 1500).Draw(t, "hlc")), id)
					if !x.Insert(k) {
						t.Fatalf("insert of a new key reported present")
					}
					held = append(held, k)
				}
			case 6: // a duplicate insert changes nothing
				if len(held) > 0 {
					if x.Insert(held[rapid.IntRange(0, len(held)-1).Draw(t, "dup")]) {
						t.Fatalf("duplicate insert reported new")
					}
				}
			case 7: // removals (a purge; merges small leaves)
				for j := rapid.IntRange(1, LeafKeys).Draw(t, "removals"); j > 0 && len(held) > 0; j-- {
					i := rapid.IntRange(0, len(held)-1).Draw(t, "victim")
					if !x.Remove(held[i]) {
						t.Fatalf("removal of a held key reported absent")
					}
					held = slices.Delete(held, i, i+1)
				}
				if x.Remove(key(9, 1, 1)) {
					t.Fatalf("removal of an absent key reported present")
				}
			case 8: // an eviction below an HLC
				h := messages.HLC(rapid.IntRange(0, 1500).Draw(t, "horizon"))
				kept := held[:0]
				for _, k := range held {
					if k.HLC() >= h {
						kept = append(kept, k)
					}
				}
				want := len(held) - len(kept)
				held = kept
				if got := x.RemoveBelow(h); got != want {
					t.Fatalf("RemoveBelow(%d) removed %d, want %d", h, got, want)
				}
			case 9: // a rebuild from the keys
				x = NewIndex(NewSet(slices.Clone(held)).Keys())
			}
			held = NewSet(held).Keys()
			if x.Len() != len(held) {
				t.Fatalf("Len %d, want %d", x.Len(), len(held))
			}
			checkView(t, x, held, exp)
		}
	})
}

func checkView(t *rapid.T, x *Index, held []Key, exp map[Key]*lthash.Element) {
	min := messages.HLC(0)
	if rapid.Bool().Draw(t, "bounded") {
		min = messages.HLC(rapid.IntRange(0, 2500).Draw(t, "min"))
	}
	ref := &refView{keys: held, min: min, exp: exp}
	v := x.View(min)
	lower, upper := genBound(t, held, "lower"), genBound(t, held, "upper")
	if upper != nil && bytes.Compare(lower, upper) >= 0 {
		lower, upper = upper, lower
		if upper != nil && bytes.Equal(lower, upper) {
			upper = nil
		}
	}
	want := ref.span(lower, upper)
	if got := v.Count(lower, upper); got != len(want) {
		t.Fatalf("Count [%x, %x) from %d: %d, want %d", lower, upper, min, got, len(want))
	}
	if got := v.List(lower, upper); !slices.Equal(got, want) {
		t.Fatalf("List [%x, %x) from %d: %d keys, want %d", lower, upper, min, len(got), len(want))
	}
	if got, w := v.Sites(lower, upper), (&Set{keys: want}).Sites(nil, nil); got != w {
		t.Fatalf("Sites: %d, want %d", got, w)
	}
	if len(want) > 0 {
		i := rapid.IntRange(0, len(want)-1).Draw(t, "rank")
		if got := v.At(lower, upper, i); got != want[i] {
			t.Fatalf("At %d: %x, want %x", i, got, want[i])
		}
		k := want[rapid.IntRange(0, len(want)-1).Draw(t, "member")]
		if !v.Has(k) {
			t.Fatalf("Has(%x) false for a key in the view", k)
		}
	}
	for _, k := range held {
		if k.HLC() < min {
			if v.Has(k) {
				t.Fatalf("Has(%x) true below the view's bound %d", k, min)
			}
			break
		}
	}
	n, sum, _ := v.RangeSum(lower, upper)
	if ws := ref.sum(want); n != uint64(len(want)) || sum != ws {
		t.Fatalf("RangeSum [%x, %x) from %d: count %d (want %d), sums equal %v", lower, upper, min, n, len(want), sum == ws)
	}
	if len(want) > 1 {
		// The same view again, over a part (its memo of prefixes).
		cut := want[rapid.IntRange(1, len(want)-1).Draw(t, "cut")]
		n2, sum2, _ := v.RangeSum(lower, cut[:])
		part := ref.span(lower, cut[:])
		if ws := ref.sum(part); n2 != uint64(len(part)) || sum2 != ws {
			t.Fatalf("second RangeSum of the view: count %d (want %d), sums equal %v", n2, len(part), sum2 == ws)
		}
	}
	if x.Len() > 0 && min == 0 && lower == nil && upper == nil {
		// The whole view's fingerprint is the group's range sum's.
		c, s := (&Set{keys: held}).Sum()
		if SumFingerprint(n, &sum) != SumFingerprint(c, &s) {
			t.Fatalf("whole-group sum differs from the set's")
		}
	}
}

// TestIndexRangeSumCostIsBounded: a range sum of any range costs a few
// leaves' expansions per site, whatever the range's size — not a pass.
func TestIndexRangeSumCostIsBounded(t *testing.T) {
	var keys []Key
	for i := 0; i < 40*LeafKeys; i++ {
		keys = append(keys, key(byte(1+i%3), messages.HLC(10+i), uint64(i)))
	}
	x := NewIndex(NewSet(keys).Keys())
	for _, min := range []messages.HLC{0, 11, 777, 1500} {
		v := x.View(min)
		for _, r := range [][2][]byte{{nil, nil}, {keys[5][:20], nil}, {keys[100][:3], keys[2000][:30]}} {
			n, _, cost := v.RangeSum(r[0], r[1])
			// Per site: two prefixes, each at most half a full leaf
			// (LeafKeys) of expansions, plus one for the visit.
			if limit := 3 * (2*LeafKeys + 1); cost > limit {
				t.Errorf("from %d, [%x, %x): %d keys cost %d expansions, want ≤ %d", min, r[0], r[1], n, cost, limit)
			}
		}
	}
}
