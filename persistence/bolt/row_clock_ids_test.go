package bolt

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var updateFixtureV5 = flag.Bool("update-fixture-v5", false, "regenerate testdata/layout_v5_rows.db")

const fixtureV5Path = "testdata/layout_v5_rows.db"

// The layout-5 fixture: rows in record version 1 (clocks without ids) as
// nodes before layout 7 left them.
var (
	fxSite1, fxSite2, fxSite3 = messages.SiteID{1}, messages.SiteID{2}, messages.SiteID{3}
	fxRow1, fxRow2, fxRow9    = messages.Columns{"id": messages.MustValue(1)}, messages.Columns{"id": messages.MustValue(2)}, messages.Columns{"id": messages.MustValue(9)}
)

func fxEvent(idByte byte, site messages.SiteID, h messages.HLC, key messages.Columns) persistence.StoredEvent {
	var id persistence.EventID
	id[0], id[31] = idByte, 0x77
	return persistence.StoredEvent{ID: id, Raw: []byte{0xd2, idByte}, Site: site, HLC: h, Schema: fixtureTable.Schema, Table: fixtureTable.Table, RowKey: key.Encode()}
}

var (
	fxE1  = fxEvent(0x10, fxSite1, 10, fxRow1) // row 1's only writer
	fxE9  = fxEvent(0x90, fxSite1, 10, fxRow9) // same stamp as fxE1, another row
	fxE2a = fxEvent(0x2a, fxSite2, 20, fxRow2) // an equivocation materialized before layout 7
	fxE2b = fxEvent(0x2b, fxSite2, 20, fxRow2)
)

func v1Clock(h messages.HLC, s messages.SiteID) clockRecord {
	return clockRecord{HLC: uint64(h), Site: s[:]}
}

// TestGenerateFixtureV5Rows writes the frozen layout-5 file when run with
// -update-fixture-v5 (only the 0→5 migrations run, so it is layout 5
// whatever LayoutVersion is; rows are written in record version 1 by the
// reflective codec, byte-identical to the layout-5 encoder).
func TestGenerateFixtureV5Rows(t *testing.T) {
	if !*updateFixtureV5 {
		t.Skip("run with -update-fixture-v5 to regenerate " + fixtureV5Path)
	}
	_ = os.Remove(fixtureV5Path)
	bdb, err := bbolt.Open(fixtureV5Path, 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:5], 5); err != nil {
		t.Fatal(err)
	}
	db := &DB{bolt: bdb, log: discard()}
	defer db.Close()
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for _, e := range []persistence.StoredEvent{fxE1, fxE9, fxE2a, fxE2b} {
			if _, err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Update(func(tx *bbolt.Tx) error {
		rows := tx.Bucket(bucketSyncRows)
		put := func(key messages.Columns, rec rowRecord) error {
			rec.V = 1
			v, err := messages.Marshal(&rec)
			if err != nil {
				return err
			}
			return rows.Put(key.AppendEncode(tablePrefix(nil, fixtureTable)), v)
		}
		if err := put(fxRow1, rowRecord{Exists: true, Existence: v1Clock(10, fxSite1), Tomb: v1Clock(5, fxSite3), // tomb: reclaimed event
			Cells: map[string]cellRecord{"body": {Value: messages.MustValue("one"), Clock: v1Clock(10, fxSite1)}}}); err != nil {
			return err
		}
		return put(fxRow2, rowRecord{Exists: true, Existence: v1Clock(20, fxSite2),
			Cells: map[string]cellRecord{"body": {Value: messages.MustValue("first arrival"), Clock: v1Clock(20, fxSite2)}}})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOpenFixtureV5RowClocks opens a copy of the frozen layout-5 file:
// migration 6→7 gives every row clock the id of its event, found through
// the (site, HLC, id) index and filtered by row; a reclaimed event leaves
// a zero id; a pre-layout-7 equivocation gets the highest candidate.
func TestOpenFixtureV5RowClocks(t *testing.T) {
	src, err := os.Open(fixtureV5Path)
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "v5.db")
	dst, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if v, err := layoutVersion(wrapTx(tx)); err != nil || v != LayoutVersion {
			t.Fatalf("fixture migrated to layout %d (%v), want %d", v, err, LayoutVersion)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want1 := persistence.Row{Schema: fixtureTable.Schema, Table: fixtureTable.Table, Key: fxRow1, Exists: true,
		Existence: messages.Clock{HLC: 10, Site: fxSite1, ID: fxE1.ID}, Tomb: messages.Clock{HLC: 5, Site: fxSite3},
		Cells: map[string]persistence.Cell{"body": {Value: messages.MustValue("one"), Clock: messages.Clock{HLC: 10, Site: fxSite1, ID: fxE1.ID}}}}
	high := fxE2b.ID
	if bytes.Compare(fxE2a.ID[:], high[:]) > 0 {
		high = fxE2a.ID
	}
	want2 := persistence.Row{Schema: fixtureTable.Schema, Table: fixtureTable.Table, Key: fxRow2, Exists: true,
		Existence: messages.Clock{HLC: 20, Site: fxSite2, ID: high},
		Cells:     map[string]persistence.Cell{"body": {Value: messages.MustValue("first arrival"), Clock: messages.Clock{HLC: 20, Site: fxSite2, ID: high}}}}
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		for _, want := range []persistence.Row{want1, want2} {
			got, ok, err := r.Row(fixtureTable, want.Key.Encode())
			if err != nil || !ok {
				t.Fatalf("row %v: ok=%v err=%v", want.Key, ok, err)
			}
			if got.Existence != want.Existence || got.Tomb != want.Tomb || got.Exists != want.Exists ||
				got.Cells["body"].Clock != want.Cells["body"].Clock || !got.Cells["body"].Value.Equal(want.Cells["body"].Value) {
				t.Fatalf("row %v:\n got %+v\nwant %+v", want.Key, got, want)
			}
		}
		ids, err := r.EventIDsAt(fxSite2, 20, 0)
		if err != nil || len(ids) != 2 {
			t.Fatalf("EventIDsAt: %x, %v", ids, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Every row record is version 2 now: the strict reader reads them.
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketSyncRows).ForEach(func(k, v []byte) error {
			if _, err := readRow(fixtureTable, k[len(tablePrefix(nil, fixtureTable)):], v); err != nil {
				t.Fatalf("row %x not rewritten: %v", k, err)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
}

// A version-1 row record is refused by the layout-7 readers (until the
// migration rewrites it), and a version-2 record by the migration.
func TestRowRecordVersionsAreDistinct(t *testing.T) {
	v1, err := messages.Marshal(&rowRecord{V: 1, Exists: true, Existence: v1Clock(1, fxSite1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readRow(fixtureTable, fxRow1.Encode(), v1); !isCorrupt(err) {
		t.Fatalf("hand reader on a v1 row: %v", err)
	}
	if _, err := decodeRow(fixtureTable, fxRow1.Encode(), v1); !isCorrupt(err) {
		t.Fatalf("codec reader on a v1 row: %v", err)
	}
	v2, _ := encodeRow(&persistence.Row{Exists: true, Existence: messages.Clock{HLC: 1, Site: fxSite1, ID: fxE1.ID}})
	if _, err := rowV1ToV2(nil, nil, tablePrefix(nil, fixtureTable), v2); !isCorrupt(err) {
		t.Fatalf("migration on a v2 row: %v", err)
	}
}
