package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// A pin copied onto another device's row, or a plaintext pin written
// without the key, fails to open there: ErrCorrupt, never a pin.
func TestPinMovedOrForgedIsCorrupt(t *testing.T) {
	s, err := sealed.New(sealed.Key{4, 5, 6})
	if err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true, Sealer: s})
	defer db.Close()
	ctx := context.Background()
	ka, kc := fixtureV10Pins()
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := tx.PutPin(fxAlice, ka); err != nil {
			return err
		}
		return tx.PutPin(fxCarol, kc)
	}); err != nil {
		t.Fatal(err)
	}
	for name, forge := range map[string]func(b *bbolt.Bucket) error{
		"carol's pin copied to alice": func(b *bbolt.Bucket) error { return b.Put(addrKey(fxAlice), clone(b.Get(addrKey(fxCarol)))) },
		"plaintext pin":               func(b *bbolt.Bucket) error { return b.Put(addrKey(fxAlice), kc.Bytes()) },
	} {
		if err := db.bolt.Update(func(tx *bbolt.Tx) error { return forge(tx.Bucket(bucketDeliveryPins)) }); err != nil {
			t.Fatal(err)
		}
		err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
			_, _, err := r.Pin(fxAlice)
			return err
		})
		if !errors.Is(err, persistence.ErrCorrupt) {
			t.Fatalf("%s: Pin = %v, want ErrCorrupt", name, err)
		}
	}
}

// A processed entry whose sealed plaintext has no digest and no legacy
// marker — what a store without a Sealer would hold after someone edited
// it — reads as ErrCorrupt; so does a marker beside a digest. The same
// entry with the marker (only ImportLegacyProcessed writes one) reads as
// legacy.
func TestProcessedEntryWithoutDigestNeedsTheLegacyMarker(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	ctx := context.Background()
	id := messages.LogicalMessageID{7}
	for _, tc := range []struct {
		entry   processedEntry
		corrupt bool
	}{
		{processedEntry{Kind: 1, FinalizedAt: 5}, true},
		{processedEntry{Kind: 2, FinalizedAt: 5, Reason: 1}, true},
		{processedEntry{Kind: 1, FinalizedAt: 5, Digest: make([]byte, 32), Legacy: true}, true},
		{processedEntry{Kind: 2, FinalizedAt: 5, Reason: 1, Legacy: true}, true},
		{processedEntry{Kind: 1, FinalizedAt: 5, Digest: make([]byte, 31)}, true},
		{processedEntry{Kind: 1, FinalizedAt: 5, Legacy: true}, false},
		{processedEntry{Kind: 1, FinalizedAt: 5, Digest: make([]byte, 32)}, false},
	} {
		if err := db.bolt.Update(func(tx *bbolt.Tx) error {
			pt, err := messages.Marshal(&tc.entry)
			if err != nil {
				return err
			}
			v, err := messages.Marshal(&processedRecord{V: processedRecordVersion, Entry: pt})
			if err != nil {
				return err
			}
			return tx.Bucket(bucketInProcessed).Put(msgKey(fxAlice, id), v)
		}); err != nil {
			t.Fatal(err)
		}
		err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
			p, _, err := r.ProcessedInbound(fxAlice, id)
			if err == nil && p.Legacy != tc.entry.Legacy {
				t.Fatalf("%+v read as %+v", tc.entry, p)
			}
			return err
		})
		if got := errors.Is(err, persistence.ErrCorrupt); got != tc.corrupt || (!tc.corrupt && err != nil) {
			t.Fatalf("%+v: %v, want corrupt=%v", tc.entry, err, tc.corrupt)
		}
	}
}
