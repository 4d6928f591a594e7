package runtime

import (
	"bytes"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
)

// TestPropertyDroppedKeysViewEqualsTheUnion: a view of the index plus a
// peer's dropped keys (which the store does not hold) answers every
// range's count, sites, keys, key at a rank, sum and membership as the
// sorted union of both does.
func TestPropertyDroppedKeysViewEqualsTheUnion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := func(label string, n int) []reconcile.Key {
			var out []reconcile.Key
			for i := 0; i < n; i++ {
				var site messages.SiteID
				site[0] = byte(rapid.IntRange(1, 4).Draw(t, label+" site"))
				var id messages.EventID
				id[0], id[1] = byte(i), byte(rapid.IntRange(0, 255).Draw(t, label+" id"))
				out = append(out, messages.NewReconcileKey(site, messages.HLC(rapid.IntRange(0, 400).Draw(t, label+" hlc")), id))
			}
			return reconcile.NewSet(out).Keys()
		}
		held := gen("held", rapid.IntRange(0, 300).Draw(t, "n held"))
		var extra []reconcile.Key
		for _, k := range gen("extra", rapid.IntRange(1, 20).Draw(t, "n extra")) {
			if _, ok := slices.BinarySearchFunc(held, k, func(a, b reconcile.Key) int { return bytes.Compare(a[:], b[:]) }); !ok {
				extra = append(extra, k)
			}
		}
		v := &withDropped{v: reconcile.NewIndex(slices.Clone(held)).View(0), extra: extra}
		union := reconcile.NewSet(append(slices.Clone(held), extra...))
		bound := func(label string) []byte {
			if rapid.Bool().Draw(t, label+" nil") || union.Len() == 0 {
				return nil
			}
			k := union.Keys()[rapid.IntRange(0, union.Len()-1).Draw(t, label+" key")]
			return bytes.Clone(k[:rapid.IntRange(1, messages.ReconcileKeySize).Draw(t, label+" cut")])
		}
		lower, upper := bound("lower"), bound("upper")
		if upper != nil && bytes.Compare(lower, upper) >= 0 {
			lower, upper = upper, nil
		}
		want := union.List(lower, upper)
		if got := v.Count(lower, upper); got != len(want) {
			t.Fatalf("Count %d, want %d", got, len(want))
		}
		if got := v.List(lower, upper); !slices.Equal(got, want) {
			t.Fatalf("List: %d keys, want %d", len(got), len(want))
		}
		if got, w := v.Sites(lower, upper), union.Sites(lower, upper); got != w {
			t.Fatalf("Sites %d, want %d", got, w)
		}
		for i := range want {
			if got := v.At(lower, upper, i); got != want[i] {
				t.Fatalf("At %d of %d: %x, want %x", i, len(want), got, want[i])
			}
		}
		n, sum, _ := v.RangeSum(lower, upper)
		wn, wsum, _ := union.RangeSum(lower, upper)
		if n != wn || sum != wsum {
			t.Fatalf("RangeSum: count %d (want %d), sums equal %v", n, wn, sum == wsum)
		}
		for _, k := range union.Keys() {
			if !v.Has(k) {
				t.Fatalf("Has(%x) false", k)
			}
		}
		if v.Len() != union.Len() {
			t.Fatalf("Len %d, want %d", v.Len(), union.Len())
		}
	})
}
