package bolt

import (
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// bucketSyncEventKeys is the event-id index from layout 5 on:
// site(16)|hlc(8)|id(32) → seq(8). Keyed by the event's site and HLC
// first, a site's events — which arrive roughly in HLC order — land next
// to each other: in a store of a million events a commit rewrites a few
// index pages per site instead of one page per event (a bare event id is
// random, and each random key dirties its own page).
var bucketSyncEventKeys = []byte("sync.event_keys")

// eventKey appends the index key of an event to b.
func eventKey(b []byte, site messages.SiteID, h messages.HLC, id persistence.EventID) []byte {
	b = append(b, site[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(h))
	return append(b, id[:]...)
}

// migrateEventKeysV1 (layout 4 → 5) rebuilds the event-id index keyed by
// (site, HLC, id) from the event log's plaintext index fields, then drops
// the index keyed by id alone. It runs in the Open transaction: all or
// nothing.
func migrateEventKeysV1(tx *wtx) error {
	keys, err := tx.CreateBucketIfNotExists(bucketSyncEventKeys)
	if err != nil {
		return fmt.Errorf("create bucket %s: %w", bucketSyncEventKeys, err)
	}
	events := tx.Bucket(bucketSyncEvents)
	if events == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketSyncEvents, persistence.ErrCorrupt)
	}
	err = events.ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("event key of %d bytes: %w", len(k), persistence.ErrCorrupt)
		}
		ev, err := decodeEvent(binary.BigEndian.Uint64(k), v)
		if err != nil {
			return err
		}
		return keys.Put(eventKey(nil, ev.Site, ev.HLC, ev.ID), append([]byte(nil), k...))
	})
	if err != nil {
		return err
	}
	if tx.Bucket(bucketSyncEventIDs) != nil {
		if err := tx.DeleteBucket(bucketSyncEventIDs); err != nil {
			return fmt.Errorf("drop bucket %s: %w", bucketSyncEventIDs, err)
		}
	}
	return nil
}
