package runtime

import (
	"bytes"
	"context"
	"os"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
)

// permutations returns every ordering of xs.
func permutations[T any](xs []T) [][]T {
	if len(xs) <= 1 {
		return [][]T{append([]T(nil), xs...)}
	}
	var out [][]T
	for i := range xs {
		rest := append(append([]T(nil), xs[:i]...), xs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]T{xs[i]}, p...))
		}
	}
	return out
}

// Attack: "a site that reuses an HLC forks the mesh". A site —
// hostile, or restored from a stale backup — signs different events with
// one HLC for the same cell, the existence and the tombstone. Every
// victim node that holds the same events must hold the same row whatever
// order they arrived in (SSP/1 §13.5: state is a function of the delivered
// set), and each victim is told which site equivocated and with which
// events, and counts it.
func TestAttackSiteReusingHLCForksMesh(t *testing.T) {
	p := newPeer(t, 1)
	base := newWall().MS()
	h := hlcAt(base, 7)
	raws := [][]byte{
		p.upsert(h, 1, map[string]any{"a": "first", "b": "first"}),
		p.upsert(h, 1, map[string]any{"a": "second", "c": "second"}),
		p.del(h, 1),
	}
	type victim struct {
		n     *testNode
		seen  *notices
		order [][]byte
	}
	var victims []victim
	var want string
	for i, order := range permutations(raws) {
		cfg := Config{}
		if i%2 == 1 {
			cfg.Dir = t.TempDir() // bbolt for half the victims, memory for the rest
		}
		n := openTestNode(t, cfg)
		n.define(defT)
		n.trust(p)
		seen := n.collect()
		for _, raw := range order {
			if out := n.apply(raw); out.Kind != messages.Applied {
				t.Fatalf("victim %d: outcome %v", i, out)
			}
		}
		got := state(t, n.Node)
		if i == 0 {
			want = got
		} else if got != want {
			t.Fatalf("victim %d forked from victim 0 (same events, another order)\nwant:\n%s\ngot:\n%s", i, want, got)
		}
		victims = append(victims, victim{n, seen, order})
	}
	for i, v := range victims {
		if c := counterValue(t, v.n, "syncmesh_sync_equivocations_total"); c != 2 {
			t.Fatalf("victim %d: syncmesh_sync_equivocations_total = %v, want 2 (second and third event)", i, c)
		}
		first, second := eventid.Of(v.order[0]), eventid.Of(v.order[1])
		_, _ = first, second
		v.seen.waitFor(t, "equivocation", func(x messages.Notice) bool { // new-api
			eq, ok := x.(messages.Equivocation)                       // new-api
			return ok && eq.Site == p.signer.Site() && eq.HLC == h && // new-api
				eq.Retained == first && eq.Arrived == second // new-api
		}) // new-api
	}
}

// Attack: "a retired key can rewrite history silently". Events
// at or below a retired key's cutoff stay valid (SSP/1 §12), so whoever
// stole the key can backdate writes over another site's older cells. The
// write cannot be refused on arrival time without making two nodes with
// the same events disagree (§13.5), but the victim must see it: a notice
// naming the key and the event, and a metric — for every event of a
// retired key that first arrives after the retirement, and for no other.
func TestAttackRetiredKeyRewritesHistorySilently(t *testing.T) {
	n := openTestNode(t, Config{Dir: t.TempDir()})
	n.define(defT)
	stolen, honest := newPeer(t, 1), newPeer(t, 2)
	n.trust(stolen)
	n.trust(honest)
	seen := n.collect()
	ms := n.wall.MS()
	before := stolen.upsert(hlcAt(ms, 1), 2, map[string]any{"a": "legit"}) // arrived before retirement
	n.apply(before)
	n.apply(honest.upsert(hlcAt(ms, 5), 1, map[string]any{"a": "honest"}))
	cutoff := hlcAt(ms, 10)
	if err := n.Retire(n.ctx, stolen.key().Kid, cutoff); err != nil {
		t.Fatal(err)
	}
	if out := n.apply(before); out.Kind != messages.Duplicate { // a re-offer of old history: nothing new
		t.Fatalf("redelivery: %v", out)
	}
	backdated := stolen.upsert(hlcAt(ms, 6), 1, map[string]any{"a": "rewritten"}) // ≤ cutoff: valid
	if out := n.apply(backdated); out.Kind != messages.Applied {
		t.Fatalf("backdated: %v", out)
	}
	if c := counterValue(t, n, "syncmesh_sync_retired_key_events_total"); c != 1 {
		t.Fatalf("syncmesh_sync_retired_key_events_total = %v, want 1 (the backdated event only)", c)
	}
	kid := stolen.key().Kid
	_ = seen
	seen.waitFor(t, "retired key event", func(x messages.Notice) bool { // new-api
		r, ok := x.(messages.RetiredKeyEvent)                                                // new-api
		return ok && r.EventID == eventid.Of(backdated) && r.Site == stolen.signer.Site() && // new-api
			bytes.Equal(r.Kid, kid) && r.Cutoff == cutoff && r.HLC == hlcAt(ms, 6) // new-api
	}) // new-api
	_ = kid
}

