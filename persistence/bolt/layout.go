package bolt

import (
	"encoding/binary"
	"fmt"
	"log/slog"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/persistence"
)

// LayoutVersion is the layout this build writes. Open migrates older files
// to it and refuses newer ones (docs/protocol.md, "At rest": one versioned layout
// with an explicit migration list).
//
// Version 1: the sync plane (createV1). Version 2: the delivery plane's
// buckets (createDeliveryV1, delivery.go). Version 3: SSP/1 §14 delivery
// state — sender cursors, applied watermarks, per-sender receive progress
// (createSyncDeliveryV1, sync_delivery.go). Version 4: the delivery plane's
// commit-boundary records — pending inbound, processed inbound, pending
// outbound and their indexes (createInboundV1, inbound.go). Version 5: the
// event-id index keyed by (site, HLC, id) (migrateEventKeysV1,
// event_keys.go). Version 6: the SSP/1 §14 progress rule of authenticated
// origins — stored watermarks deleted, gap and re-offer lists one key
// each, held sizes and per-signer held totals (migrateSyncDeliveryV6,
// migrate_v6.go). Version 7: row clocks carry the event id, the last
// tiebreak of an equal (HLC, site) (migrateRowClockIDsV1, row_clock_ids.go).
// Version 8: the row → events index keyed by generation first
// (migrateRowGensV1, row_index.go). Version 9: the delivery plane's
// initiation version 2 — addresses and signature in the initiation,
// accepted last-resort initiation ids in the prekey store, skipped-key
// times in session records (markInitiationV2, initiation_v2.go).
// Version 10: the change log that Watch reads (createChangesV10,
// changes.go). Version 11: pins sealed with the address in the associated
// data, and each processed entry's finalization, time, digest, reason and
// legacy marker sealed together (resealDeliveryV11, migrate_v11.go).
// Version 12: reconciliation's range aggregate, per (table, site) counts
// and LtHash16 sums of the retained events' keys (migrateRangeSumsV12,
// reconcile_sums.go). Version 13: skipped message keys stored one entry
// each beside their session records, so a ratchet step writes only the
// keys it changed, with counts per peer and per device for the
// device-wide cap (splitSkippedV13, migrate_v13.go). Version 14: rows
// keyed in the natural order of their keys, and the secondary indexes'
// bucket (naturalRowsV14, migrate_v14.go). Version 15: the retired
// outbound ids, abandoned or acknowledged, with their sealed body digests
// (createRetiredV15, retired.go).
const LayoutVersion = 15

// Top-level buckets. Names are part of the storage format.
var (
	bucketMeta = []byte("meta") // layout_version, sync.last_seq

	bucketSyncTables   = []byte("sync.tables")     // lp(schema)|lp(table) → tableRecord
	bucketSyncEvents   = []byte("sync.events")     // seq(8, big-endian) → eventRecord (Raw sealed)
	bucketSyncEventIDs = []byte("sync.event_ids")  // layouts 1–4: event id(32) → seq(8); replaced by bucketSyncEventKeys
	bucketSyncRowIdx   = []byte("sync.row_events") // layouts 1–7: lp(schema)|lp(table)|lp(rowkey)|seq(8) → ∅; replaced by bucketSyncRowGens
	bucketSyncTableIdx = []byte("sync.table_hlc")  // lp(schema)|lp(table)|hlc(8)|seq(8) → ∅
	bucketSyncRows     = []byte("sync.rows")       // lp(schema)|lp(table)|ordered key|rowkey → rowRecord (layouts 1–13: lp(schema)|lp(table)|rowkey)
	bucketSyncHorizons = []byte("sync.horizons")   // lp(schema)|lp(table) → hlc(8)
	bucketSyncHeld     = []byte("sync.held")       // site(16)|lp(schema)|lp(table)|seq(8) → ∅
	bucketSyncMeta     = []byte("sync.meta")       // key → value
	bucketSyncSealed   = []byte("sync.sealed")     // record type(1)|key → sealed value
	bucketSyncKeys     = []byte("sync.keys")       // kid → keyRecord
	bucketSyncIndexes  = []byte("sync.indexes")    // layout 14: lp(schema)|lp(table)|lp(index)|entry → ∅ (indexes.go)
)

