package device_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// damagingSealer is the real storage cipher, except that while damage is
// set every Open of a pending frame fails as a damaged record would.
type damagingSealer struct {
	*sealed.Sealer
	damage atomic.Bool
}

func (s *damagingSealer) Open(t persistence.RecordType, identity, b []byte) ([]byte, error) {
	if s.damage.Load() && t == persistence.RecordPendingFrame {
		return nil, fmt.Errorf("test: damaged record: %w", persistence.ErrCorrupt)
	}
	return s.Sealer.Open(t, identity, b)
}

// Storage encryption: a damaged pending record fails on the decrypt of a
// copy, on enumeration and on commit; it is never treated as missing,
// processed or acknowledged.
func TestDamagedPendingRecordIsAnErrorNeverMissing(t *testing.T) {
	inner, err := sealed.New(sealed.Key{9, 9, 9})
	if err != nil {
		t.Fatal(err)
	}
	ds := &damagingSealer{Sealer: inner}
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	db, err := bolt.Open(filepath.Join(t.TempDir(), "bob.db"), bolt.Options{NoSync: true, Sealer: ds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	b := &dev{ms: ms, addr: bobAddr, store: db.Delivery()}
	b.start()
	sm := a.send(b, "secret")
	b.mustRecv(b.takeOne())
	ds.damage.Store(true)
	a.resend(b, sm.ID)
	if _, err := b.recv(b.takeOne()); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("copy of a damaged pending message: %v", err)
	}
	if _, err := b.d.PendingReceivedMessages(bg, 0, 10, nil); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("enumeration: %v", err)
	}
	if _, err := b.d.CommitReceivedMessage(bg, a.addr, sm.ID); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("commit: %v", err)
	}
	if _, ok := b.processed(a, sm.ID); ok || len(a.take()) != 0 {
		t.Fatal("a damaged record was processed or acknowledged")
	}
	ds.damage.Store(false)
	if c := b.commit(a, sm.ID); c.Status != device.Committed {
		t.Fatalf("commit once readable = %+v", c)
	}
}

// The processed entry keeps ApplicationMessageDigest v1 of the committed
// body: the frozen vector for "hello" (ff761c42…26e54).
func TestProcessedEntryKeepsFrozenDigest(t *testing.T) {
	_, a, b := pair(t)
	sm := a.send(b, "hello")
	b.pump()
	b.commit(a, sm.ID)
	p, ok := b.processed(a, sm.ID)
	if !ok || p.Digest == nil {
		t.Fatal("no digest kept")
	}
	h := hex.EncodeToString(p.Digest[:])
	if !strings.HasPrefix(h, "ff761c42") || !strings.HasSuffix(h, "26e54") {
		t.Fatalf("digest of \"hello\" = %s", h)
	}
	if p.FinalizedAt != b.ms.clock.Now().UnixMilli() || p.Finalization != persistence.FinalizationCommitted {
		t.Fatalf("processed entry %+v", p)
	}
}
