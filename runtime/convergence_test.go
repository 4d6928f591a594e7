package runtime

import (
	"context"
	"fmt"
	"sort"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
)

// dumpState renders a node's table as reader-visible state, tombstoned
// rows included, in key order.
func dumpState(t *rapid.T, n *Node) string {
	var rows []string
	err := n.Scan(context.Background(), "app", "t", ScanOptions{IncludeDeleted: true}, func(r Row) bool {
		s := fmt.Sprintf("%x exists=%v ex=%v tomb=%v", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
		names := make([]string, 0, len(r.Cells))
		for c := range r.Cells {
			names = append(names, c)
		}
		sort.Strings(names)
		for _, c := range names {
			cell := r.Cells[c]
			s += fmt.Sprintf(" %s=%v:%x@%v", c, cell.State, []byte(cell.Value), cell.Clock)
		}
		rows = append(rows, s)
		return true
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	out := ""
	for _, r := range rows {
		out += r + "\n"
	}
	return out
}

// SSP/1 §13.5 through the real apply path: random signed event sets from
// three sites (upserts with nulls, deletes, resurrections, unknown
// columns), delivered in random permutations with duplication, singly or
// in batches, to fresh nodes with equal horizons → identical state.
func TestPropertyConvergenceThroughApplyPath(t *testing.T) {
	peers := []*peer{newPeer(t, 1), newPeer(t, 2), newPeer(t, 3)}
	base := newWall().MS()
	rapid.Check(t, func(rt *rapid.T) {
		var horizon messages.HLC
		if rapid.Bool().Draw(rt, "nonzero-horizon") {
			horizon = hlcAt(base, uint16(rapid.IntRange(3, 20).Draw(rt, "horizon")))
		}
		// Events: per-site distinct HLCs (no HLC reuse, §13.5).
		used := map[int]map[int]bool{}
		var raws [][]byte
		for i, n := 0, rapid.IntRange(1, 25).Draw(rt, "events"); i < n; i++ {
			s := rapid.IntRange(0, 2).Draw(rt, "site")
			l := rapid.IntRange(1, 30).Draw(rt, "logical")
			if used[s] == nil {
				used[s] = map[int]bool{}
			}
			if used[s][l] {
				continue
			}
			used[s][l] = true
			id := rapid.IntRange(0, 2).Draw(rt, "row")
			h := hlcAt(base, uint16(l))
			if rapid.IntRange(0, 3).Draw(rt, "op") == 0 {
				raws = append(raws, peers[s].del(h, id))
				continue
			}
			cols := map[string]any{}
			for _, c := range []string{"a", "b", "c", "zz"} {
				switch rapid.IntRange(0, 3).Draw(rt, "cell") {
				case 1:
					cols[c] = nil
				case 2, 3:
					cols[c] = rapid.IntRange(0, 9).Draw(rt, "v")
				}
			}
			raws = append(raws, peers[s].upsert(h, id, cols))
		}
		var want string
		for k := 0; k < 3; k++ {
			n, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, Wall: newWall().Now})
			if err != nil {
				rt.Fatal(err)
			}
			ctx := context.Background()
			if err := n.DefineTable(ctx, defT); err != nil {
				rt.Fatal(err)
			}
			for _, p := range peers {
				if err := n.Trust(ctx, p.key()); err != nil {
					rt.Fatal(err)
				}
			}
			if _, err := n.SetHorizon(ctx, "app", "t", horizon); err != nil {
				rt.Fatal(err)
			}
			delivery := append([][]byte(nil), raws...)
			for d := rapid.IntRange(0, len(raws)).Draw(rt, "dups"); d > 0; d-- {
				delivery = append(delivery, raws[rapid.IntRange(0, len(raws)-1).Draw(rt, "dup")])
			}
			delivery = rapid.Permutation(delivery).Draw(rt, "order")
			for len(delivery) > 0 {
				chunk := rapid.IntRange(1, len(delivery)).Draw(rt, "chunk")
				outs, err := n.ApplySignedBatch(ctx, delivery[:chunk])
				if err != nil {
					rt.Fatal(err)
				}
				for _, o := range outs {
					if o.Kind != messages.Applied && o.Kind != messages.Duplicate {
						rt.Fatalf("unexpected outcome %v", o)
					}
				}
				delivery = delivery[chunk:]
			}
			got := dumpState(rt, n)
			_ = n.Close()
			if k == 0 {
				want = got
			} else if got != want {
				rt.Fatalf("node %d diverged (horizon %v)\nwant:\n%s\ngot:\n%s", k, horizon, want, got)
			}
		}
	})
}
