package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

func TestInboundContractPlain(t *testing.T) {
	storetest.RunInboundStore(t, deliveryOpener(Options{NoSync: true}))
}

func TestInboundContractCryptoSealed(t *testing.T) {
	var k sealed.Key
	for i := range k {
		k[i] = byte(i + 7)
	}
	s, err := sealed.New(k)
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunInboundStore(t, deliveryOpener(Options{NoSync: true, Sealer: s}))
}

var (
	ibAlice = messages.DeviceAddress{User: "alice", Device: 1}
	ibBob   = messages.DeviceAddress{User: "b\x00b", Device: 7}
)

func ibID(b byte) messages.LogicalMessageID { return messages.LogicalMessageID{b, 0xee} }

// seedInbound writes one record into each commit-boundary bucket per peer
// (8 sealed records), and a legacy processed entry (one more sealed
// record, imported as a migration would) when legacy is set.
func seedInbound(t *testing.T, db *DB, legacy bool) {
	t.Helper()
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		for i, p := range []messages.DeviceAddress{ibAlice, ibBob} {
			if _, err := tx.PutPendingInbound(persistence.PendingInbound{Sender: p, ID: ibID(byte(i)), ReceivedAt: 5, Frame: []byte(fmt.Sprint("frame-", i))}); err != nil {
				return err
			}
			d := [32]byte{byte(i)}
			if err := tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: p, ID: ibID(byte(i + 10)), Finalization: persistence.FinalizationCommitted, FinalizedAt: 6, Digest: &d}); err != nil {
				return err
			}
			if _, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: p, ID: ibID(byte(i + 20)), Attempts: 1, Body: []byte(fmt.Sprint("body-", i))}); err != nil {
				return err
			}
			if _, err := tx.PutRetiredOutbound(persistence.RetiredOutbound{Recipient: p, ID: ibID(byte(i + 30)), How: persistence.RetiredAbandoned, RetiredAt: 7, Digest: [32]byte{byte(i)}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !legacy {
		return
	}
	imp := db.Delivery().(persistence.LegacyImporter)
	if err := imp.ImportLegacyProcessed(ctx, []persistence.LegacyProcessed{{Sender: ibAlice, ID: ibID(99), FinalizedAt: 6}}); err != nil {
		t.Fatal(err)
	}
}

func readInbound(db *DB) error {
	return db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		for i, p := range []messages.DeviceAddress{ibAlice, ibBob} {
			pi, ok, err := r.PendingInbound(p, ibID(byte(i)))
			if err != nil || !ok || string(pi.Frame) != fmt.Sprint("frame-", i) {
				return fmt.Errorf("pending %s: %q %v %w", p, pi.Frame, ok, err)
			}
			pr, ok, err := r.ProcessedInbound(p, ibID(byte(i+10)))
			if err != nil || !ok || pr.Digest == nil || pr.Digest[0] != byte(i) {
				return fmt.Errorf("processed %s: %+v %v %w", p, pr, ok, err)
			}
			po, ok, err := r.PendingOutbound(p, ibID(byte(i+20)))
			if err != nil || !ok || string(po.Body) != fmt.Sprint("body-", i) {
				return fmt.Errorf("outbound %s: %+v %v %w", p, po, ok, err)
			}
			ro, ok, err := r.RetiredOutbound(p, ibID(byte(i+30)))
			if err != nil || !ok || ro.Digest[0] != byte(i) || ro.RetiredAt != 7 {
				return fmt.Errorf("retired %s: %+v %v %w", p, ro, ok, err)
			}
		}
		return r.PendingInboundAfter(0, nil, func(persistence.PendingInbound) (bool, error) { return true, nil })
	})
}

// Key rotation re-seals the pending frames, the processed entries and the
// outbound bodies (docs/protocol.md, commit boundary, Storage: "storage key rotation
// re-encrypts both columns").
func TestResealCoversCommitBoundaryRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(1)})
	seedInbound(t, db, true)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rot := newTestSealer(2, 1)
	db = mustOpen(t, path, Options{NoSync: true, Sealer: rot})
	defer db.Close()
	per, stale := inboundStale(t, db, rot)
	for b, want := range map[string]int{string(bucketInPending): 2, string(bucketInProcessed): 3, string(bucketOutPending): 2, string(bucketOutRetired): 2} {
		if per[b] != want {
			t.Fatalf("stale %s = %d, want %d (%v)", b, per[b], want, per)
		}
	}
	if n, err := db.Reseal(ctx, 1); err != nil || n != stale {
		t.Fatalf("Reseal = %d, %v; want %d", n, err, stale)
	}
	if _, stale := inboundStale(t, db, rot); stale != 0 {
		t.Fatalf("stale after reseal = %d", stale)
	}
	db.opts.Sealer = newTestSealer(2)
	if err := readInbound(db); err != nil {
		t.Fatalf("new key only: %v", err)
	}
	db.opts.Sealer = newTestSealer(1)
	if err := readInbound(db); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("old key only: %v, want ErrCorrupt", err)
	}
}