// Keys of bucketMeta.
var (
	metaLayoutVersion = []byte("layout_version")
	metaSyncLastSeq   = []byte("sync.last_seq") // highest seq ever assigned: never reused, even after deletions
)

// migration moves a file from layout version from to version to inside the
// Open transaction. A migration that seals records sets sealed instead of
// fn: it gets the Sealer the file is opened with (nil: plaintext).
type migration struct {
	from, to uint64
	fn       func(tx *wtx) error
	sealed   func(tx *wtx, s persistence.Sealer) error
}

// migrations is the ordered list applied by Open. Append only: a released
// migration is never edited.
var migrations = []migration{
	{from: 0, to: 1, fn: createV1},
	{from: 1, to: 2, fn: createDeliveryV1},
	{from: 2, to: 3, fn: createSyncDeliveryV1},
	{from: 3, to: 4, fn: createInboundV1},
	{from: 4, to: 5, fn: migrateEventKeysV1},
	{from: 5, to: 6, fn: migrateSyncDeliveryV6},
	{from: 6, to: 7, fn: migrateRowClockIDsV1},
	{from: 7, to: 8, fn: migrateRowGensV1},
	{from: 8, to: 9, fn: markInitiationV2},
	{from: 9, to: 10, fn: createChangesV10},
	{from: 10, to: 11, sealed: resealDeliveryV11},
	{from: 11, to: 12, fn: migrateRangeSumsV12},
	{from: 12, to: 13, sealed: splitSkippedV13},
	{from: 13, to: 14, fn: naturalRowsV14},
	{from: 14, to: 15, fn: createRetiredV15},
}

// createV1 creates the initial layout.
func createV1(tx *wtx) error {
	for _, name := range [][]byte{
		bucketSyncTables, bucketSyncEvents, bucketSyncEventIDs, bucketSyncRowIdx, bucketSyncTableIdx,
		bucketSyncRows, bucketSyncHorizons, bucketSyncHeld, bucketSyncMeta, bucketSyncSealed, bucketSyncKeys,
	} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// layoutVersion reads the file's layout version (0 for a new file).
func layoutVersion(tx *wtx) (uint64, error) {
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return 0, nil
	}
	v := m.Get(metaLayoutVersion)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("layout version is %d bytes: %w", len(v), persistence.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), nil
}

// migrate brings the file to LayoutVersion in one transaction; s is the
// Sealer the file is opened with.
func migrate(db *bbolt.DB, log *slog.Logger, s persistence.Sealer) error {
	return migrateSealed(db, log, s, migrations, LayoutVersion)
}

func migrateTo(db *bbolt.DB, log *slog.Logger, list []migration, target uint64) error {
	return migrateSealed(db, log, nil, list, target)
}

func migrateSealed(db *bbolt.DB, log *slog.Logger, s persistence.Sealer, list []migration, target uint64) error {
	return db.Update(func(btx *bbolt.Tx) error {
		tx := wrapTx(btx)
		v, err := layoutVersion(tx)
		if err != nil {
			return err
		}
		if v > target {
			return fmt.Errorf("file layout %d, this build knows %d: %w", v, target, persistence.ErrLayoutVersion)
		}
		if v == target {
			return nil
		}
		m, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		start := v
		for _, mg := range list {
			if mg.from != v || mg.to > target {
				continue
			}
			run := mg.fn
			if mg.sealed != nil {
				run = func(tx *wtx) error { return mg.sealed(tx, s) }
			}
			if err := run(tx); err != nil {
				return fmt.Errorf("migrate layout %d→%d: %w", mg.from, mg.to, err)
			}
			log.Debug("bolt: migrated layout", "from", mg.from, "to", mg.to)
			v = mg.to
		}
		if v != target {
			return fmt.Errorf("no migration path from layout %d to %d", v, target)
		}
		// One INFO line for an upgraded file; a new file is not news.
		if start > 0 {
			log.Info("bolt: upgraded layout", "from", start, "to", v)
		}
		return m.Put(metaLayoutVersion, u64(v))
	})
}
