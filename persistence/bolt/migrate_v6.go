package bolt

import (
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/messages"
)

// Layout 5 → 6: the SSP/1 §14 progress rule changes (only a peer's own,
// authenticated claims about its own site move a watermark), so:
//
//   - every stored watermark is deleted: one may have been raised by a
//     forged claim, and absence means "not applied", which fails closed
//     (§14.2). They are recomputed from the origins' next claims. This is
//     the one documented exception to monotonicity.
//   - receive progress and sender cursors move their gap and re-offer
//     lists out of the record into one key each (bucketSyncPeerGaps,
//     bucketSyncCursorRetry): layout 5 wrote up to 16 384 gaps in a
//     record the decoder read back only up to 4 096. Old records are read
//     with a decoder that has room for what layout 5 wrote; a record that
//     still does not decode is dropped (progress restarts at genesis, a
//     cursor re-offers from genesis: both fail closed).
//   - held entries gain their event's size, and each signer's held totals
//     are counted (bucketSyncHeldUsage).
func migrateSyncDeliveryV6(tx *wtx) error {
	for _, name := range [][]byte{bucketSyncPeerGaps, bucketSyncCursorRetry, bucketSyncHeldUsage} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	if _, err := deleteWatermarks(tx); err != nil {
		return err
	}
	dm, err := cbor.DecOptions{MaxArrayElements: 1 << 20, MaxMapPairs: 1 << 20}.DecMode()
	if err != nil {
		return err
	}
	type oldGap struct {
		_      struct{} `cbor:",toarray"`
		Seq    uint64
		Site   []byte
		Schema string
		Table  string
	}
	type oldProgress struct {
		V       uint64   `cbor:"v"`
		Log     []byte   `cbor:"log"`
		Through uint64   `cbor:"through"`
		Gaps    []oldGap `cbor:"gaps"`
	}
	type oldCursor struct {
		V     uint64   `cbor:"v"`
		Seq   uint64   `cbor:"seq"`
		Retry []uint64 `cbor:"retry"`
	}
	peers, gaps := tx.Bucket(bucketSyncPeers), tx.Bucket(bucketSyncPeerGaps)
	var drop [][]byte
	rewrite := map[string][]byte{}
	if err := peers.ForEach(func(k, v []byte) error {
		var rec oldProgress
		if err := dm.Unmarshal(v, &rec); err != nil || rec.V != recordVersion {
			drop = append(drop, clone(k))
			return nil
		}
		nv, err := messages.Marshal(&progressRecord{V: recordVersion, Log: rec.Log, Through: rec.Through})
		if err != nil {
			return err
		}
		rewrite[string(k)] = nv
		for _, g := range rec.Gaps {
			gv, err := messages.Marshal(&gapRecord{Site: g.Site, Schema: g.Schema, Table: g.Table})
			if err != nil {
				return err
			}
			if err := gaps.Put(binary.BigEndian.AppendUint64(appendLP(nil, k), g.Seq), gv); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range drop {
		if err := peers.Delete(k); err != nil {
			return err
		}
	}
	for k, v := range rewrite {
		if err := peers.Put([]byte(k), v); err != nil {
			return err
		}
	}
	cursors, retry := tx.Bucket(bucketSyncCursors), tx.Bucket(bucketSyncCursorRetry)
	drop, rewrite = nil, map[string][]byte{}
	if err := cursors.ForEach(func(k, v []byte) error {
		var rec oldCursor
		if err := dm.Unmarshal(v, &rec); err != nil || rec.V != recordVersion {
			drop = append(drop, clone(k))
			return nil
		}
		nv, err := messages.Marshal(&cursorRecord{V: recordVersion, Seq: rec.Seq})
		if err != nil {
			return err
		}
		rewrite[string(k)] = nv
		for _, seq := range rec.Retry {
			if err := retry.Put(binary.BigEndian.AppendUint64(appendLP(nil, k), seq), empty); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range drop {
		if err := cursors.Delete(k); err != nil {
			return err
		}
	}
	for k, v := range rewrite {
		if err := cursors.Put([]byte(k), v); err != nil {
			return err
		}
	}
	held, events := tx.Bucket(bucketSyncHeld), tx.Bucket(bucketSyncEvents)
	type entry struct {
		k    []byte
		size uint64
	}
	var entries []entry
	if err := held.ForEach(func(k, _ []byte) error {
		g, seq, err := parseGroupKey(k)
		if err != nil {
			return err
		}
		size := uint64(len(events.Get(u64(seq))))
		entries = append(entries, entry{clone(k), size})
		return addUsage(tx, g.Site, 1, int64(size))
	}); err != nil {
		return err
	}
	for _, e := range entries {
		if err := held.Put(e.k, u64(e.size)); err != nil {
			return err
		}
	}
	return nil
}
