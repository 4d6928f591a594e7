// Package meshtest starts an in-process syncmesh mesh for tests: N nodes
// on one runtime.Network with injected clocks and seeded faults, every
// node trusting the others, optionally each with a device. It is how
// syncmesh tests itself, exported so applications that extend it (their
// own actors, their own tables) can test the same way:
//
//	m := meshtest.New(t, meshtest.Options{Nodes: 3, Tables: []runtime.TableDef{todos}, Devices: true})
//	m.Node(0).Upsert(ctx, "app", "todos", key, values)
//	m.Partition([]string{"n0"}, []string{"n1", "n2"})
//	...
//	m.Heal()
//	if err := m.WaitConverged(ctx); err != nil { t.Fatal(err) }
//	m.Restart(1) // close and reopen n1's bbolt file
//
// Sync cycles run only when the test asks (SyncRound, WaitConverged), so a
// test driven from a seed replays the same schedule. Nodes keep their data
// in t.TempDir() (bbolt, fsync off) unless Options.InMemory.
package meshtest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/runtime"
)

// Options configure a mesh.
type Options struct {
	// Nodes is the number of nodes (default 3), named n0, n1, ….
	Nodes int
	// Seed seeds the network's faults (default 1).
	Seed uint64
	// Faults are injected from the start (none by default).
	Faults runtime.Faults
	// Tables are defined on every node.
	Tables []runtime.TableDef
	// Devices gives node i the device {User: "n<i>", Device: 1}.
	Devices bool
	// InMemory keeps nodes in memory (a restart then loses nothing and
	// proves nothing about storage); default: bbolt under t.TempDir().
	InMemory bool
	// Links lists who pushes to whom; nil: every node to every other.
	Links [][2]int
	// Configure adjusts node i's configuration before it opens (called
	// again on every restart).
	Configure func(i int, cfg *runtime.Config)
}

// Mesh is a running in-process mesh.
type Mesh struct {
	t     testing.TB
	opts  Options
	net   *runtime.Network
	mu    sync.Mutex
	nodes []*Node
	links [][2]int
}

// Node is one member of the mesh.
type Node struct {
	*runtime.Node
	// Name is the node's network name ("n<i>").
	Name string
	// Clock is the node's injected wall clock.
	Clock *Clock
	// Dir is the node's data directory ("" in memory).
	Dir string
	// Address is the node's device address (zero without Devices).
	Address runtime.DeviceAddress
	up      bool
}

// Clock is an injectable wall clock, safe for concurrent use.
type Clock = actortest.Clock

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return actortest.NewClock(start) }

// MeshID is the mesh id of every meshtest node.
var MeshID = []byte("meshtest")

// New starts the mesh; it is closed by t.Cleanup.
func New(t testing.TB, opts Options) *Mesh {
	t.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	m := &Mesh{t: t, opts: opts, net: runtime.NewNetwork(opts.Seed)}
	m.net.SetFaults(opts.Faults)
	start := time.UnixMilli(1_800_000_000_000)
	for i := 0; i < opts.Nodes; i++ {
		n := &Node{Name: fmt.Sprintf("n%d", i), Clock: NewClock(start)}
		if !opts.InMemory {
			n.Dir = t.TempDir()
		}
		if opts.Devices {
			n.Address = runtime.DeviceAddress{User: n.Name, Device: 1}
		}
		m.nodes = append(m.nodes, n)
	}
	m.links = opts.Links
	if m.links == nil {
		for i := range m.nodes {
			for j := range m.nodes {
				if i != j {
					m.links = append(m.links, [2]int{i, j})
				}
			}
		}
	}
	t.Cleanup(m.Close)
	ctx := context.Background()
	for i := range m.nodes {
		if err := m.open(ctx, i); err != nil {
			t.Fatalf("meshtest: open n%d: %v", i, err)
		}
		for _, def := range opts.Tables {
			if err := m.nodes[i].DefineTable(ctx, def); err != nil {
				t.Fatalf("meshtest: define %s.%s on n%d: %v", def.Schema, def.Table, i, err)
			}
		}
	}
	for i, a := range m.nodes {
		for j, b := range m.nodes {
			if i == j {
				continue
			}
			id := b.Identity()
			if err := a.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
				t.Fatalf("meshtest: trust: %v", err)
			}
		}
	}
	return m
}

