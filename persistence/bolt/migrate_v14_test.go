package bolt

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// testdata/layout_v13_rows.db is a layout-13 file written by e984fa1's
// store (PutTable, PutRow, PutMeta; then bbolt.Compact) and frozen. It
// holds app.c, keyed (z integer, a text) in that order, with rows
// (2,x) (1,yy) (1,b) (-5,zz) (300,""); app.s, keyed k, with rows
// "zzz" "ab" "Z" "b" (tombstoned) "aa" "c" -1 10; and a column rebuild of
// app.s.v pending after the row "ab" (in the CBOR order).
const fixtureV13Rows = "testdata/layout_v13_rows.db"

// rawBuckets copies every top-level bucket's entries (nested buckets
// by name only).
func rawBuckets(t *testing.T, path string) map[string]map[string]string {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]map[string]string{}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			m := map[string]string{}
			out[string(name)] = m
			return b.ForEach(func(k, v []byte) error {
				m[string(k)] = string(v)
				return nil
			})
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMigrateLayout13To14NaturalRowOrder(t *testing.T) {
	raw, err := os.ReadFile(fixtureV13Rows)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "v13.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	before := rawBuckets(t, path)
	if v := before[string(bucketMeta)][string(metaLayoutVersion)]; v != string(u64(13)) {
		t.Fatalf("fixture layout %x, want 13", v)
	}

	db := mustOpen(t, path, Options{NoSync: true})
	keysOf := func(r persistence.SyncReader, table string, cols ...string) []string {
		var out []string
		if err := r.Rows(persistence.TableKey{Schema: "app", Table: table}, nil, func(k []byte, row persistence.Row) (bool, error) {
			if !bytes.Equal(k, row.Key.Encode()) {
				t.Fatalf("row %v under key %x", row.Key, k)
			}
			var parts []any
			for _, c := range cols {
				var v any
				if err := row.Key[c].Decode(&v); err != nil {
					return false, err
				}
				parts = append(parts, v)
			}
			s := fmt.Sprint(parts...)
			if !row.Exists {
				s += "(deleted)"
			}
			out = append(out, s)
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		if got, want := keysOf(r, "c", "z", "a"), []string{"-5zz", "1b", "1yy", "2x", "300"}; !slices.Equal(got, want) {
			t.Errorf("app.c rows %q, want %q", got, want)
		}
		if got, want := keysOf(r, "s", "k"), []string{"-1", "10", "Z", "aa", "ab", "b(deleted)", "c", "zzz"}; !slices.Equal(got, want) {
			t.Errorf("app.s rows %q, want %q", got, want)
		}
		// Point lookups by the encoded key find the moved rows, values intact.
		row, ok, err := r.Row(persistence.TableKey{Schema: "app", Table: "c"}, messages.Columns{"z": messages.MustValue(1), "a": messages.MustValue("yy")}.Encode())
		if err != nil || !ok {
			t.Fatalf("Row (1, yy): %v, %v", ok, err)
		}
		var v string
		if err := row.Cells["v"].Value.Decode(&v); err != nil || v != "yy!" {
			t.Fatalf("Row (1, yy) v = %q, %v", v, err)
		}
		// The pending column rebuild restarts from the first row.
		b, ok, err := r.Meta("sync.column_rebuilds")
		if err != nil || !ok {
			t.Fatalf("column rebuilds: %v %v", ok, err)
		}
		var rs []map[int]any
		if err := messages.Unmarshal("rebuilds", b, &rs, 1<<16); err != nil || len(rs) != 1 || rs[0][3] != "v" || rs[0][4] != nil {
			t.Fatalf("column rebuilds after migration: %v %v, want app.s.v from the start", rs, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Only the rows (re-keyed), the sync meta (the rebuild's progress)
	// and the layout version changed, and the index bucket is new: events,
	// event ids and every other bucket are byte for byte as they were.
	after := rawBuckets(t, path)
	if v := after[string(bucketMeta)][string(metaLayoutVersion)]; v != string(u64(LayoutVersion)) {
		t.Fatalf("layout after Open %x, want %d", v, LayoutVersion)
	}
	for name, entries := range before {
		switch name {
		case string(bucketSyncRows), string(bucketSyncMeta), string(bucketMeta):
			if len(after[name]) != len(entries) {
				t.Errorf("bucket %s: %d entries, had %d", name, len(after[name]), len(entries))
			}
			continue
		}
		if fmt.Sprint(after[name]) != fmt.Sprint(entries) {
			t.Errorf("bucket %s changed by the migration", name)
		}
	}
	if e, ok := after[string(bucketSyncIndexes)]; !ok || len(e) != 0 {
		t.Errorf("index bucket after migration: %v entries, present %v", len(e), ok)
	}
	// Row values moved unchanged.
	var bv, av []string
	for _, v := range before[string(bucketSyncRows)] {
		bv = append(bv, v)
	}
	for _, v := range after[string(bucketSyncRows)] {
		av = append(av, v)
	}
	slices.Sort(bv)
	slices.Sort(av)
	if !slices.Equal(bv, av) {
		t.Error("row records changed by the migration")
	}
}
