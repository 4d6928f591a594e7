package bolt

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// copyFixture copies testdata/name to a temporary file and returns its path.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	src, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), name)
	dst, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOpenFixtureV8Delivery opens frozen layout-8 files written by the
// build before layout 9 (three devices: alice with an established session
// to bob and an unanswered one to carol, bob with a skipped key, carol with
// prekeys only): Open migrates them to layout 9 and every delivery record
// reads back unchanged (the records upgrade on their next write; the
// ratchet's reading of them is tested in actors/session).
func TestOpenFixtureV8Delivery(t *testing.T) {
	bob := messages.DeviceAddress{User: "bob", Device: 1}
	carol := messages.DeviceAddress{User: "carol", Device: 2}
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	for name, peers := range map[string][]messages.DeviceAddress{
		"alice": {bob, carol}, "bob": {alice}, "carol": nil,
	} {
		path := copyFixture(t, "layout_v8_delivery_"+name+".db")
		raw, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := raw.View(func(tx *bbolt.Tx) error {
			if v, err := layoutVersion(wrapTx(tx)); err != nil || v != 8 {
				t.Fatalf("%s: fixture is layout %d (%v), want 8", name, v, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := raw.Close(); err != nil {
			t.Fatal(err)
		}
		db := mustOpen(t, path, Options{NoSync: true})
		if err := db.bolt.View(func(tx *bbolt.Tx) error {
			if v, err := layoutVersion(wrapTx(tx)); err != nil || v != LayoutVersion {
				t.Fatalf("%s: migrated to layout %d (%v), want %d", name, v, err, LayoutVersion)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Delivery().View(context.Background(), func(r persistence.DeliveryReader) error {
			if _, ok, err := r.LocalIdentity(); err != nil || !ok {
				t.Fatalf("%s: identity %v %v", name, ok, err)
			}
			if _, ok, err := r.Prekeys(); err != nil || !ok {
				t.Fatalf("%s: prekeys %v %v", name, ok, err)
			}
			for _, p := range peers {
				if v, ok, err := r.Session(p); err != nil || !ok || len(v) == 0 {
					t.Fatalf("%s: session of %s: %v %v", name, p, ok, err)
				}
				if _, ok, err := r.Pin(p); err != nil || !ok {
					t.Fatalf("%s: pin of %s: %v %v", name, p, ok, err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
