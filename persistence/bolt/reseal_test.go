package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// sealedBytes returns the sealed part of a value of a sealed bucket.
func sealedBytes(t *testing.T, bucket, v []byte) []byte {
	t.Helper()
	var part []byte
	var err error
	switch {
	case bytes.Equal(bucket, bucketInPending):
		var r pendingInRecord
		r, err = decodePendingIn(v)
		part = r.Frame
	case bytes.Equal(bucket, bucketInProcessed):
		var r processedRecord
		r, err = decodeProcessed(v)
		part = r.Entry
	case bytes.Equal(bucket, bucketOutPending):
		var r outboundRecord
		r, err = decodeOutbound(v)
		part = r.Body
	case bytes.Equal(bucket, bucketOutRetired):
		var r retiredRecord
		r, err = decodeRetired(v)
		part = r.Entry
	case !bytes.Equal(bucket, bucketSyncEvents):
		return v
	default:
		var rec eventRecord
		if err := decodeRecord("event", v, &rec, &rec.V); err != nil {
			t.Fatal(err)
		}
		return rec.Raw
	}
	if err != nil {
		t.Fatal(err)
	}
	return part
}

// staleCounts counts, per sealed bucket, the values not under the sealer's
// current key.
func staleCounts(t *testing.T, db *DB, rot persistence.KeyRotator) (map[string]int, int) {
	t.Helper()
	per := map[string]int{}
	total := 0
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		for _, sb := range sealedBuckets {
			if err := tx.Bucket(sb.name).ForEach(func(_, v []byte) error {
				if !rot.IsCurrent(sealedBytes(t, sb.name, v)) {
					per[string(sb.name)]++
					total++
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return per, total
}

// TestEveryBucketIsClassified: every bucket of a current-layout file is
// either resealed (sealedBuckets) or declared plaintext (plaintextBuckets),
// never both, and every listed bucket exists. A new bucket added to the
// layout without a decision fails here, so key rotation cannot silently
// miss a sealed column.
func TestEveryBucketIsClassified(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	class := map[string]string{}
	for _, sb := range sealedBuckets {
		class[string(sb.name)] = "sealed"
	}
	for _, b := range plaintextBuckets {
		if class[string(b)] != "" {
			t.Errorf("bucket %s is listed both sealed and plaintext (or twice)", b)
		}
		class[string(b)] = "plaintext"
	}
	seen := map[string]bool{}
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			seen[string(name)] = true
			if class[string(name)] == "" {
				t.Errorf("bucket %s is neither in sealedBuckets (reseal.go) nor in plaintextBuckets: decide whether it holds sealed values", name)
			}
			// Nested buckets would escape both lists.
			return b.ForEachBucket(func(k []byte) error {
				t.Errorf("bucket %s has a nested bucket %q that no list covers", name, k)
				return nil
			})
		})
	}); err != nil {
		t.Fatal(err)
	}
	for name := range class {
		if !seen[name] {
			t.Errorf("listed bucket %s does not exist in a layout-%d file", name, LayoutVersion)
		}
	}
}

var resealPeers = []messages.DeviceAddress{
	{User: "alice", Device: 1}, {User: "alice", Device: 2}, {User: "bob", Device: 1},
	{User: "c\x00rol", Device: 7}, {User: "dave", Device: 1}, {User: "erin", Device: 3}, {User: "frank", Device: 9},
}

