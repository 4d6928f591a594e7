package bolt

import (
	"context"
	"errors"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The layout-10 fixtures (testdata/layout_v10_delivery_{sealed,plain}.db)
// were written by defa365 through its own DeliveryTx, then compacted
// (bbolt.Compact), and are frozen: one sealed under fixtureV10Key, one
// without a Sealer. Each holds a local identity and prekey store, pins and
// sessions for alice.1 and carol.2, three processed entries — (alice.1,
// {1}) committed at 1000 with the digest of "hello", (alice.1, {2})
// discarded "expired" at 2000 with the digest of "junk", and (carol.2,
// {3}) committed at 3000 WITHOUT digest, which defa365's contract still
// accepted and its delivery plane never wrote — a pending inbound frame
// (alice.1, {4}) and a pending outbound body (carol.2, {5}).
var fixtureV10Key = sealed.Key{0x10, 0x0a, 0x11}

var (
	fxAlice = messages.DeviceAddress{User: "alice", Device: 1}
	fxCarol = messages.DeviceAddress{User: "carol", Device: 2}
)

func fixtureV10Pins() (alice, carol messages.IdentityKey) {
	for i := range alice.Sign {
		alice.Sign[i], alice.DH[i] = 0xA0, 0xA1
		carol.Sign[i], carol.DH[i] = 0xC0, 0xC1
	}
	return alice, carol
}

func rawLayout(t *testing.T, path string) (version uint64, pins map[string][]byte) {
	t.Helper()
	raw, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	pins = map[string][]byte{}
	if err := raw.View(func(tx *bbolt.Tx) error {
		if version, err = layoutVersion(wrapTx(tx)); err != nil {
			return err
		}
		return tx.Bucket(bucketDeliveryPins).ForEach(func(k, v []byte) error {
			pins[string(k)] = clone(v)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return version, pins
}

// TestMigrateLayout10To11SealsPinsAndProcessedEntries: layout 11 seals
// every pin with its address in the associated data and rewrites every
// processed entry as one sealed record (finalization, time, digest,
// reason); everything reads back as before, except the entry without
// digest, which layout 10 never wrote and which now reads as ErrCorrupt
// (the migration writes no legacy marker). The prune index still works.
func TestMigrateLayout10To11SealsPinsAndProcessedEntries(t *testing.T) {
	s, err := sealed.New(fixtureV10Key)
	if err != nil {
		t.Fatal(err)
	}
	ka, kc := fixtureV10Pins()
	for name, sl := range map[string]persistence.Sealer{"sealed": s, "plain": nil} {
		t.Run(name, func(t *testing.T) {
			path := copyFixture(t, "layout_v10_delivery_"+name+".db")
			v, pins := rawLayout(t, path)
			if v != 10 || len(pins) != 2 {
				t.Fatalf("fixture: layout %d, %d pins; want 10, 2", v, len(pins))
			}
			for k, p := range pins {
				if len(p) != 64 {
					t.Fatalf("fixture pin %x is %d bytes, want 64 plaintext", k, len(p))
				}
			}
			db := mustOpen(t, path, Options{NoSync: true, Sealer: sl})
			ctx := context.Background()
			check := func(r persistence.DeliveryReader) {
				if v, ok, err := r.LocalIdentity(); err != nil || !ok || string(v) != "identity-v10" {
					t.Fatalf("identity = %q %v %v", v, ok, err)
				}
				if v, ok, err := r.Prekeys(); err != nil || !ok || string(v) != "prekeys-v10" {
					t.Fatalf("prekeys = %q %v %v", v, ok, err)
				}
				for p, want := range map[messages.DeviceAddress]messages.IdentityKey{fxAlice: ka, fxCarol: kc} {
					if k, ok, err := r.Pin(p); err != nil || !ok || k != want {
						t.Fatalf("pin %s = %v %v %v", p, k, ok, err)
					}
					if v, ok, err := r.Session(p); err != nil || !ok || string(v) != "session-"+p.User+"-v10" {
						t.Fatalf("session %s = %q %v %v", p, v, ok, err)
					}
				}
				dh, dj := digest.ApplicationMessage([]byte("hello")), digest.ApplicationMessage([]byte("junk"))
				for _, want := range []persistence.ProcessedInbound{
					{Sender: fxAlice, ID: messages.LogicalMessageID{1}, Finalization: persistence.FinalizationCommitted, FinalizedAt: 1000, Digest: &dh},
					{Sender: fxAlice, ID: messages.LogicalMessageID{2}, Finalization: persistence.FinalizationDiscarded, FinalizedAt: 2000, Digest: &dj, Reason: persistence.DiscardExpired},
				} {
					got, ok, err := r.ProcessedInbound(want.Sender, want.ID)
					if err != nil || !ok || got.Finalization != want.Finalization || got.FinalizedAt != want.FinalizedAt ||
						got.Reason != want.Reason || got.Legacy || got.Digest == nil || *got.Digest != *want.Digest {
						t.Fatalf("processed %s = %+v %v %v, want %+v", want.ID, got, ok, err, want)
					}
				}
				if _, _, err := r.ProcessedInbound(fxCarol, messages.LogicalMessageID{3}); !errors.Is(err, persistence.ErrCorrupt) {
					t.Fatalf("layout-10 entry without digest: %v, want ErrCorrupt", err)
				}
				if p, ok, err := r.PendingInbound(fxAlice, messages.LogicalMessageID{4}); err != nil || !ok || string(p.Frame) != "frame-v10" || p.ReceivedAt != 4000 {
					t.Fatalf("pending = %+v %v %v", p, ok, err)
				}
				if p, ok, err := r.PendingOutbound(fxCarol, messages.LogicalMessageID{5}); err != nil || !ok || string(p.Body) != "body-v10" {
					t.Fatalf("outbound = %+v %v %v", p, ok, err)
				}
				if n, err := r.ProcessedInboundCount(); err != nil || n != 3 {
					t.Fatalf("processed count = %d %v", n, err)
				}
			}
			if err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error { check(r); return nil }); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			v, pins = rawLayout(t, path)
			if v != LayoutVersion {
				t.Fatalf("migrated to layout %d, want %d", v, LayoutVersion)
			}
			for k, p := range pins {
				if sl != nil && (len(p) != 64+sealed.Overhead || !s.IsCurrent(p)) {
					t.Fatalf("pin %x after the migration: %d bytes, not sealed under the current key", k, len(p))
				}
			}
			// Reopening migrates nothing again; the prune index still
			// finds the entries by their unchanged times.
			db = mustOpen(t, path, Options{NoSync: true, Sealer: sl})
			defer db.Close()
			if err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error { check(r); return nil }); err != nil {
				t.Fatal(err)
			}
			if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
				if n, err := tx.PruneProcessedInbound(2000); err != nil || n != 2 {
					t.Fatalf("prune ≤ 2000 = %d %v, want 2", n, err)
				}
				if n, err := tx.PruneProcessedInbound(3000); err != nil || n != 1 {
					t.Fatalf("prune ≤ 3000 = %d %v, want 1 (the corrupt entry goes by its index time)", n, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMigrateLayout10To11RefusesAWrongKey: opened with another storage
// key, the migration fails before sealing anything (the device identity
// does not open), Open returns ErrCorrupt and the file stays at layout 10
// with its pins as they were; the right key then migrates it.
func TestMigrateLayout10To11RefusesAWrongKey(t *testing.T) {
	path := copyFixture(t, "layout_v10_delivery_sealed.db")
	_, before := rawLayout(t, path)
	wrong, err := sealed.New(sealed.Key{0x99})
	if err != nil {
		t.Fatal(err)
	}
	if db, err := Open(path, Options{NoSync: true, Sealer: wrong}); !errors.Is(err, persistence.ErrCorrupt) {
		if db != nil {
			_ = db.Close()
		}
		t.Fatalf("Open with a wrong key: %v, want ErrCorrupt", err)
	}
	v, after := rawLayout(t, path)
	if v != 10 || len(after) != len(before) {
		t.Fatalf("after the refused migration: layout %d, %d pins", v, len(after))
	}
	for k, p := range before {
		if string(after[k]) != string(p) {
			t.Fatalf("pin %x changed by a refused migration", k)
		}
	}
	right, err := sealed.New(fixtureV10Key)
	if err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, path, Options{NoSync: true, Sealer: right})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