// A record moved to another row, or a damaged one, fails with ErrCorrupt
// on read and on enumeration: it is never treated as missing.
func TestInboundDamagedOrMovedRecordIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	s, err := sealed.New(sealed.Key{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, path, Options{NoSync: true, Sealer: s})
	defer db.Close()
	seedInbound(t, db, true)
	// Move alice's pending record under bob's key (a copy to another row).
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInPending)
		return b.Put(msgKey(ibBob, ibID(1)), b.Get(msgKey(ibAlice, ibID(0))))
	}); err != nil {
		t.Fatal(err)
	}
	err = db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		_, _, err := r.PendingInbound(ibBob, ibID(1))
		return err
	})
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("moved pending record: %v", err)
	}
	err = db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		return r.PendingInboundAfter(0, nil, func(persistence.PendingInbound) (bool, error) { return true, nil })
	})
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("enumeration over a moved record: %v", err)
	}
	// Another record type in the entry field (bob's processed row gets the
	// sealed frame of a pending row with the same identity): it fails.
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutPendingInbound(persistence.PendingInbound{Sender: ibBob, ID: ibID(11), Frame: []byte("frame")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		pin, err := decodePendingIn(tx.Bucket(bucketInPending).Get(msgKey(ibBob, ibID(11))))
		if err != nil {
			return err
		}
		rec, err := decodeProcessed(tx.Bucket(bucketInProcessed).Get(msgKey(ibBob, ibID(11))))
		if err != nil {
			return err
		}
		rec.Entry = pin.Frame
		nv, err := messages.Marshal(&rec)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketInProcessed).Put(msgKey(ibBob, ibID(11)), nv)
	}); err != nil {
		t.Fatal(err)
	}
	err = db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		_, _, err := r.ProcessedInbound(ibBob, ibID(11))
		return err
	})
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("record of another type: %v", err)
	}
	// A damaged entry fails.
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketInProcessed).Get(msgKey(ibAlice, ibID(10)))
		rec, err := decodeProcessed(v)
		if err != nil {
			return err
		}
		rec.Entry[len(rec.Entry)-1] ^= 1
		nv, err := messages.Marshal(&rec)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketInProcessed).Put(msgKey(ibAlice, ibID(10)), nv)
	}); err != nil {
		t.Fatal(err)
	}
	err = db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		_, _, err := r.ProcessedInbound(ibAlice, ibID(10))
		return err
	})
	if !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("damaged entry: %v", err)
	}
}

// A layout-3 file (before the commit-boundary buckets) migrates to the
// current layout and the new records work.
func TestMigrateLayout3To4(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	bdb, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:3], 3); err != nil {
		t.Fatal(err)
	}
	if err := bdb.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketInPending) != nil {
			t.Fatal("layout 3 already has the inbound buckets")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = bdb.Close()
	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	seedInbound(t, db, true)
	if err := readInbound(db); err != nil {
		t.Fatal(err)
	}
}

func TestTimeKeyOrdersSignedTimes(t *testing.T) {
	times := []int64{-1 << 62, -5, -1, 0, 1, 5, 1 << 62}
	for i := 1; i < len(times); i++ {
		if bytes.Compare(tsKey(times[i-1]), tsKey(times[i])) >= 0 {
			t.Fatalf("tsKey(%d) ≥ tsKey(%d)", times[i-1], times[i])
		}
	}
}

// FuzzDecodeInboundRecords: every commit-boundary record and key decoder
// returns a value or an error matching persistence.ErrCorrupt, never
// panics.
func FuzzDecodeInboundRecords(f *testing.F) {
	pin, _ := messages.Marshal(&pendingInRecord{V: 1, Seq: 3, ReceivedAt: 9, Frame: []byte{1}})
	pr, _ := messages.Marshal(&processedRecord{V: 2, Entry: []byte{1}})
	pr1, _ := messages.Marshal(&processedRecordV1{V: 1, Kind: 2, FinalizedAt: -3, Digest: []byte{1}, Reason: 4})
	pe, _ := messages.Marshal(&processedEntry{Kind: 1, FinalizedAt: 5, Digest: make([]byte, 32)})
	f.Add(pr1)
	f.Add(pe)
	out, _ := messages.Marshal(&outboundRecord{V: 1, Seq: 1, Attempts: 2, Body: []byte{}})
	f.Add(pin)
	f.Add(pr)
	f.Add(out)
	f.Add(msgKey(ibAlice, ibID(1)))
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(what string, err error) {
			if err != nil && !errors.Is(err, persistence.ErrCorrupt) {
				t.Fatalf("%s: %v does not match ErrCorrupt", what, err)
			}
		}
		_, err := decodePendingIn(data)
		check("pending", err)
		_, err = decodeProcessed(data)
		check("processed", err)
		_, err = decodeProcessedV1(data)
		check("processed (layout 10)", err)
		_, err = processedOf(ibAlice, ibID(1), data)
		check("processed entry", err)
		_, err = decodeOutbound(data)
		check("outbound", err)
		a, id, err := parseMsgKey(data)
		check("message key", err)
		if err == nil && !bytes.Equal(msgKey(a, id), data) {
			t.Fatalf("message key %x does not round-trip", data)
		}
	})
}

