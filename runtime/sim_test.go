package runtime

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// simSeeds returns the seeds to simulate: SIM_SEED=n runs exactly that
// one (to reproduce a failure); SIM_SEEDS=k runs k seeds (make soak);
// otherwise a few fixed ones keep the default run short.
func simSeeds(t *testing.T) []uint64 {
	if s := os.Getenv("SIM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SIM_SEED: %v", err)
		}
		return []uint64{v}
	}
	n := 3
	if s := os.Getenv("SIM_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("SIM_SEEDS: %v", err)
		}
		n = v
	}
	seeds := make([]uint64, n)
	base := uint64(time.Now().UnixNano())
	if os.Getenv("SIM_SEEDS") == "" {
		base = 20261130 // fixed in the default run
	}
	for i := range seeds {
		seeds[i] = base + uint64(i)*7919
	}
	return seeds
}

// TestSimulatedMeshConverges is the deterministic simulation of a 5-node
// mesh (SSP/1 §14): random local writes and deletes on every node, random
// partitions, message loss, lost results, duplication, reordering and
// node crash/restart (reopening the bbolt file), driven step by step from
// one seed; then heal. Every node's materialized state and log must be
// identical, and every watermark monotonic throughout (across restarts).
// Reproduce a failure with SIM_SEED=<seed>.
func TestSimulatedMeshConverges(t *testing.T) {
	for _, seed := range simSeeds(t) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			if err := simulate(t, seed, 160); err != nil {
				t.Fatalf("SIM_SEED=%d: %v", seed, err)
			}
		})
	}
}

type simNode struct {
	name string
	dir  string
	wall *wall
	n    *Node
}

