package reconcile

import (
	"testing"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// changingSource serves one group from an Index that changes after the
// view's first At: the runtime's index catches up from the log for one
// session between two calls of another's view (runtime lockedView).
type changingSource struct {
	x      *Index
	change func(*Index)
}

func (c *changingSource) Horizon(Group) (messages.HLC, bool, error) { return 0, true, nil }

func (c *changingSource) Keys(Group, messages.HLC) (View, error) {
	return &changingView{View: c.x.View(0), x: c.x, change: c.change}, nil
}

func (c *changingSource) Sum(Group, messages.HLC) (uint64, lthash.Sum, error) {
	n, s, _ := c.x.View(0).RangeSum(nil, nil)
	return n, s, nil
}

type changingView struct {
	View
	x      *Index
	change func(*Index)
	ats    int
}

func (v *changingView) At(lower, upper []byte, i int) Key {
	k := v.View.At(lower, upper, i)
	if v.ats++; v.ats == 1 {
		v.change(v.x)
	}
	return k
}

// TestSplitOfAViewThatChangesBetweenCalls: a responder splitting a range
// while its view changes between the reads of a cut's two keys (an insert
// below the cut makes the second read return the first's key; an
// eviction empties the range) answers with well-formed ranges instead of
// panicking in separator (equal keys) or sending bounds out of order.
func TestSplitOfAViewThatChangesBetweenCalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Index)
	}{
		{"insert below the cut", func(x *Index) { x.Insert(key(1, 1, 1000)) }},
		{"evicted", func(x *Index) { x.RemoveBelow(1 << 20) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys []Key
			for i := 0; i < 20; i++ {
				keys = append(keys, key(1, messages.HLC(100+i), uint64(i)))
			}
			src := &changingSource{change: tc.change}
			for _, sums := range []bool{false, true} {
				src.x = NewIndex(NewSet(keys).Keys())
				in := &messages.Reconcile{SumRanges: sums, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t",
					Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}}
				out, err := Respond(src, in)
				if err != nil {
					t.Fatalf("sums %v: %v", sums, err)
				}
				if err := out.Validate(); err != nil {
					t.Fatalf("sums %v: answer not well-formed: %v", sums, err)
				}
				if len(out.Groups) != 1 || len(out.Groups[0].Ranges) == 0 {
					t.Fatalf("sums %v: answer %+v, want the range split", sums, out.Groups)
				}
			}
		})
	}
}