// inboundStale counts, per commit-boundary bucket, the sealed fields not
// under rot's current key.
func inboundStale(t *testing.T, db *DB, rot persistence.KeyRotator) (map[string]int, int) {
	t.Helper()
	per := map[string]int{}
	total := 0
	count := func(name []byte, sealedField []byte) {
		if sealedField != nil && !rot.IsCurrent(sealedField) {
			per[string(name)]++
			total++
		}
	}
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketInPending).ForEach(func(_, v []byte) error {
			r, err := decodePendingIn(v)
			count(bucketInPending, r.Frame)
			return err
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketInProcessed).ForEach(func(_, v []byte) error {
			r, err := decodeProcessed(v)
			count(bucketInProcessed, r.Entry)
			return err
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketOutPending).ForEach(func(_, v []byte) error {
			r, err := decodeOutbound(v)
			count(bucketOutPending, r.Body)
			return err
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketOutRetired).ForEach(func(_, v []byte) error {
			r, err := decodeRetired(v)
			count(bucketOutRetired, r.Entry)
			return err
		})
	}); err != nil {
		t.Fatal(err)
	}
	return per, total
}

// pendingInRecordV1 is the pending inbound record as written before the
// delivery count existed (CBOR keys 1–4 only).
type pendingInRecordV1 struct {
	V          uint64 `cbor:"1,keyasint"`
	Seq        uint64 `cbor:"2,keyasint"`
	ReceivedAt int64  `cbor:"3,keyasint"`
	Frame      []byte `cbor:"4,keyasint"`
}

// TestPendingRecordWithoutDeliveryCountReadsAsOne: a pending record
// written before the count (no key 5) decodes with the layout unchanged,
// reads as handed over once, and counting it writes 2 and keeps the
// sealed frame and the sequence.
func TestPendingRecordWithoutDeliveryCountReadsAsOne(t *testing.T) {
	var k sealed.Key
	for i := range k {
		k[i] = byte(i + 3)
	}
	s, err := sealed.New(k)
	if err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true, Sealer: s})
	defer db.Close()
	var seq uint64
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		seq, err = tx.PutPendingInbound(persistence.PendingInbound{Sender: ibAlice, ID: ibID(1), ReceivedAt: 5, Frame: []byte("frame"), Deliveries: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Rewrite the record as an older version wrote it: without key 5.
	key := msgKey(ibAlice, ibID(1))
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketInPending)
		r, err := decodePendingIn(b.Get(key))
		if err != nil {
			return err
		}
		if r.Deliveries == nil || *r.Deliveries != 1 {
			return fmt.Errorf("stored count %v, want 1", r.Deliveries)
		}
		old, err := messages.Marshal(&pendingInRecordV1{V: r.V, Seq: r.Seq, ReceivedAt: r.ReceivedAt, Frame: r.Frame})
		if err != nil {
			return err
		}
		if bytes.Equal(old, b.Get(key)) {
			return errors.New("the old encoding equals the new one: the test proves nothing")
		}
		return b.Put(key, old)
	}); err != nil {
		t.Fatal(err)
	}
	read := func() persistence.PendingInbound {
		t.Helper()
		var p persistence.PendingInbound
		if err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
			var ok bool
			p, ok, err = r.PendingInbound(ibAlice, ibID(1))
			if !ok && err == nil {
				err = errors.New("not pending")
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := read(); p.Deliveries != 1 || p.Sequence != seq || string(p.Frame) != "frame" {
		t.Fatalf("old record: %+v, want Deliveries 1, sequence %d, frame kept", p, seq)
	}
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		n, err := tx.CountInboundDelivery(ibAlice, ibID(1))
		if err == nil && n != 2 {
			err = fmt.Errorf("count %d, want 2", n)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Deliveries != 2 || p.Sequence != seq || string(p.Frame) != "frame" {
		t.Fatalf("after counting: %+v, want Deliveries 2, sequence %d, frame kept", p, seq)
	}
}
