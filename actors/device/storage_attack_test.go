package device_test

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// Threat: someone who can write node.db but does not hold the
// storage key. Each test runs bob over a sealed bbolt file, closes it,
// rewrites raw bytes the way such an attacker can (bucket names and key
// encodings are public), reopens it and checks that the rewrite is refused
// as a corrupt record instead of being believed.

// sealedBob is bob over a bbolt file sealed under a fixed storage key.
type sealedBob struct {
	*dev
	sealer *sealed.Sealer
}

func addSealedBob(t *testing.T, ms *mesh) *sealedBob {
	t.Helper()
	s, err := sealed.New(sealed.Key{7, 1, 3})
	if err != nil {
		t.Fatal(err)
	}
	b := &sealedBob{dev: &dev{ms: ms, addr: bobAddr, path: filepath.Join(t.TempDir(), "bob.db")}, sealer: s}
	b.open()
	b.start()
	return b
}

func (b *sealedBob) open() {
	b.ms.tb.Helper()
	db, err := bolt.Open(b.path, bolt.Options{NoSync: true, Sealer: b.sealer})
	if err != nil {
		b.ms.tb.Fatalf("bolt.Open: %v", err)
	}
	b.db = db
	b.store = db.Delivery()
	b.ms.tb.Cleanup(func() { _ = db.Close() })
}

// tamper stops bob, runs fn over the raw bbolt file, and starts bob again.
func (b *sealedBob) tamper(fn func(tx *bbolt.Tx) error) {
	b.ms.tb.Helper()
	_ = b.d.Close()
	_ = b.db.Close()
	raw, err := bbolt.Open(b.path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		b.ms.tb.Fatal(err)
	}
	if err := raw.Update(fn); err != nil {
		b.ms.tb.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		b.ms.tb.Fatal(err)
	}
	b.open()
	b.start()
}

// rawAddrKey is the public key encoding of a device address in the
// delivery buckets: the user bytes (0x00 escaped as 0x00 0xFF), 0x00 0x01,
// the device as 4 big-endian bytes.
func rawAddrKey(a messages.DeviceAddress) []byte {
	var k []byte
	for i := 0; i < len(a.User); i++ {
		k = append(k, a.User[i])
		if a.User[i] == 0 {
			k = append(k, 0xFF)
		}
	}
	k = append(k, 0, 1)
	return binary.BigEndian.AppendUint32(k, a.Device)
}

func rawMsgKey(a messages.DeviceAddress, id messages.LogicalMessageID) []byte {
	return append(rawAddrKey(a), id[:]...)
}

func rawBucket(tx *bbolt.Tx, name string) *bbolt.Bucket {
	b := tx.Bucket([]byte(name))
	if b == nil {
		panic("test: no bucket " + name)
	}
	return b
}

// editRecord decodes a stored CBOR record as a map of integer keys, lets
// edit change it, and stores it again.
func editRecord(tx *bbolt.Tx, bucket string, key []byte, edit func(m map[uint64]cbor.RawMessage)) error {
	b := rawBucket(tx, bucket)
	v := b.Get(key)
	if v == nil {
		return errors.New("test: no record to edit")
	}
	m := map[uint64]cbor.RawMessage{}
	if err := cbor.Unmarshal(v, &m); err != nil {
		return err
	}
	edit(m)
	nv, err := cbor.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(key, nv)
}

func cborOf(v any) cbor.RawMessage {
	b, err := cbor.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestAttackSwappedPinAndDeletedSessionCannotImpersonate: mallory, a
// device bob already talks to as carol.1, gets bob's stored pin of carol.1
// copied onto alice.1's row and alice.1's session deleted; then mallory
// initiates as alice.1. Pins are sealed with the address in the
// associated data, so the copied pin does not open at alice.1 and nothing
// is delivered as alice.1.
func TestAttackSwappedPinAndDeletedSessionCannotImpersonate(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := addSealedBob(t, ms)
	mstore := memory.NewDelivery()
	m := &dev{ms: ms, addr: carolAddr, store: mstore}
	m.start()

	a.send(b.dev, "hello from alice")
	b.mustRecv(b.takeOne())
	m.send(b.dev, "hello from carol")
	b.mustRecv(b.takeOne())

	b.tamper(func(tx *bbolt.Tx) error {
		pins := rawBucket(tx, "delivery.pins")
		carolPin := pins.Get(rawAddrKey(carolAddr))
		if carolPin == nil {
			return errors.New("test: no pin of carol.1")
		}
		if err := pins.Put(rawAddrKey(aliceAddr), append([]byte(nil), carolPin...)); err != nil {
			return err
		}
		return rawBucket(tx, "delivery.sessions").Delete(rawAddrKey(aliceAddr))
	})

	// mallory, same identity and store, now at alice.1 (its own session
	// with bob, made as carol.1, is of no use there).
	_ = m.d.Close()
	_ = a.d.Close()
	if err := mstore.Update(bg, func(tx persistence.DeliveryTx) error { return tx.DeleteSession(bobAddr) }); err != nil {
		t.Fatal(err)
	}
	mal := &dev{ms: ms, addr: aliceAddr, store: mstore.Reopen()}
	mal.start()
	mal.send(b.dev, "transfer 100 EUR")
	r, err := b.recv(b.takeOne())
	if err == nil && r.Message != nil {
		t.Fatalf("bob delivered %q as %s from mallory's identity", r.Message.Plaintext, r.Message.Sender)
	}
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("receive after the pin swap: %+v, %v; want an error matching ErrCorrupt", r, err)
	}
	for _, p := range b.pendingAll() {
		if string(p.Plaintext) == "transfer 100 EUR" {
			t.Fatalf("mallory's message is pending as %s's", p.Sender)
		}
	}
	if n := b.pendingCount(); n != 2 {
		t.Fatalf("%d pending after the refused initiation, want the 2 greetings", n)
	}
}