// seedAll writes records into every sealed bucket: events, sealed meta,
// the local identity, the prekey store and sessions.
func seedAll(t *testing.T, db *DB, tk persistence.TableKey, events int) {
	t.Helper()
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for i := 1; i <= events; i++ {
			if _, err := tx.AppendEvent(testEvent(byte(i), tk)); err != nil {
				return err
			}
		}
		for i := range 3 {
			if err := tx.PutSealedMeta(persistence.RecordNodeKey, fmt.Sprint("k", i), []byte(fmt.Sprint("secret", i))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := tx.PutLocalIdentity([]byte("device-identity-secret")); err != nil {
			return err
		}
		if err := tx.PutPrekeys([]byte("prekey-store-secret")); err != nil {
			return err
		}
		for i, p := range resealPeers {
			if err := tx.PutSession(p, []byte(fmt.Sprint("session-", i))); err != nil {
				return err
			}
			if err := tx.PutPin(p, seededPin(i)); err != nil {
				return err
			}
			if err := tx.PutSkippedKey(p, uint64(i+1), []byte(fmt.Sprint("skipped-", i))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seedInbound(t, db, false) // 8 sealed commit-boundary records (inbound_test.go)
}

// seededPin is the pin seedAll stores for resealPeers[i].
func seededPin(i int) messages.IdentityKey {
	var k messages.IdentityKey
	k.Sign[0], k.DH[0] = byte(i+1), byte(i+101)
	return k
}

// readAll opens every seeded record through the stores with db's sealer.
func readAll(db *DB, tk persistence.TableKey, events int) error {
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		seen := 0
		if err := r.EventsAfter(0, 0, func(ev persistence.StoredEvent) (bool, error) {
			if want := testEvent(ev.ID[0], tk).Raw; !bytes.Equal(ev.Raw, want) {
				return false, fmt.Errorf("event %d Raw = %x, want %x", ev.Seq, ev.Raw, want)
			}
			seen++
			return true, nil
		}); err != nil {
			return err
		}
		if seen != events {
			return fmt.Errorf("saw %d events, want %d", seen, events)
		}
		for i := range 3 {
			v, ok, err := r.SealedMeta(persistence.RecordNodeKey, fmt.Sprint("k", i))
			if err != nil || !ok || string(v) != fmt.Sprint("secret", i) {
				return fmt.Errorf("sealed meta %d = %q, %v, %w", i, v, ok, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := db.Delivery().View(ctx, func(r persistence.DeliveryReader) error {
		if v, ok, err := r.LocalIdentity(); err != nil || !ok || string(v) != "device-identity-secret" {
			return fmt.Errorf("local identity = %q, %v, %w", v, ok, err)
		}
		if v, ok, err := r.Prekeys(); err != nil || !ok || string(v) != "prekey-store-secret" {
			return fmt.Errorf("prekeys = %q, %v, %w", v, ok, err)
		}
		for i, p := range resealPeers {
			if v, ok, err := r.Session(p); err != nil || !ok || string(v) != fmt.Sprint("session-", i) {
				return fmt.Errorf("session %s = %q, %v, %w", p, v, ok, err)
			}
			if k, ok, err := r.Pin(p); err != nil || !ok || k != seededPin(i) {
				return fmt.Errorf("pin %s = %v, %v, %w", p, k, ok, err)
			}
			var got []string
			if err := r.SkippedKeys(p, func(seq uint64, e []byte) (bool, error) {
				got = append(got, fmt.Sprint(seq, string(e)))
				return true, nil
			}); err != nil {
				return err
			}
			if want := fmt.Sprint(i+1, "skipped-", i); len(got) != 1 || got[0] != want {
				return fmt.Errorf("skipped keys of %s = %q, want [%s]", p, got, want)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return readInbound(db)
}

// TestResealCoversEverySealedBucketInterruptiblyAndResumes: the storage key
// rotation requirement — every sealed column is re-encrypted in one pass
// that is safe to interrupt and resume; afterwards the new key alone opens
// everything.
func TestResealCoversEverySealedBucketInterruptiblyAndResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	const events = 23
	const inbound = 8                                      // pending frames, processed entries, outbound bodies, retired entries (seedInbound)
	total := events + 3 + 2 + 3*len(resealPeers) + inbound // events, sealed meta, identity+prekeys, sessions, pins and skipped keys, commit boundary
	db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(1)})
	seedAll(t, db, tk, events)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Rotate: key 2 is current, key 1 still opens. Crash after batch crashAt.
	rot := newTestSealer(2, 1)
	crashAt, batches := 0, 0
	opts := Options{NoSync: true, Sealer: rot, Logger: discard(), Failpoint: func(name string) error {
		if name == FailpointResealAfterBatch {
			if batches++; batches == crashAt {
				return persistence.ErrInjected
			}
		}
		return nil
	}}
	db = mustOpen(t, path, opts)
	per, stale := staleCounts(t, db, rot)
	if stale != total {
		t.Fatalf("stale before reseal = %d (%v), want %d", stale, per, total)
	}
	for _, sb := range sealedBuckets {
		if per[string(sb.name)] == 0 {
			t.Fatalf("the seed left sealed bucket %s empty: the test would not cover it", sb.name)
		}
	}

	// Run 1 crashes in the event log (batches of 5: 5, 5).
	crashAt = 2
	n, err := db.Reseal(ctx, 5)
	if !errors.Is(err, persistence.ErrInjected) || n != 10 {
		t.Fatalf("interrupted Reseal = %d, %v; want 10, ErrInjected", n, err)
	}
	if _, stale := staleCounts(t, db, rot); stale != total-10 {
		t.Fatalf("stale after run 1 = %d, want %d", stale, total-10)
	}
	// Restart; run 2 crashes in the sessions: events 5,5,3, sealed meta 3,
	// delivery meta 2, sessions 5 (the 6th batch).
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = mustOpen(t, path, opts)
	crashAt, batches = 6, 0
	n, err = db.Reseal(ctx, 5)
	if want := 13 + 3 + 2 + 5; !errors.Is(err, persistence.ErrInjected) || n != want {
		t.Fatalf("second interrupted Reseal = %d, %v; want %d, ErrInjected", n, err, want)
	}
	per, stale = staleCounts(t, db, rot)
	pins := len(resealPeers)
	skipped := len(resealPeers)
	if stale != 2+pins+skipped+inbound || per[string(bucketDeliverySessions)] != 2 || per[string(bucketDeliveryPins)] != pins || per[string(bucketDeliverySkipped)] != skipped {
		t.Fatalf("stale after run 2 = %d (%v), want 2 sessions + %d pins + %d skipped keys + %d commit-boundary records", stale, per, pins, skipped, inbound)
	}
	// Restart and resume: the rest is resealed, nothing twice.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	opts.Failpoint = nil
	db = mustOpen(t, path, opts)
	defer db.Close()
	if n, err := db.Reseal(ctx, 5); err != nil || n != 2+pins+skipped+inbound {
		t.Fatalf("resumed Reseal = %d, %v; want %d", n, err, 2+pins+skipped+inbound)
	}
	if _, stale := staleCounts(t, db, rot); stale != 0 {
		t.Fatalf("stale after reseal = %d", stale)
	}
	if n, err := db.Reseal(ctx, 5); err != nil || n != 0 {
		t.Fatalf("repeated Reseal = %d, %v; want 0", n, err)
	}
	// Everything opens under the new key alone, and no longer under the old.
	db.opts.Sealer = newTestSealer(2)
	if err := readAll(db, tk, events); err != nil {
		t.Fatalf("with the new key only: %v", err)
	}
	db.opts.Sealer = newTestSealer(1)
	if err := readAll(db, tk, events); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("with the old key only: %v, want ErrCorrupt", err)
	}
}

// TestResealDamagedRecordIsCorrupt: a record Reseal cannot open stops it
// with persistence.ErrCorrupt (docs/protocol.md, "At rest": a damaged record is an
// error, never "missing"); the record is left as it was.
func TestResealDamagedRecordIsCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bucket []byte
		key    []byte
	}{
		{"session", bucketDeliverySessions, addrKey(messages.DeviceAddress{User: "alice", Device: 1})},
		{"identity", bucketDeliveryMeta, deliveryKeyIdentity},
		{"unknown delivery meta key", bucketDeliveryMeta, []byte("mystery")},
		{"session under a malformed key", bucketDeliverySessions, []byte("no-terminator")},
		{"skipped key", bucketDeliverySkipped, skippedKeyOf(messages.DeviceAddress{User: "alice", Device: 1}, 7)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "node.db")
			db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(1)})
			// A value under key 1 whose ciphertext is damaged.
			bad, err := newTestSealer(1).Seal(persistence.RecordSession, []byte("x"), []byte("y"))
			if err != nil {
				t.Fatal(err)
			}
			bad[len(bad)-1] ^= 1
			if err := db.bolt.Update(func(tx *bbolt.Tx) error { return tx.Bucket(tc.bucket).Put(tc.key, bad) }); err != nil {
				t.Fatal(err)
			}
			db.opts.Sealer = newTestSealer(2, 1)
			if n, err := db.Reseal(ctx, 0); !errors.Is(err, persistence.ErrCorrupt) || n != 0 {
				t.Fatalf("Reseal = %d, %v; want 0, ErrCorrupt", n, err)
			}
			if err := db.bolt.View(func(tx *bbolt.Tx) error {
				if got := tx.Bucket(tc.bucket).Get(tc.key); !bytes.Equal(got, bad) {
					t.Fatalf("damaged record changed to %x", got)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
		})
	}
}

func TestResealWithoutRotatorIsNoop(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	if n, err := db.Reseal(ctx, 10); n != 0 || err != nil {
		t.Fatalf("Reseal without a rotator = %d, %v", n, err)
	}
}
