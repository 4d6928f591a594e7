package bolt

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// testdata/layout_v14_delivery.db is a layout-14 file written by
// cbbc4de's store (plaintext: PutPendingOutbound of bob/2 id 01… body
// "pending" at 1000, PutProcessedInbound of bob/2 id 02… committed at 2000
// with digest 09 00…; then bbolt.Compact) and frozen.
const fixtureV14Delivery = "testdata/layout_v14_delivery.db"

func TestMigrateLayout14To15RetiredOutbound(t *testing.T) {
	raw, err := os.ReadFile(fixtureV14Delivery)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "v14.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	before := rawBuckets(t, path)
	if v := before[string(bucketMeta)][string(metaLayoutVersion)]; v != string(u64(14)) {
		t.Fatalf("fixture layout %x, want 14", v)
	}
	if _, ok := before[string(bucketOutRetired)]; ok {
		t.Fatal("fixture already has the retired bucket")
	}

	db := mustOpen(t, path, Options{NoSync: true})
	bob := messages.DeviceAddress{User: "bob", Device: 2}
	if err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		p, ok, err := r.PendingOutbound(bob, messages.LogicalMessageID{1})
		if err != nil || !ok || string(p.Body) != "pending" || p.CreatedAt != 1000 {
			t.Fatalf("pending outbound after migration: %+v %v %v", p, ok, err)
		}
		d, ok, err := r.ProcessedInbound(bob, messages.LogicalMessageID{2})
		if err != nil || !ok || d.Digest == nil || d.Digest[0] != 9 {
			t.Fatalf("processed inbound after migration: %+v %v %v", d, ok, err)
		}
		if n, err := r.RetiredOutboundCount(); err != nil || n != 0 {
			t.Fatalf("retired count after migration: %d %v", n, err)
		}
		_, ok, err = r.RetiredOutbound(bob, messages.LogicalMessageID{1})
		if err != nil || ok {
			t.Fatalf("retired entry after migration: %v %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The migrated file takes retired entries like a new one.
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutRetiredOutbound(persistence.RetiredOutbound{Recipient: bob, ID: messages.LogicalMessageID{3}, How: persistence.RetiredAbandoned, RetiredAt: 3000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Only the layout version changed and the retired buckets are new:
	// every other bucket is byte for byte as it was (the entry written
	// after the migration is in the new buckets and the meta counter).
	after := rawBuckets(t, path)
	if v := after[string(bucketMeta)][string(metaLayoutVersion)]; v != string(u64(15)) {
		t.Fatalf("layout after Open %x, want 15", v)
	}
	for name, entries := range before {
		if name == string(bucketMeta) || name == string(bucketInMeta) {
			continue
		}
		if fmt.Sprint(after[name]) != fmt.Sprint(entries) {
			t.Errorf("bucket %s changed by the migration", name)
		}
	}
	if len(after[string(bucketOutRetired)]) != 1 || len(after[string(bucketOutRetiredTime)]) != 1 {
		t.Errorf("retired buckets: %d and %d entries, want 1 and 1", len(after[string(bucketOutRetired)]), len(after[string(bucketOutRetiredTime)]))
	}
}