// Equivocation (SSP/1 §13.5) through the real signed apply path: every case holds a
// random background from three sites plus a forced equivocation — two
// distinct upserts and a delete signed by one site with one HLC for one
// row, the upserts writing the same column (so the cell, the existence
// and the tombstone all tie on (HLC, site)). Nodes on both stores
// receive them in random permutations with duplicates, singly or in
// batches, and must end in the same state, each counting every
// equivocating arrival.
func TestPropertyEquivocationConvergesThroughSignedPath(t *testing.T) {
	peers := []*peer{newPeer(t, 1), newPeer(t, 2), newPeer(t, 3)}
	base := newWall().MS()
	rapid.Check(t, func(rt *rapid.T) {
		var raws [][]byte
		used := map[int]map[int]bool{}
		// The forced equivocation, at a logical time the background avoids.
		s := rapid.IntRange(0, 2).Draw(rt, "eq-site")
		l := rapid.IntRange(1, 30).Draw(rt, "eq-logical")
		used[s] = map[int]bool{l: true}
		h := hlcAt(base, uint16(l))
		row := rapid.IntRange(0, 2).Draw(rt, "eq-row")
		col := rapid.SampledFrom([]string{"a", "b", "c", "zz"}).Draw(rt, "eq-col")
		v1 := rapid.IntRange(0, 9).Draw(rt, "eq-v1")
		v2 := v1 + 1 + rapid.IntRange(0, 8).Draw(rt, "eq-v2")
		forced := [][]byte{
			peers[s].upsert(h, row, map[string]any{col: v1}),
			peers[s].upsert(h, row, map[string]any{col: v2}),
			peers[s].del(h, row),
		}
		raws = append(raws, forced...)
		for i, n := 0, rapid.IntRange(0, 20).Draw(rt, "events"); i < n; i++ {
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
			if rapid.IntRange(0, 3).Draw(rt, "op") == 0 {
				raws = append(raws, peers[s].del(hlcAt(base, uint16(l)), id))
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
			raws = append(raws, peers[s].upsert(hlcAt(base, uint16(l)), id, cols))
		}
		var want string
		for k := 0; k < 3; k++ {
			cfg := Config{InMemory: true, MeshID: testMesh, Wall: newWall().Now, NoSync: true}
			if k == 1 {
				dir, err := os.MkdirTemp("", "h2-equivocation")
				if err != nil {
					rt.Fatal(err)
				}
				defer os.RemoveAll(dir)
				cfg.InMemory, cfg.Dir = false, dir
			}
			n, err := Open(context.Background(), cfg)
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
			eqs := gatherCounter(rt, n, "syncmesh_sync_equivocations_total")
			_ = n.Close()
			if eqs != 2 {
				rt.Fatalf("node %d: %v equivocations counted, want 2 (three events, one stamp)", k, eqs)
			}
			if k == 0 {
				want = got
			} else if got != want {
				rt.Fatalf("node %d diverged\nwant:\n%s\ngot:\n%s", k, want, got)
			}
		}
	})
}

func gatherCounter(t *rapid.T, n *Node, name string) float64 {
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// An equivocating pair held for a missing table is noticed when the
// second is held, and the release materializes it by the same tiebreak as
// a node that had the table all along and got the pair the other way round.
func TestEquivocationHeldThenReleasedConverges(t *testing.T) {
	p := newPeer(t, 1)
	h := hlcAt(newWall().MS(), 3)
	e1 := p.upsert(h, 1, map[string]any{"a": "one"})
	e2 := p.upsert(h, 1, map[string]any{"a": "two"})
	d := p.del(h, 1)

	held := openTestNode(t, Config{Dir: t.TempDir()})
	held.trust(p)
	seen := held.collect()
	for _, raw := range [][]byte{e1, d, e2} {
		if out := held.apply(raw); out.Kind != messages.Held {
			t.Fatalf("before the table: %v", out)
		}
	}
	seen.waitFor(t, "equivocation while held", func(x messages.Notice) bool {
		eq, ok := x.(messages.Equivocation)
		return ok && eq.Retained == eventid.Of(e1) && eq.Arrived == eventid.Of(d)
	})
	held.define(defT)

	direct := openTestNode(t, Config{})
	direct.define(defT)
	direct.trust(p)
	for _, raw := range [][]byte{e2, d, e1} {
		direct.apply(raw)
	}
	if a, b := state(t, held.Node), state(t, direct.Node); a != b {
		t.Fatalf("released node differs\nreleased:\n%s\ndirect:\n%s", a, b)
	}
	if c := counterValue(t, held, "syncmesh_sync_equivocations_total"); c != 2 {
		t.Fatalf("held node counted %v equivocations, want 2", c)
	}
}
