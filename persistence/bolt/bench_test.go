package bolt

import (
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// benchBatch appends n events with random-looking ids (as BLAKE3 ids are)
// and puts one row per event, in one Update.
func benchBatch(b *testing.B, s persistence.SyncStore, start, n int, raw []byte) {
	tk := persistence.TableKey{Schema: "app", Table: "notes"}
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		for i := start; i < start+n; i++ {
			var ctr [8]byte
			binary.BigEndian.PutUint64(ctr[:], uint64(i))
			id := sha256.Sum256(ctr[:])
			key := messages.Columns{"id": messages.MustValue(binary.BigEndian.Uint32(id[:4]))}
			clk := messages.Clock{HLC: messages.HLC(i), Site: messages.SiteID{1}}
			ev := persistence.StoredEvent{ID: id, Raw: raw, Site: clk.Site, HLC: clk.HLC,
				Schema: tk.Schema, Table: tk.Table, RowKey: key.Encode()}
			if _, err := tx.AppendEvent(ev); err != nil {
				return err
			}
			if err := tx.PutRow(persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: key, Exists: true, Existence: clk,
				Cells: map[string]persistence.Cell{"body": {Value: messages.MustValue("hello"), Clock: clk}}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAppendBatch measures group commit: 1000 AppendEvent + PutRow per
// fsync'd Update (docs/architecture.md, "Costs": the event log is appended by sequence,
// the id index and rows are batched many events to a transaction).
func BenchmarkAppendBatch(b *testing.B) {
	const batch = 1000
	raw := make([]byte, 300) // a small signed event
	for _, c := range []struct {
		name    string
		prefill int
		sealer  persistence.Sealer
	}{
		{"empty", 0, nil},
		{"empty-sealed", 0, newTestSealer(1)},
		{"prefilled-200k", 200_000, nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "bench.db")
			if c.prefill > 0 {
				db := mustOpen(b, path, Options{NoSync: true, Sealer: c.sealer})
				for i := 0; i < c.prefill; i += batch {
					benchBatch(b, db.Sync(), i, batch, raw)
				}
				if err := db.Close(); err != nil {
					b.Fatal(err)
				}
			}
			db := mustOpen(b, path, Options{Sealer: c.sealer}) // fsync on
			defer db.Close()
			s := db.Sync()
			next := c.prefill
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				benchBatch(b, s, next, batch, raw)
				next += batch
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "events/s")
		})
	}
}

// sameRowsBatch appends n events of the sync plane's benchmark shape (4
// sites, rows i % 5000, HLCs increasing) from event start on, with their
// row puts, in one Update.
func sameRowsBatch(b *testing.B, s persistence.SyncStore, start, n int, raw []byte) {
	tk := persistence.TableKey{Schema: "bench", Table: "t"}
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		for i := start; i < start+n; i++ {
			var ctr [8]byte
			binary.BigEndian.PutUint64(ctr[:], uint64(i))
			id := sha256.Sum256(ctr[:])
			key := messages.Columns{"id": messages.MustValue(i % 5000)}
			clk := messages.Clock{HLC: messages.HLC(1<<40 + i/4), Site: messages.SiteID{byte(1 + i%4)}}
			ev := persistence.StoredEvent{ID: id, Raw: raw, Site: clk.Site, HLC: clk.HLC,
				Schema: tk.Schema, Table: tk.Table, RowKey: key.Encode()}
			if _, err := tx.AppendEvent(ev); err != nil {
				return err
			}
			if err := tx.PutRow(persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: key, Exists: true, Existence: clk,
				Cells: map[string]persistence.Cell{"a": {Value: messages.MustValue("value"), Clock: clk}, "b": {Value: messages.MustValue(i), Clock: clk}}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

func procWriteBytes(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no write_bytes in /proc/self/io")
	return 0
}

// BenchmarkWriteBytesSameRows measures the bytes written to storage per
// appended event (fsync'd transactions of 2 000 events, the events of a
// store whose history is on the SAME rows): flat as the history grows is
// what the row index's layout (layout 8) is for.
// Run: go test -run '^$' -bench WriteBytesSameRows -benchtime 10x ./persistence/bolt
func BenchmarkWriteBytesSameRows(b *testing.B) {
	const batch = 2000
	raw := make([]byte, 193)
	for _, history := range []int{100_000, 500_000} {
		b.Run(strconv.Itoa(history), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "bench.db")
			db := mustOpen(b, path, Options{NoSync: true})
			for i := 0; i < history; i += batch {
				sameRowsBatch(b, db.Sync(), i, batch, raw)
			}
			if err := db.Close(); err != nil {
				b.Fatal(err)
			}
			db = mustOpen(b, path, Options{}) // fsync on
			defer db.Close()
			next := history
			w0 := procWriteBytes(b)
			b.ResetTimer()
			for range b.N {
				sameRowsBatch(b, db.Sync(), next, batch, raw)
				next += batch
			}
			b.ReportMetric(float64(procWriteBytes(b)-w0)/float64(b.N*batch), "B/event")
		})
	}
}
