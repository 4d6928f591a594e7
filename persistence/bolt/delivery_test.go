package bolt

import (
	"errors"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

// deliveryOpener returns a storetest open func over a bolt file with opts.
func deliveryOpener(opts Options) storetest.DeliveryOpenFunc {
	return func(t *testing.T) (persistence.DeliveryStore, func() persistence.DeliveryStore) {
		path := filepath.Join(t.TempDir(), "node.db")
		db := mustOpen(t, path, opts)
		cur := db
		t.Cleanup(func() { _ = cur.Close() })
		return db.Delivery(), func() persistence.DeliveryStore {
			if err := cur.Close(); err != nil && !errors.Is(err, persistence.ErrClosed) {
				t.Fatalf("close: %v", err)
			}
			cur = mustOpen(t, path, opts)
			return cur.Delivery()
		}
	}
}

func TestDeliveryContractPlain(t *testing.T) {
	storetest.RunDeliveryStore(t, deliveryOpener(Options{NoSync: true}))
}

func TestDeliveryContractSealed(t *testing.T) {
	s := newTestSealer(1)
	storetest.RunDeliveryStore(t, deliveryOpener(Options{NoSync: true, Sealer: s}))
	if s.opened.Load() == 0 {
		t.Fatal("the sealed path never ran")
	}
}

func TestDeliveryContractCryptoSealed(t *testing.T) {
	var k sealed.Key
	for i := range k {
		k[i] = byte(i + 1)
	}
	s, err := sealed.New(k)
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunDeliveryStore(t, deliveryOpener(Options{NoSync: true, Sealer: s}))
}

func TestAddrKeyRoundTripAndOrder(t *testing.T) {
	as := []messages.DeviceAddress{{User: "a", Device: 1}, {User: "a\x00", Device: 0}, {User: "a\x00\x00b", Device: 7}, {User: "\x00", Device: 2}, {User: "zz", Device: 0xFFFFFFFF}}
	for _, a := range as {
		got, err := parseAddrKey(addrKey(a))
		if err != nil || got != a {
			t.Fatalf("round trip %q: %q %v", a, got, err)
		}
		for _, b := range as {
			if c := bytesCompare(addrKey(a), addrKey(b)); c != a.Compare(b) {
				t.Fatalf("order %q vs %q: key %d, address %d", a, b, c, a.Compare(b))
			}
		}
	}
	for _, bad := range [][]byte{nil, {0}, {'a', 0, 1, 0, 0}, {'a', 0, 2, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0}, {'a'}} {
		if _, err := parseAddrKey(bad); !errors.Is(err, persistence.ErrCorrupt) {
			t.Fatalf("parseAddrKey(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func bytesCompare(a, b []byte) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

// TestDeliveryDamagedRecordIsCorrupt: docs/protocol.md, "At rest" — a damaged
// sealed record, or one moved to another row, is ErrCorrupt, never missing.
func TestDeliveryDamagedRecordIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(1)})
	defer db.Close()
	s := db.Delivery()
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 1}
	if err := s.Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := tx.PutSession(alice, []byte("alice-record")); err != nil {
			return err
		}
		if err := tx.PutLocalIdentity([]byte("id")); err != nil {
			return err
		}
		return tx.PutPrekeys([]byte("pk"))
	}); err != nil {
		t.Fatal(err)
	}
	raw := func(bucket, key []byte, fn func(v []byte) []byte) {
		t.Helper()
		if err := db.bolt.Update(func(tx *bbolt.Tx) error {
			b := tx.Bucket(bucket)
			v := append([]byte(nil), b.Get(key)...)
			return b.Put(key, fn(v))
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Move alice's record to bob's row.
	raw(bucketDeliverySessions, addrKey(bob), func([]byte) []byte {
		var v []byte
		_ = db.bolt.View(func(tx *bbolt.Tx) error {
			v = append(v, tx.Bucket(bucketDeliverySessions).Get(addrKey(alice))...)
			return nil
		})
		return v
	})
	// Flip a bit of alice's record; swap identity and prekeys (another type).
	raw(bucketDeliverySessions, addrKey(alice), func(v []byte) []byte { v[len(v)-1] ^= 1; return v })
	var idSealed []byte
	_ = db.bolt.View(func(tx *bbolt.Tx) error {
		idSealed = append(idSealed, tx.Bucket(bucketDeliveryMeta).Get(deliveryKeyIdentity)...)
		return nil
	})
	raw(bucketDeliveryMeta, deliveryKeyPrekeys, func([]byte) []byte { return idSealed })
	raw(bucketDeliveryPins, addrKey(alice), func([]byte) []byte { return []byte{1, 2, 3} })

	err := s.View(ctx, func(r persistence.DeliveryReader) error {
		for name, f := range map[string]func() error{
			"moved session":   func() error { _, _, err := r.Session(bob); return err },
			"damaged session": func() error { _, _, err := r.Session(alice); return err },
			"wrong type":      func() error { _, _, err := r.Prekeys(); return err },
			"short pin":       func() error { _, _, err := r.Pin(alice); return err },
		} {
			if err := f(); !errors.Is(err, persistence.ErrCorrupt) {
				t.Errorf("%s: %v, want ErrCorrupt", name, err)
			}
		}
		if v, ok, err := r.LocalIdentity(); err != nil || !ok || string(v) != "id" {
			t.Errorf("intact identity: %q %v %v", v, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzParseAddrKey: the address-key decoder never panics, and what it
// accepts re-encodes to the same key.
func FuzzParseAddrKey(f *testing.F) {
	f.Add(addrKey(messages.DeviceAddress{User: "alice", Device: 1}))
	f.Add(addrKey(messages.DeviceAddress{User: "a\x00b", Device: 0xFFFFFFFF}))
	f.Add([]byte{0, 1, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, k []byte) {
		a, err := parseAddrKey(k)
		if err != nil {
			if !errors.Is(err, persistence.ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if got := addrKey(a); string(got) != string(k) {
			t.Fatalf("%x parsed to %q, re-encodes to %x", k, a, got)
		}
	})
}