func simulate(t *testing.T, seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	names := []string{"n0", "n1", "n2", "n3", "n4"}
	net := NewNetwork(seed)
	net.SetFaults(Faults{Drop: 0.1, DropReply: 0.1, Duplicate: 0.1, Reorder: 0.1})
	ctx := context.Background()
	nodes := map[string]*simNode{}
	open := func(s *simNode) error {
		n, err := Open(ctx, Config{Dir: s.dir, MeshID: testMesh, Name: s.name, Wall: s.wall.Now, SyncInterval: -1, NoSync: true, PushBatch: 16})
		if err != nil {
			return err
		}
		s.n = n
		net.Register(s.name, n)
		for _, p := range names {
			if p != s.name {
				if err := n.AddPeer(p, net.Transport(s.name), ""); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for i, name := range names {
		w := newWall()
		w.Advance(time.Duration(i) * 300 * time.Millisecond) // small skews between nodes
		s := &simNode{name: name, dir: t.TempDir(), wall: w}
		if err := open(s); err != nil {
			return err
		}
		if err := s.n.DefineTable(ctx, defT); err != nil {
			return err
		}
		nodes[name] = s
	}
	defer func() {
		for _, s := range nodes {
			_ = s.n.Close()
		}
	}()
	for _, a := range names {
		for _, b := range names {
			if a != b {
				id := nodes[b].n.Identity()
				if err := nodes[a].n.Trust(ctx, PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
					return err
				}
			}
		}
	}
	seen := map[string]map[GroupKey]uint64{} // highest watermark seen per node
	checkMonotonic := func(s *simNode, step int) error {
		ws, err := s.n.Watermarks(ctx)
		if err != nil {
			return err
		}
		if seen[s.name] == nil {
			seen[s.name] = map[GroupKey]uint64{}
		}
		for _, w := range ws {
			if prev := seen[s.name][w.Group]; uint64(w.HLC) < prev {
				return fmt.Errorf("step %d: %s's watermark of %v went back from %v to %v", step, s.name, w.Group, prev, w.HLC)
			}
			seen[s.name][w.Group] = uint64(w.HLC)
		}
		return nil
	}
	pick := func() *simNode { return nodes[names[rng.IntN(len(names))]] }
	// app.u is defined on nodes one by one, so pushes meet held groups;
	// clocks jump ahead, so pushes meet events rejected for skew.
	defU := TableDef{Schema: "app", Table: "u", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	hasU := map[string]bool{}
	cols := []string{"a", "b", "c"}
	for step := 0; step < steps; step++ {
		switch r := rng.IntN(100); {
		case r < 5: // a write to app.u where it is defined
			s := pick()
			if !hasU[s.name] {
				if err := s.n.DefineTable(ctx, defU); err != nil {
					return err
				}
				hasU[s.name] = true
			}
			if _, err := s.n.Upsert(ctx, "app", "u", map[string]any{"id": rng.IntN(3)}, map[string]any{"v": rng.IntN(10)}); err != nil {
				return fmt.Errorf("step %d: upsert u on %s: %w", step, s.name, err)
			}
		case r < 7: // a clock jumps past the skew bound
			pick().wall.Advance(time.Duration(5+rng.IntN(4)) * time.Minute)
		case r < 35: // local upsert with some explicit nulls
			s := pick()
			vals := map[string]any{}
			for _, c := range cols {
				switch rng.IntN(3) {
				case 0:
					vals[c] = rng.IntN(100)
				case 1:
					vals[c] = nil
				}
			}
			if _, err := s.n.Upsert(ctx, "app", "t", map[string]any{"id": rng.IntN(6)}, vals); err != nil {
				return fmt.Errorf("step %d: upsert on %s: %w", step, s.name, err)
			}
		case r < 45: // local delete
			s := pick()
			if _, err := s.n.Delete(ctx, "app", "t", map[string]any{"id": rng.IntN(6)}); err != nil {
				return fmt.Errorf("step %d: delete on %s: %w", step, s.name, err)
			}
		case r < 85: // one push cycle over a random link
			a, b := pick(), pick()
			if a == b {
				continue
			}
			if _, err := a.n.SyncNow(ctx, b.name, ""); err != nil {
				return fmt.Errorf("step %d: sync %s→%s: %w", step, a.name, b.name, err)
			}
			for _, s := range []*simNode{a, b} {
				if err := checkMonotonic(s, step); err != nil {
					return err
				}
			}
		case r < 89: // partition in two
			var g1, g2 []string
			for _, n := range names {
				if rng.IntN(2) == 0 {
					g1 = append(g1, n)
				} else {
					g2 = append(g2, n)
				}
			}
			net.Partition(g1, g2)
		case r < 93:
			net.Heal()
		case r < 96: // crash and restart: reopen the bbolt file
			s := pick()
			net.Unregister(s.name)
			if err := s.n.Close(); err != nil {
				return fmt.Errorf("step %d: close %s: %w", step, s.name, err)
			}
			if err := open(s); err != nil {
				return fmt.Errorf("step %d: reopen %s: %w", step, s.name, err)
			}
			if err := checkMonotonic(s, step); err != nil {
				return err
			}
		default: // time passes, unevenly
			for _, s := range nodes {
				s.wall.Advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
			}
		}
	}
	net.Heal()
	net.SetFaults(Faults{})
	// Let every clock catch up with the fastest, and define app.u
	// everywhere, so held and rejected events can apply.
	var latest time.Time
	for _, s := range nodes {
		if now := s.wall.Now(); now.After(latest) {
			latest = now
		}
	}
	for _, s := range nodes {
		s.wall.Advance(latest.Sub(s.wall.Now()) + time.Second)
		if !hasU[s.name] {
			if err := s.n.DefineTable(ctx, defU); err != nil {
				return err
			}
		}
	}
	for round := 0; ; round++ {
		if round == 60 {
			return fmt.Errorf("mesh not quiescent after %d rounds of healed sync", round)
		}
		done := true
		for _, a := range names {
			for _, b := range names {
				if a == b {
					continue
				}
				rep, err := nodes[a].n.SyncNow(ctx, b, "")
				if err != nil {
					return err
				}
				if !rep.Done() || rep.Offered > 0 {
					done = false
				}
			}
		}
		for _, s := range nodes {
			if err := checkMonotonic(s, steps+round); err != nil {
				return err
			}
		}
		if done {
			break
		}
	}
	ref := state(t, nodes[names[0]].n)
	refLog := logIDs(t, nodes[names[0]].n)
	for _, name := range names[1:] {
		if s := state(t, nodes[name].n); s != ref {
			return fmt.Errorf("%s's state differs from %s's:\n%s\n---\n%s", name, names[0], s, ref)
		}
		if l := logIDs(t, nodes[name].n); len(l) != len(refLog) {
			return fmt.Errorf("%s holds %d events, %s %d", name, len(l), names[0], len(refLog))
		}
	}
	// After healing, every node's watermark of each writer's group covers
	// every event that writer produced: nothing is left behind.
	for _, w := range names {
		site := nodes[w].n.Identity().Site
		newest := map[GroupKey]uint64{}
		var after uint64
		for {
			es, err := nodes[w].n.Log(ctx, after, 1000)
			if err != nil {
				return err
			}
			if len(es) == 0 {
				break
			}
			for _, e := range es {
				g := GroupKey{Site: e.Site, Schema: e.Schema, Table: e.Table}
				if e.Site == site && uint64(e.HLC) > newest[g] {
					newest[g] = uint64(e.HLC)
				}
				after = e.Seq
			}
		}
		g := GroupKey{Site: site, Schema: "app", Table: "t"}
		for _, r := range names {
			if got := watermarkMap(t, nodes[r].n)[g]; r != w && newest[g] > 0 && got < newest[g] {
				return fmt.Errorf("after healing, %s's watermark of %v is %v, below %s's newest event %v", r, g, got, w, newest[g])
			}
		}
		g = GroupKey{Site: site, Schema: "app", Table: "u"}
		for _, r := range names {
			if got := watermarkMap(t, nodes[r].n)[g]; r != w && newest[g] > 0 && got < newest[g] {
				return fmt.Errorf("after healing, %s's watermark of %v is %v, below %s's newest event %v", r, g, got, w, newest[g])
			}
		}
	}
	return nil
}
