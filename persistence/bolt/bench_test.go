package bolt

import (
	"crypto/sha256"
	"encoding/binary"
	"path/filepath"
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
