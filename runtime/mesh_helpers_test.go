package runtime

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// testMeshNet is a set of nodes on one in-process Network, trusting each
// other, with table defT defined, pushing only when the test says so.
type testMeshNet struct {
	t     *testing.T
	net   *Network
	nodes map[string]*testNode
	cfgs  map[string]Config
	links map[string][]string // sender → peers
	names []string
}

func newTestMesh(t *testing.T, seed uint64, names []string, cfg func(name string) Config) *testMeshNet {
	t.Helper()
	m := &testMeshNet{t: t, net: NewNetwork(seed), nodes: map[string]*testNode{}, cfgs: map[string]Config{}, links: map[string][]string{}, names: names}
	for _, name := range names {
		c := Config{}
		if cfg != nil {
			c = cfg(name)
		}
		c.Name = name
		if c.SyncInterval == 0 {
			// Tests on this mesh drive every exchange by hand and count
			// what each one moved, so reconciliation (which AddPeer and
			// Trust would otherwise trigger in the background) is manual too.
			c.SyncInterval = -1
			if c.ReconcileInterval == 0 {
				c.ReconcileInterval = -1
			}
		}
		m.cfgs[name] = c
		n := openTestNode(t, c)
		n.define(defT)
		m.nodes[name] = n
		m.net.Register(name, n.Node)
	}
	for _, a := range names {
		for _, b := range names {
			if a != b {
				trustNode(t, m.nodes[a].Node, m.nodes[b].Node)
			}
		}
	}
	return m
}

func trustNode(t *testing.T, n, peer *Node) {
	t.Helper()
	id := peer.Identity()
	if err := n.Trust(context.Background(), PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		t.Fatal(err)
	}
}

// link makes a push to b (a's sender over the network); b accepts a's
// pushes, each bound to the other's site.
func (m *testMeshNet) link(a, b string) {
	m.t.Helper()
	if err := m.nodes[a].AddPeer(b, m.net.Transport(a), "", PeerSite(m.nodes[b].Identity().Site)); err != nil {
		m.t.Fatal(err)
	}
	if err := m.nodes[b].AcceptPeer(a, PeerSite(m.nodes[a].Identity().Site)); err != nil {
		m.t.Fatal(err)
	}
	m.links[a] = append(m.links[a], b)
}

func (m *testMeshNet) fullMesh() {
	for _, a := range m.names {
		for _, b := range m.names {
			if a != b {
				m.link(a, b)
			}
		}
	}
}

// syncAll runs push cycles over every link until one whole round reports
// every link done (everything offered, nothing to re-offer).
func (m *testMeshNet) syncAll(maxRounds int) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := 0; round < maxRounds; round++ {
		done := true
		for _, a := range m.names {
			for _, b := range m.links[a] {
				rep, err := m.nodes[a].SyncNow(ctx, b, "")
				if err != nil {
					m.t.Fatalf("SyncNow %s→%s: %v", a, b, err)
				}
				if !rep.Done() || rep.Offered > 0 {
					done = false
				}
			}
		}
		if done {
			return
		}
	}
	m.t.Fatalf("mesh not quiescent after %d rounds", maxRounds)
}

// state renders a node's materialized state of every table canonically:
// rows with existence, tombstone and every cell's state, value and clock.
func state(t *testing.T, n *Node) string {
	t.Helper()
	defs, err := n.Tables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, d := range defs {
		fmt.Fprintf(&b, "table %s.%s\n", d.Schema, d.Table)
		err := n.Scan(context.Background(), d.Schema, d.Table, ScanOptions{IncludeDeleted: true}, func(r Row) bool {
			fmt.Fprintf(&b, " row %x exists=%v existence=%v tomb=%v\n", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
			cols := make([]string, 0, len(r.Cells))
			for c := range r.Cells {
				cols = append(cols, c)
			}
			sort.Strings(cols)
			for _, c := range cols {
				cell := r.Cells[c]
				fmt.Fprintf(&b, "  %s %v %s %v\n", c, cell.State, hex.EncodeToString(cell.Value), cell.Clock)
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// logIDs returns the set of event ids in a node's log.
func logIDs(t *testing.T, n *Node) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	var after uint64
	for {
		es, err := n.Log(context.Background(), after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			return out
		}
		for _, e := range es {
			out[e.ID.String()] = true
			after = e.Seq
		}
	}
}

// watermarkMap returns a node's watermarks by group.
func watermarkMap(t *testing.T, n *Node) map[GroupKey]uint64 {
	t.Helper()
	ws, err := n.Watermarks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[GroupKey]uint64{}
	for _, w := range ws {
		out[w.Group] = uint64(w.HLC)
	}
	return out
}
