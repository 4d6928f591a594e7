package runtime

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Every metric family of a node with both planes, a peer and a remote
// passes Prometheus' own linter (naming, units, _total on counters, help).
func TestMetricNamesLint(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	alice := openTestNode(t, Config{Name: "alice", MetricsNode: "alice", Registerer: reg, SyncInterval: -1,
		Remote: &RemoteConfig{Plaintext: true},
		Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
	bob := openTestNode(t, Config{Name: "bob", MetricsNode: "bob", Registerer: reg, SyncInterval: -1,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Buffer: 4}})
	for _, n := range []*testNode{alice, bob} {
		net.Register(n.Name(), n.Node)
		net.RegisterDevice(n.Name(), n.Node)
		n.define(defT)
	}
	trustNode(t, bob.Node, alice.Node)
	if err := alice.AddPeer("bob", net.Transport("alice"), ""); err != nil {
		t.Fatal(err)
	}
	upsertN(t, alice.Node, 0, 3, "a")
	if _, err := alice.SyncNow(ctx, "bob", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Send(ctx, bAddr, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) < 15 {
		t.Fatalf("only %d families gathered", len(mfs))
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	// Gauges of the runtime carry a unit.
	for _, mf := range mfs {
		name := mf.GetName()
		// Per-peer series carry the peer's name and its path as two
		// labels, never one packing both ("b@remote").
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if p, ok := labels["peer"]; ok && strings.HasPrefix(name, "syncmesh_sync") {
				if _, hasPath := labels["path"]; !hasPath || strings.Contains(p, "@") {
					t.Errorf("%s: peer label %q, labels %v: want peer and path apart", name, p, labels)
				}
			}
		}
		if mf.GetType().String() != "GAUGE" || !strings.HasPrefix(name, "syncmesh_") {
			continue
		}
		if !hasUnit(name) {
			t.Errorf("gauge %s has no unit suffix", name)
		}
	}
	for _, want := range []string{"syncmesh_sync_pushes_total",
		"syncmesh_delivery_pending_inbound_messages", "syncmesh_delivery_pending_outbound_messages"} {
		found := false
		for _, mf := range mfs {
			found = found || mf.GetName() == want
		}
		if !found {
			t.Errorf("family %s not gathered", want)
		}
	}
}

func hasUnit(name string) bool {
	for _, u := range []string{"_seconds", "_bytes", "_events", "_messages", "_groups", "_timestamp_seconds"} {
		if strings.HasSuffix(name, u) {
			return true
		}
	}
	return false
}

// Two nodes sharing a registry are told apart by Config.MetricsNode; a
// private registry carries the go_ and process_ collectors.
func TestMetricsNodeLabelAndRuntimeCollectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := openTestNode(t, Config{MetricsNode: "a", Registerer: reg})
	b := openTestNode(t, Config{MetricsNode: "b", Registerer: reg})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
	}
	upsertN(t, a.Node, 0, 2, "a")
	upsertN(t, b.Node, 0, 3, "a")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_sync_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					per[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	if per["a"] != 2 || per["b"] != 3 {
		t.Fatalf("events per node: %v", per)
	}
	// Without a Registerer: go_ and process_ families are there.
	p := openTestNode(t, Config{})
	mfs, err = p.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[strings.SplitN(mf.GetName(), "_", 2)[0]] = true
	}
	if !seen["go"] || !seen["process"] && processMetricsSupported() {
		t.Fatalf("families: %v", seen)
	}
}
