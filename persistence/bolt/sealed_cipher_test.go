package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The storage cipher implements the store's contracts; it no longer
// asserts this itself (crypto/sealed imports nothing above messages).
var (
	_ persistence.Sealer     = (*sealed.Sealer)(nil)
	_ persistence.KeyRotator = (*sealed.Sealer)(nil)
)

// The cipher's open failure (sealed.ErrOpen, which knows nothing of
// persistence) reaches the store's caller as persistence.ErrCorrupt, with
// the cipher's error still matchable.
func TestSealedOpenFailureIsErrCorrupt(t *testing.T) {
	s1, err := sealed.New(sealed.Key{1})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := sealed.New(sealed.Key{2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "n.db")
	db := mustOpen(t, path, Options{NoSync: true, Sealer: s1})
	peer := messages.DeviceAddress{User: "alice", Device: 1}
	if err := db.Delivery().Update(context.Background(), func(tx persistence.DeliveryTx) error {
		return tx.PutSession(peer, []byte("state"))
	}); err != nil {
		t.Fatal(err)
	}
	db.opts.Sealer = s2 // another key: the record does not open
	err = db.Delivery().View(context.Background(), func(r persistence.DeliveryReader) error {
		_, _, err := r.Session(peer)
		return err
	})
	if !errors.Is(err, persistence.ErrCorrupt) || !errors.Is(err, sealed.ErrOpen) {
		t.Fatalf("session under another key: %v; want ErrCorrupt wrapping sealed.ErrOpen", err)
	}
	db.opts.Sealer = s1
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
