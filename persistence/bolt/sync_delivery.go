package bolt

import (
	"fmt"

	bbolt "go.etcd.io/bbolt"
)

// SSP/1 §14 delivery buckets. Names are part of the storage format.
var (
	bucketSyncCursors    = []byte("sync.cursors")    // peer path → senderCursor record
	bucketSyncWatermarks = []byte("sync.watermarks") // site(16)|lp(schema)|lp(table) → watermark record
	bucketSyncPeers      = []byte("sync.peers")      // peer path → peerProgress record
)

// createSyncDeliveryV1 creates the SSP/1 §14 buckets (layout 2 → 3).
func createSyncDeliveryV1(tx *bbolt.Tx) error {
	for _, name := range [][]byte{bucketSyncCursors, bucketSyncWatermarks, bucketSyncPeers} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}
