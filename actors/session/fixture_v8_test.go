package session_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// TestLayout8DevicesKeepWorkingOnInitiationV2 opens the frozen layout-8
// devices (written by the build before initiation version 2, see
// persistence/bolt TestOpenFixtureV8Delivery) with this build: alice's
// established session with bob carries on both ways, bob still holds the
// skipped key of a message alice sent before the upgrade (a version-1
// record), and alice's unanswered version-1 initiation to carol is dropped,
// so her next message initiates again with version 2 and carol accepts it.
func TestLayout8DevicesKeepWorkingOnInitiationV2(t *testing.T) {
	ms := newMesh(t)
	open := func(name string) *node {
		t.Helper()
		src := filepath.Join("..", "..", "persistence", "bolt", "testdata", "layout_v8_delivery_"+name+".db")
		path := filepath.Join(t.TempDir(), name+".db")
		copyFile(t, src, path)
		db, err := bolt.Open(path, bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		switch name {
		case "alice":
			return ms.add(aliceAddr, db.Delivery(), nil)
		case "bob":
			return ms.add(bobAddr, db.Delivery(), nil)
		default:
			return ms.add(carolAddr, db.Delivery(), nil)
		}
	}
	alice, bob, carol := open("alice"), open("bob"), open("carol")
	a1, err := os.ReadFile(filepath.Join("..", "..", "persistence", "bolt", "testdata", "layout_v8_delivery_a1.env"))
	if err != nil {
		t.Fatal(err)
	}
	mustDecrypt(t, bob, aliceAddr, a1, "a1")
	mustDecrypt(t, bob, aliceAddr, mustEncrypt(t, alice, bobAddr, "after the upgrade"), "after the upgrade")
	mustDecrypt(t, alice, bobAddr, mustEncrypt(t, bob, aliceAddr, "and back"), "and back")
	mustDecrypt(t, carol, aliceAddr, mustEncrypt(t, alice, carolAddr, "to carol again"), "to carol again")
	mustDecrypt(t, alice, carolAddr, mustEncrypt(t, carol, aliceAddr, "hi alice"), "hi alice")
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