func (m *Mesh) open(ctx context.Context, i int) error {
	n := m.nodes[i]
	cfg := runtime.Config{Dir: n.Dir, InMemory: m.opts.InMemory, MeshID: MeshID, Name: n.Name, Wall: n.Clock.Now, SyncInterval: -1, NoSync: true}
	if m.opts.Devices {
		cfg.Device = &runtime.DeviceConfig{Address: n.Address, Transport: m.net.DeviceTransport(n.Name, n.Address), Buffer: 1024}
	}
	if m.opts.Configure != nil {
		m.opts.Configure(i, &cfg)
	}
	node, err := runtime.Open(ctx, cfg)
	if err != nil {
		return err
	}
	for _, l := range m.links {
		var err error
		switch i {
		case l[0]:
			err = node.AddPeer(m.nodes[l[1]].Name, m.net.Transport(n.Name), "", m.peerSite(l[1])...)
		case l[1]:
			// The receiving end accepts the link's sender (only configured
			// senders' pushes are kept).
			err = node.AcceptPeer(m.nodes[l[0]].Name, m.peerSite(l[0])...)
		}
		if err != nil {
			_ = node.Close()
			return err
		}
	}
	m.mu.Lock()
	n.Node, n.up = node, true
	m.mu.Unlock()
	m.net.Register(n.Name, node)
	if m.opts.Devices {
		m.net.RegisterDevice(n.Name, node)
	}
	return nil
}

// Network returns the mesh's network (faults, partitions, byte counts).
func (m *Mesh) Network() *runtime.Network { return m.net }

// Node returns node i.
func (m *Mesh) Node(i int) *Node { return m.nodes[i] }

// Nodes returns every node, in order.
func (m *Mesh) Nodes() []*Node { return append([]*Node(nil), m.nodes...) }

// SetFaults replaces the network's injected faults.
func (m *Mesh) SetFaults(f runtime.Faults) { m.net.SetFaults(f) }

// Partition cuts every link between nodes of different groups (names).
func (m *Mesh) Partition(groups ...[]string) { m.net.Partition(groups...) }

// Heal restores every link.
func (m *Mesh) Heal() { m.net.Heal() }

// Crash takes node i off the network and closes it: storage keeps what
// was committed, in-flight pushes fail, envelopes to it are lost.
func (m *Mesh) Crash(i int) error {
	n := m.nodes[i]
	m.net.Unregister(n.Name)
	if m.opts.Devices {
		m.net.UnregisterDevice(n.Address)
	}
	m.mu.Lock()
	up := n.up
	n.up = false
	m.mu.Unlock()
	if !up {
		return nil
	}
	return n.Node.Close()
}

// Restart crashes node i if it is up and opens it again from its data
// directory, back on the network with its peers.
func (m *Mesh) Restart(i int) error {
	if err := m.Crash(i); err != nil {
		return err
	}
	return m.open(context.Background(), i)
}

// SyncRound runs one push cycle over every link between running nodes
// and reports whether every one was done (nothing offered, nothing left).
func (m *Mesh) SyncRound(ctx context.Context) (bool, error) {
	done := true
	for _, l := range m.links {
		a, b := m.nodes[l[0]], m.nodes[l[1]]
		if !a.up || !b.up {
			done = false
			continue
		}
		rep, err := a.SyncNow(ctx, b.Name, "")
		if err != nil {
			return false, err
		}
		if !rep.Done() || rep.Offered > 0 {
			done = false
		}
	}
	if err := m.net.Flush(ctx); err != nil {
		return false, err
	}
	return done, nil
}

// WaitConverged runs sync rounds until one is done everywhere and every
// running node holds the same tables, or ctx ends.
func (m *Mesh) WaitConverged(ctx context.Context) error {
	for {
		done, err := m.SyncRound(ctx)
		if err != nil {
			return err
		}
		if done {
			var ref string
			same := true
			for i, n := range m.nodes {
				if !n.up {
					continue
				}
				s, err := m.State(ctx, i)
				if err != nil {
					return err
				}
				if ref == "" {
					ref = s
				} else if s != ref {
					same = false
				}
			}
			if same {
				return nil
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("meshtest: not converged: %w", err)
		}
	}
}

// State renders node i's materialized tables canonically: every row (
// deleted ones too) with existence, tombstone and every cell's state,
// value and clock. Equal strings mean equal state.
func (m *Mesh) State(ctx context.Context, i int) (string, error) {
	n := m.nodes[i]
	defs, err := n.Tables(ctx)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, d := range defs {
		fmt.Fprintf(&b, "table %s.%s\n", d.Schema, d.Table)
		for r, err := range n.Rows(ctx, d.Schema, d.Table, runtime.ScanOptions{IncludeDeleted: true}) {
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, " row %x exists=%v existence=%v tomb=%v\n", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
			cols := make([]string, 0, len(r.Cells))
			for c := range r.Cells {
				cols = append(cols, c)
			}
			sort.Strings(cols)
			for _, c := range cols {
				cell := r.Cells[c]
				fmt.Fprintf(&b, "  %s %v %x %v\n", c, cell.State, []byte(cell.Value), cell.Clock)
			}
		}
	}
	return b.String(), nil
}

// Close closes every running node.
func (m *Mesh) Close() {
	for i := range m.nodes {
		_ = m.Crash(i)
	}
}

// peerSite binds node j's site when it is known (it has been opened once).
func (m *Mesh) peerSite(j int) []runtime.PeerOption {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.nodes[j]; n.Node != nil {
		return []runtime.PeerOption{runtime.PeerSite(n.Node.Identity().Site)}
	}
	return nil
}
