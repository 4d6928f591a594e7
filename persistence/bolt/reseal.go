package bolt

import (
	"bytes"
	"context"
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// resealer re-seals one stored value of a sealed bucket under the current
// key: it returns the new value, or nil when v is already current.
type resealer func(rot persistence.KeyRotator, k, v []byte) ([]byte, error)

// sealedBucket is one bucket holding values sealed at rest (docs/protocol.md,
// "At rest"), with how its values are re-sealed on key rotation.
type sealedBucket struct {
	name  []byte
	redo  resealer
	notes string // what is sealed, with which record type and identity
}

// sealedBuckets lists EVERY bucket holding sealed values, in reseal order.
// Reseal walks exactly this list; plaintextBuckets lists the others, and
// TestEveryBucketIsClassified fails for a bucket in neither list, so a new
// sealed bucket cannot be left out of key rotation unnoticed (the
// requirement: "storage key rotation re-encrypts every sealed column in
// one pass that is safe to interrupt and resume").
var sealedBuckets = []sealedBucket{
	{bucketSyncEvents, resealEvent, "eventRecord.Raw: RecordEvent, identity = event id"},
	{bucketSyncSealed, resealMeta, "whole value: record type from key[0], identity = key[1:]"},
	{bucketDeliveryMeta, resealDeliveryMeta, `"identity": RecordIdentity/DeviceIdentity(); "prekeys": RecordPrekey/PrekeyIdentity(PrekeyStoreIdentity)`},
	{bucketDeliverySessions, resealSession, "whole value: RecordSession, identity = SessionIdentity(peer user, u32be device)"},
	{bucketDeliveryPins, resealPin, "whole value (layout 11): RecordPin, identity = PinIdentity(peer user, u32be device)"},
	{bucketDeliverySkipped, resealSkipped, "whole value (layout 13): RecordSkippedKey, identity = Identity(peer user, u32be device, u64be key number)"},
	{bucketInPending, resealPendingIn, "pendingInRecord.Frame: RecordPendingFrame, identity = MessageIdentity(sender user, u32be device, id)"},
	{bucketInProcessed, resealProcessed, "processedRecord.Entry (layout 11): RecordProcessedEntry, identity = MessageIdentity(sender user, u32be device, id)"},
	{bucketOutPending, resealOutbound, "outboundRecord.Body: RecordOutboundBody, identity = MessageIdentity(recipient user, u32be device, id)"},
	{bucketOutRetired, resealRetired, "retiredRecord.Entry (layout 15): RecordRetiredOutbound, identity = MessageIdentity(recipient user, u32be device, id)"},
}

// plaintextBuckets lists the buckets holding no sealed value: indexes,
// public keys, clocks and counters (nothing secret; docs/protocol.md, "At rest"
// seals frames, digests, bodies, session state and the event log).
var plaintextBuckets = [][]byte{
	bucketMeta,
	bucketSyncTables, bucketSyncEventKeys, bucketSyncRowGens, bucketSyncTableIdx, bucketSyncRows,
	bucketSyncHorizons, bucketSyncHeld, bucketSyncMeta, bucketSyncKeys,
	bucketSyncCursors, bucketSyncWatermarks, bucketSyncPeers, // SSP/1 §14 progress: sequence numbers and clocks
	bucketSyncPeerGaps, bucketSyncCursorRetry, bucketSyncHeldUsage, // layout 6: gaps, re-offers, held totals (sequences, group names, counts)
	bucketInPendingSeq, bucketInPendingSender, bucketInProcessedTime, bucketOutPendingSeq, // commit-boundary indexes: sequences, times, ids
	bucketInMeta,               // commit-boundary counters
	bucketSyncChanges,          // layout 10: the change log (row states, plaintext as bucketSyncRows is)
	bucketSyncRangeSums,        // layout 12: counts and hashes of event keys (plaintext as bucketSyncEventKeys is)
	bucketDeliverySkippedCount, // layout 13: skipped keys stored per peer (counts)
	bucketSyncIndexes,          // layout 14: secondary index entries (plaintext as bucketSyncRows is)
	bucketOutRetiredTime,       // layout 15: retired outbound times and ids
}

// Reseal re-seals, under the current storage key, every sealed record the
// Sealer reports as not current (persistence.KeyRotator.IsCurrent), in
// every bucket of sealedBuckets: the event log's Raw, the sealed meta
// values, the device identity, the prekey store and the session records.
// It commits at most batch records per transaction (batch ≤ 0: 256). Each
// batch is durable on its own and already-current records are skipped, so
// an interrupted Reseal loses nothing and running it again continues where
// it stopped. Without a KeyRotator it does nothing and returns 0.
//
// A record that the Sealer cannot open fails Reseal with an error matching
// persistence.ErrCorrupt (a damaged record is an error, never skipped).
func (d *DB) Reseal(ctx context.Context, batch int) (resealed int, err error) {
	rot, ok := d.opts.Sealer.(persistence.KeyRotator)
	if !ok {
		return 0, nil
	}
	if batch <= 0 {
		batch = 256
	}
	for _, sb := range sealedBuckets {
		var from []byte // resume key within this call: first key not yet examined
		for {
			if err := d.begin(ctx, "reseal"); err != nil {
				return resealed, err
			}
			n, next, err := d.resealBatch(ctx, rot, sb.name, from, batch, sb.redo)
			resealed += n
			if err != nil {
				return resealed, mapErr("reseal", err)
			}
			if n > 0 {
				d.log.Info("bolt: resealed batch", "bucket", string(sb.name), "records", n)
				if err := d.failpoint(FailpointResealAfterBatch); err != nil {
					return resealed, err
				}
			}
			if next == nil {
				break
			}
			from = next
		}
	}
	return resealed, nil
}

// resealBatch re-seals up to batch stale records of bucket from key from on,
// in one transaction. next is the key to continue from (nil: done).
func (d *DB) resealBatch(ctx context.Context, rot persistence.KeyRotator, bucket, from []byte, batch int, redo resealer) (n int, next []byte, err error) {
	err = d.update(ctx, func(tx *wtx) error {
		n, next = 0, nil
		b := tx.Bucket(bucket)
		if b == nil {
			return fmt.Errorf("bolt: bucket %s missing: %w", bucket, persistence.ErrCorrupt)
		}
		type kv struct{ k, v []byte }
		var todo []kv
		c := b.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		for ; k != nil; k, v = c.Next() {
			if len(todo) == batch {
				next = clone(k)
				break
			}
			nv, err := redo(rot, k, v)
			if err != nil {
				return err
			}
			if nv != nil {
				todo = append(todo, kv{clone(k), nv})
			}
		}
		for _, e := range todo {
			if err := b.Put(e.k, e.v); err != nil {
				return err
			}
		}
		n = len(todo)
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return n, next, nil
}

// resealValue re-seals a whole stored value as (rt, identity), or returns
// nil when it is current.
func resealValue(rot persistence.KeyRotator, what string, rt persistence.RecordType, identity, v []byte) ([]byte, error) {
	if rot.IsCurrent(v) {
		return nil, nil
	}
	p, err := rot.Open(rt, identity, v)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal %s: %w: %w", what, persistence.ErrCorrupt, err)
	}
	out, err := rot.Seal(rt, identity, p)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal %s: %w", what, err)
	}
	return out, nil
}

// resealEvent returns the event record re-sealed, or nil when it is current.
func resealEvent(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	var rec eventRecord
	if err := decodeRecord("event", v, &rec, &rec.V); err != nil {
		return nil, err
	}
	raw, err := resealValue(rot, fmt.Sprintf("event %x", k), persistence.RecordEvent, rec.ID, rec.Raw)
	if raw == nil || err != nil {
		return nil, err
	}
	rec.Raw = raw
	return messages.Marshal(&rec)
}

// resealMeta returns the sealed meta value re-sealed, or nil when current
// (identity as PutSealedMeta: the raw key).
func resealMeta(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	if len(k) < 1 {
		return nil, fmt.Errorf("bolt: sealed meta key empty: %w", persistence.ErrCorrupt)
	}
	key := bytes.Clone(k[1:])
	return resealValue(rot, fmt.Sprintf("meta %q", key), persistence.RecordType(k[0]), key, v)
}

// resealDeliveryMeta re-seals the local identity or the prekey store, with
// the record type and identity deliveryTx uses for each key. An unknown key
// is an error: it would be a sealed value Reseal cannot classify.
func resealDeliveryMeta(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	switch {
	case bytes.Equal(k, deliveryKeyIdentity):
		return resealValue(rot, "local identity", persistence.RecordIdentity, sealed.DeviceIdentity(), v)
	case bytes.Equal(k, deliveryKeyPrekeys):
		return resealValue(rot, "prekeys", persistence.RecordPrekey, sealed.PrekeyIdentity([]byte(persistence.PrekeyStoreIdentity)), v)
	default:
		return nil, fmt.Errorf("bolt: reseal: unknown delivery meta key %q: %w", k, persistence.ErrCorrupt)
	}
}

// resealSession re-seals one session record; its identity is derived from
// the bucket key (the peer's address), as in deliveryTx.Session.
func resealSession(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, err := parseAddrKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal session: %w", err)
	}
	return resealValue(rot, "session "+peer.String(), persistence.RecordSession, sessionIdentity(peer), v)
}

// resealPin re-seals one pin; its identity is derived from the bucket key
// (the peer's address), as in deliveryTx.Pin.
func resealPin(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, err := parseAddrKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal pin: %w", err)
	}
	return resealValue(rot, "pin "+peer.String(), persistence.RecordPin, pinIdentity(peer), v)
}