// TestAttackFlippedFinalizationIsCorrupt: bob commits alice's message; the
// stored processed entry is rewritten from committed to discarded (reason
// "other"). The finalization is inside the sealed record, so the entry
// reads as corrupt, never as discarded, and a retry is not answered
// ALREADY_DISCARDED.
func TestAttackFlippedFinalizationIsCorrupt(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil)
	b := addSealedBob(t, ms)
	sm := a.send(b.dev, "pay 5 EUR")
	b.mustRecv(b.takeOne())
	if c := b.commit(a, sm.ID); c.Status != device.Committed {
		t.Fatalf("commit = %+v", c)
	}
	a.take()

	b.tamper(func(tx *bbolt.Tx) error {
		return editRecord(tx, "delivery.in_processed", rawMsgKey(aliceAddr, sm.ID), func(m map[uint64]cbor.RawMessage) {
			m[2] = cborOf(uint8(persistence.FinalizationDiscarded))
			m[5] = cborOf(uint8(persistence.DiscardOther))
		})
	})

	p, ok, err := b.d.ProcessedMessage(bg, aliceAddr, sm.ID)
	if err == nil && ok && p.Finalization == persistence.FinalizationDiscarded {
		t.Fatalf("the flipped entry was accepted: %+v", p)
	}
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("processed entry after the flip: %+v %v, %v; want an error matching ErrCorrupt", p, ok, err)
	}
	a.resend(b.dev, sm.ID)
	r, err := b.recv(b.takeOne())
	if err == nil && r.Kind == device.AlreadyDiscarded {
		t.Fatalf("a retry was answered ALREADY_DISCARDED: %+v", r)
	}
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("retry after the flip: %+v, %v; want an error matching ErrCorrupt", r, err)
	}
	if len(a.take()) != 0 {
		t.Fatal("a retry of the corrupt entry was acknowledged")
	}
}

// TestAttackRemovedDigestDoesNotAckAnotherBody: bob commits alice's
// message; the stored entry loses its digest, which used to make it a
// legacy entry acknowledging any body. An entry without digest and
// without the sealed legacy marker is corrupt: a different body with that
// id is neither ACKed ALREADY_COMMITTED nor delivered. Two rewrites:
// dropping field 4 (the digest of layout 10; since layout 11 the digest is
// inside the sealed entry, so the record is unchanged and the body
// conflicts), and writing the previous layout's record without digest
// (ErrCorrupt).
func TestAttackRemovedDigestDoesNotAckAnotherBody(t *testing.T) {
	for name, tc := range map[string]struct {
		edit    func(m map[uint64]cbor.RawMessage)
		corrupt bool
	}{
		"field dropped": {edit: func(m map[uint64]cbor.RawMessage) { delete(m, 4) }},
		"previous layout without digest": {corrupt: true, edit: func(m map[uint64]cbor.RawMessage) {
			for k := range m {
				delete(m, k)
			}
			m[1], m[2], m[3] = cborOf(1), cborOf(uint8(persistence.FinalizationCommitted)), cborOf(int64(1))
		}},
	} {
		edit := tc.edit
		t.Run(name, func(t *testing.T) {
			ms := newMesh(t)
			a := ms.add(aliceAddr, nil)
			b := addSealedBob(t, ms)
			sm := a.send(b.dev, "pay 5 EUR")
			b.mustRecv(b.takeOne())
			b.commit(a, sm.ID)
			a.take()

			b.tamper(func(tx *bbolt.Tx) error {
				return editRecord(tx, "delivery.in_processed", rawMsgKey(aliceAddr, sm.ID), edit)
			})

			a.sendRaw(b.dev, sm.ID, "pay 5000 EUR")
			r, err := b.recv(b.takeOne())
			if err == nil && r.Kind == device.AlreadyCommitted {
				t.Fatalf("a different body was ACKed ALREADY_COMMITTED (ackSent=%v)", r.AckSent)
			}
			var ce *inbound.ConflictError
			if tc.corrupt && !errors.Is(err, persistence.ErrCorrupt) || !tc.corrupt && !errors.As(err, &ce) {
				t.Fatalf("different body after the digest was removed: %+v, %v; want corrupt=%v, else a conflict", r, err, tc.corrupt)
			}
			if len(a.take()) != 0 {
				t.Fatal("the different body was acknowledged")
			}
		})
	}
}
