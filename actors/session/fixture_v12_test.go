package session_test

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// TestLayout12DevicesKeepTheirSkippedKeys opens the frozen layout-12
// devices (written by ab878b4, see persistence/bolt
// TestMigrateLayout12To13SplitsSkippedKeys) with this build, which splits
// bob's skipped keys out of his session records: the four messages bob
// skipped before the upgrade (three of alice's, one of carol's) decrypt,
// each consuming its stored entry, and alice and bob carry on both ways.
func TestLayout12DevicesKeepTheirSkippedKeys(t *testing.T) {
	ms := newMesh(t)
	s, err := sealed.New(sealed.Key{0x12, 0x0c, 0x13})
	if err != nil {
		t.Fatal(err)
	}
	testdata := filepath.Join("..", "..", "persistence", "bolt", "testdata")
	open := func(name string, addr messages.DeviceAddress) *node {
		t.Helper()
		path := filepath.Join(t.TempDir(), name+".db")
		copyFile(t, filepath.Join(testdata, "layout_v12_delivery_"+name+"_sealed.db"), path)
		db, err := bolt.Open(path, bolt.Options{NoSync: true, Sealer: s})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return ms.add(addr, db.Delivery(), nil)
	}
	alice, bob := open("alice", aliceAddr), open("bob", bobAddr)
	raw, err := os.ReadFile(filepath.Join(testdata, "layout_v12_delivery_sealed.env"))
	if err != nil {
		t.Fatal(err)
	}
	stored := func() int {
		t.Helper()
		var n int
		if err := bob.store.View(bg, func(r persistence.DeliveryReader) error {
			var err error
			n, err = r.SkippedKeyCount(nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := stored(); n != 4 {
		t.Fatalf("bob stores %d skipped keys after the upgrade, want 4", n)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for i, line := range lines {
		f := strings.Fields(line)
		env, err := hex.DecodeString(f[2])
		if err != nil {
			t.Fatal(err)
		}
		from := aliceAddr
		if strings.HasPrefix(f[0], "carol") {
			from = carolAddr
		}
		mustDecrypt(t, bob, from, env, f[1])
		if n, want := stored(), len(lines)-1-i; n != want {
			t.Fatalf("after %s bob stores %d skipped keys, want %d", f[1], n, want)
		}
	}
	mustDecrypt(t, bob, aliceAddr, mustEncrypt(t, alice, bobAddr, "after the upgrade"), "after the upgrade")
	mustDecrypt(t, alice, bobAddr, mustEncrypt(t, bob, aliceAddr, "and back"), "and back")
}
