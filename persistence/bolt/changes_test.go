package bolt

import (
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestMigrateLayout8To10AddsTheChangeLog writes a layout-8 file with a
// row in it, opens it: the migration adds the empty change log, keeps the
// row, and the first change appended gets sequence 1.
func TestMigrateLayout8To10AddsTheChangeLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v8.db")
	bdb, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:8], 8); err != nil {
		t.Fatal(err)
	}
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	row := persistence.Row{Schema: "s", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}, Exists: true,
		Existence: messages.Clock{HLC: 5, Site: messages.SiteID{1}},
		Cells:     map[string]persistence.Cell{"a": {Value: messages.MustValue("x"), Clock: messages.Clock{HLC: 5, Site: messages.SiteID{1}}}}}
	if err := bdb.Update(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketSyncChanges) != nil {
			t.Fatal("layout 8 already has the change log")
		}
		v, err := encodeRow(&row)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketSyncRows).Put(row.Key.AppendEncode(tablePrefix(nil, tk)), v)
	}); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}

	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if v, _ := layoutVersion(wrapTx(tx)); v != LayoutVersion || LayoutVersion < 10 {
			t.Fatalf("layout %d after Open", v)
		}
		if b := tx.Bucket(bucketSyncChanges); b == nil || b.Stats().KeyN != 0 {
			t.Fatal("no empty change log after the migration")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s := db.Sync()
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		got, ok, err := tx.Row(tk, row.Key.Encode())
		if err != nil || !ok || !got.Exists || !got.Cells["a"].Value.Equal(messages.MustValue("x")) {
			t.Fatalf("row after migration: %+v %v %v", got, ok, err)
		}
		if o, l, err := tx.ChangeBounds(); err != nil || o != 0 || l != 0 {
			t.Fatalf("bounds %d %d %v", o, l, err)
		}
		seq, err := tx.AppendChange(persistence.RowChange{Schema: "s", Table: "t", Key: row.Key, Exists: true, Cause: persistence.CauseEvent})
		if err != nil || seq != 1 {
			t.Fatalf("first change: seq %d, %v", seq, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
