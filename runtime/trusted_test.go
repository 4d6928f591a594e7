package runtime

import (
	"context"
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// Config.Trusted is in the keyring when Open returns — with a remote
// already listening — so the first push of a configured peer applies in
// full: nothing is dropped for an unknown kid, and the keys persist.
func TestConfigTrustedAppliedBeforeServing(t *testing.T) {
	ctx := context.Background()
	a := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	a.define(defT)
	upsertN(t, a.Node, 0, 50, "a")
	ka := PeerKey{Site: a.Identity().Site, PublicKey: a.Identity().PublicKey} // kid derived
	dir := t.TempDir()
	b, err := Open(ctx, Config{Dir: dir, NoSync: true, MeshID: testMesh, Name: "b", SyncInterval: -1, Wall: a.wall.Now,
		Trusted: []PeerKey{ka}, Remote: &RemoteConfig{Plaintext: true}})
	if err != nil {
		t.Fatal(err)
	}
	tb := &testNode{Node: b, t: t, ctx: ctx}
	tb.define(defT)
	net := NewNetwork(1)
	net.Register("b", b)
	if err := b.AcceptPeer("a"); err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	rep, err := a.SyncNow(ctx, "b", "")
	if err != nil || rep.Err != nil {
		t.Fatalf("sync: %v %v", err, rep.Err)
	}
	if dropped := outcomeCount(t, tb, "dropped"); dropped != 0 {
		t.Fatalf("%v events dropped on the first push", dropped)
	}
	if got := outcomeCount(t, tb, "applied"); got != 50 {
		t.Fatalf("%v events applied, want 50", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopened without Trusted: the key stayed in the keyring.
	b, err = Open(ctx, Config{Dir: dir, NoSync: true, MeshID: testMesh, Wall: a.wall.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	found := false
	for _, k := range b.TrustedKeys() {
		found = found || k.Site == ka.Site
	}
	if !found {
		t.Fatal("Config.Trusted key not persisted")
	}
	if r, ok, err := b.Get(ctx, "app", "t", map[string]any{"id": 49}); err != nil || !ok || !r.Exists {
		t.Fatalf("row 49 after reopen: %v %v", ok, err)
	}
}

func TestConfigTrustedValidated(t *testing.T) {
	_, err := Open(context.Background(), Config{InMemory: true, MeshID: testMesh, Trusted: []PeerKey{{Site: messages.SiteID{1}, PublicKey: make([]byte, 31)}}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Trusted[0]" {
		t.Fatalf("short public key: %v", err)
	}
}

// outcomeCount sums syncmesh_sync_events_total for one outcome.
func outcomeCount(t *testing.T, n *testNode, outcome string) float64 {
	t.Helper()
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_sync_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
