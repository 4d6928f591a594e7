package bolt

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"slices"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// oldRowIdxKey is the row index key of layouts 1–7:
// lp(schema)|lp(table)|lp(rowkey)|seq.
func oldRowIdxKey(t persistence.TableKey, rowKey []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(appendLP(tablePrefix(nil, t), rowKey), seq)
}

func rowSeqs(t *testing.T, r persistence.SyncReader, tk persistence.TableKey, row []byte) []uint64 {
	t.Helper()
	var out []uint64
	if err := r.RowEvents(tk, row, func(ev persistence.StoredEvent) (bool, error) {
		if !bytes.Equal(ev.RowKey, row) || ev.Schema != tk.Schema || ev.Table != tk.Table {
			t.Fatalf("RowEvents(%s.%s, %q) visited event %d of %s.%s %q", tk.Schema, tk.Table, row, ev.Seq, ev.Schema, ev.Table, ev.RowKey)
		}
		out = append(out, ev.Seq)
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// fixtureSeqs span several row-index generations (4 096 events each),
// with empty generations between them.
var fixtureSeqs = []uint64{1, 2, 4095, 4096, 4097, 9000, 70_000, 70_001, 1 << 20}

// TestMigrateLayout7To8RebuildsRowIndex writes a layout-7 file by hand —
// events at fixtureSeqs of two tables whose names share a prefix, rows
// whose keys share a prefix, the row index keyed by row — and opens it:
// the migration rebuilds the index keyed by generation, drops the old
// bucket, and every row's events read back exactly; appends after it
// land in the new index.
func TestMigrateLayout7To8RebuildsRowIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v7.db")
	bdb, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:7], 7); err != nil {
		t.Fatal(err)
	}
	tables := []persistence.TableKey{{Schema: "a", Table: "bc"}, {Schema: "ab", Table: "c"}}
	rows := [][]byte{[]byte("r"), []byte("r1"), []byte("r12")}
	want := map[string][]uint64{}
	wantKey := func(tk persistence.TableKey, row []byte) string {
		return tk.Schema + "/" + tk.Table + "/" + string(row)
	}
	if err := bdb.Update(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketSyncRowGens) != nil {
			t.Fatal("layout 7 already has the generation index")
		}
		events, idx := tx.Bucket(bucketSyncEvents), tx.Bucket(bucketSyncRowIdx)
		for i, seq := range fixtureSeqs {
			tk, row := tables[i%2], rows[i%3]
			var id persistence.EventID
			binary.BigEndian.PutUint64(id[:], seq)
			v := encodeEvent(&eventRecord{V: recordVersion, ID: id[:], Site: make([]byte, 16), HLC: seq,
				Schema: tk.Schema, Table: tk.Table, RowKey: row, Raw: []byte{0xd2, byte(i)}})
			if err := events.Put(u64(seq), v); err != nil {
				return err
			}
			if err := idx.Put(oldRowIdxKey(tk, row, seq), empty); err != nil {
				return err
			}
			want[wantKey(tk, row)] = append(want[wantKey(tk, row)], seq)
		}
		return tx.Bucket(bucketMeta).Put(metaSyncLastSeq, u64(fixtureSeqs[len(fixtureSeqs)-1]))
	}); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}

	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if v, _ := layoutVersion(wrapTx(tx)); v != LayoutVersion || LayoutVersion < 8 {
			t.Fatalf("layout %d after Open", v)
		}
		if tx.Bucket(bucketSyncRowIdx) != nil {
			t.Fatal("the layout-7 row index is still there")
		}
		if n := tx.Bucket(bucketSyncRowGens).Stats().KeyN; n != len(fixtureSeqs) {
			t.Fatalf("generation index holds %d keys, want %d", n, len(fixtureSeqs))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
			for _, tk := range tables {
				for _, row := range rows {
					if got, w := rowSeqs(t, r, tk, row), want[wantKey(tk, row)]; !slices.Equal(got, w) {
						t.Fatalf("RowEvents(%s.%s, %q) = %v, want %v", tk.Schema, tk.Table, row, got, w)
					}
				}
			}
			if got := rowSeqs(t, r, tables[0], []byte("absent")); len(got) != 0 {
				t.Fatalf("absent row: %v", got)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	check()
	// New events continue the sequence and are found through the new index.
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for i := 0; i < 3; i++ {
			var id persistence.EventID
			id[0], id[1] = 0xee, byte(i)
			seq, err := tx.AppendEvent(persistence.StoredEvent{ID: id, Raw: []byte{0xd2}, Site: messages.SiteID{1}, HLC: messages.HLC(1 << 30),
				Schema: tables[1].Schema, Table: tables[1].Table, RowKey: rows[2]})
			if err != nil {
				return err
			}
			want[wantKey(tables[1], rows[2])] = append(want[wantKey(tables[1], rows[2])], seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check()
}

// RowEvents walks every generation a row has events in, skips the empty
// ones, stops when fn says so, and lets fn write to the transaction.
func TestRowEventsAcrossGenerations(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "g.db"), Options{NoSync: true})
	defer db.Close()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	row := []byte("row")
	var want []uint64
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for i := 0; i < 3*(1<<rowGenBits)+10; i++ {
			var id persistence.EventID
			binary.BigEndian.PutUint64(id[:], uint64(i))
			rk := []byte("other")
			// The row's events in generations 0 and 2 only (and gen 3's head).
			if g := i >> rowGenBits; (g == 0 || g >= 2) && i%97 == 0 {
				rk = row
			}
			seq, err := tx.AppendEvent(persistence.StoredEvent{ID: id, Raw: []byte{0xd2}, Site: messages.SiteID{1}, HLC: messages.HLC(i + 1), Schema: tk.Schema, Table: tk.Table, RowKey: rk})
			if err != nil {
				return err
			}
			if bytes.Equal(rk, row) {
				want = append(want, seq)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		if got := rowSeqs(t, tx, tk, row); !slices.Equal(got, want) {
			t.Fatalf("RowEvents = %v, want %v", got, want)
		}
		n := 0
		err := tx.RowEvents(tk, row, func(ev persistence.StoredEvent) (bool, error) {
			n++
			// Writing inside the callback is allowed (rebuilds do).
			return n < len(want)-1, tx.PutMeta("k", []byte{byte(n)})
		})
		if err != nil || n != len(want)-1 {
			t.Fatalf("stopped after %d of %d (%v)", n, len(want)-1, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
