package bolt

import (
	"errors"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestSkippedKeyMovedOrDamagedIsCorrupt: a sealed skipped key copied to
// another peer or another number, or damaged, fails to open: reading the
// peer's keys is ErrCorrupt, never a key under the wrong address.
func TestSkippedKeyMovedOrDamagedIsCorrupt(t *testing.T) {
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	carol := messages.DeviceAddress{User: "carol", Device: 2}
	for _, tc := range []struct {
		name string
		key  []byte
		flip bool
	}{
		{"another number", skippedKeyOf(alice, 2), false},
		{"another peer", skippedKeyOf(carol, 1), false},
		{"damaged", skippedKeyOf(alice, 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true, Sealer: newTestSealer(1)})
			defer db.Close()
			if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
				return tx.PutSkippedKey(alice, 1, []byte("message key"))
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.bolt.Update(func(tx *bbolt.Tx) error {
				b := tx.Bucket(bucketDeliverySkipped)
				v := clone(b.Get(skippedKeyOf(alice, 1)))
				if tc.flip {
					v[len(v)-1] ^= 1
				}
				return b.Put(tc.key, v)
			}); err != nil {
				t.Fatal(err)
			}
			peer, _, _ := parseSkippedKey(tc.key)
			err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
				return r.SkippedKeys(peer, func(uint64, []byte) (bool, error) { return true, nil })
			})
			if !errors.Is(err, persistence.ErrCorrupt) {
				t.Fatalf("reading the %s entry: %v, want ErrCorrupt", tc.name, err)
			}
		})
	}
}
