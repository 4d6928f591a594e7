package bolt

import (
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var (
	benchStore = flag.String("bench-store", "", "BenchmarkApplyPathSameRows: copy this node.db (a benchreport sync store, history on the same rows) instead of building a history")
	benchTxN   = flag.Int("bench-tx", 4000, "BenchmarkApplyPathSameRows: events per transaction")
)

// applyInput is one event of applyPathBatch, built before its transaction.
type applyInput struct {
	id     persistence.EventID
	site   messages.SiteID
	h      messages.HLC
	key    messages.Columns
	rowKey []byte
	cells  map[string]persistence.Cell
}

// applyPathBatch makes, for n events of the sync benchmark's shape (4
// sites, rows i % 5000 of bench.t, columns a and b), the storage calls the
// apply path makes per new event, in one Update: Event (absent),
// EventIDsAt, AppendEvent, RowForUpdate, PutRow, AppendChange (what
// actors/syncgroup's applyOne and materializeInto ask of the store). It
// returns the CPU time the Update took (the events are built before).
func applyPathBatch(b testing.TB, s persistence.SyncStore, base uint64, start, n int, raw []byte) time.Duration {
	tk := persistence.TableKey{Schema: "bench", Table: "t"}
	in := make([]applyInput, n)
	for j := range in {
		i := start + j
		var ctr [16]byte
		binary.BigEndian.PutUint64(ctr[:], uint64(i))
		binary.BigEndian.PutUint64(ctr[8:], base)
		seq := i / 4
		h, err := messages.NewHLC(base+uint64(seq>>16), uint16(seq))
		if err != nil {
			b.Fatal(err)
		}
		e := &in[j]
		e.id, e.site, e.h = sha256.Sum256(ctr[:]), messages.SiteID{byte(1 + i%4), 0xbe}, h
		e.key = messages.Columns{"id": messages.MustValue(i % 5000)}
		e.rowKey = e.key.Encode()
		clk := messages.Clock{HLC: h, Site: e.site, ID: e.id}
		e.cells = map[string]persistence.Cell{"a": {Value: messages.MustValue(fmt.Sprintf("value-%d", i)), Clock: clk}, "b": {Value: messages.MustValue(i), Clock: clk}}
	}
	c0 := cpuTime(b)
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		kr := tx.(interface {
			RowForUpdate(t persistence.TableKey, rowKey []byte, key messages.Columns) (persistence.Row, bool, error)
		})
		for j := range in {
			e := &in[j]
			if _, known, err := tx.Event(e.site, e.h, e.id); err != nil || known {
				return fmt.Errorf("event %d: known %v: %w", start+j, known, err)
			}
			if ids, err := tx.EventIDsAt(e.site, e.h, 2); err != nil || len(ids) != 0 {
				return fmt.Errorf("event %d: ids at %v: %w", start+j, ids, err)
			}
			if _, err := tx.AppendEvent(persistence.StoredEvent{ID: e.id, Raw: raw, Site: e.site, HLC: e.h, Schema: tk.Schema, Table: tk.Table, RowKey: e.rowKey}); err != nil {
				return err
			}
			row, found, err := kr.RowForUpdate(tk, e.rowKey, e.key)
			if err != nil {
				return err
			}
			clk := messages.Clock{HLC: e.h, Site: e.site, ID: e.id}
			if !found {
				row = persistence.Row{Schema: tk.Schema, Table: tk.Table, Key: e.key, Exists: true, Existence: clk}
			}
			if row.Cells == nil {
				row.Cells = map[string]persistence.Cell{}
			}
			for n, c := range e.cells {
				row.Cells[n] = c
			}
			if err := tx.PutRow(row); err != nil {
				return err
			}
			if _, err := tx.AppendChange(persistence.RowChange{Schema: tk.Schema, Table: tk.Table, Key: e.key, Exists: true,
				Existence: row.Existence, Tomb: row.Tomb, Cells: e.cells, Cause: persistence.CauseEvent, Event: clk}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return cpuTime(b) - c0
}

// BenchmarkApplyPathSameRows measures the store's share of applying an
// event (the calls applyPathBatch makes; no signature, no actor) in
// fsync'd transactions of -bench-tx events, on a store whose history is on
// the same 5 000 rows: -bench-store copies a benchreport store (1 M events:
// the targets' scale), else a history of 100 000 events is built first.
// It reports CPU per event (of the transactions: the events are built
// before), allocations and bytes allocated per event (all), the garbage
// collections, bytes written to
// storage per event and pages written per commit.
// Run: go test -run '^$' -bench ApplyPathSameRows -benchtime 10x ./persistence/bolt
func BenchmarkApplyPathSameRows(b *testing.B) {
	raw := make([]byte, 193)
	path := filepath.Join(b.TempDir(), "bench.db")
	sealer := newTestSealer(1)
	base := uint64(time.Now().UnixMilli())
	next := 0
	if *benchStore != "" {
		copyBenchStore(b, *benchStore, path)
	} else {
		db := mustOpen(b, path, Options{NoSync: true, Sealer: sealer})
		for ; next < 100_000; next += 4000 {
			applyPathBatch(b, db.Sync(), base-10_000, next, 4000, raw)
		}
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
	}
	db := mustOpen(b, path, Options{Sealer: sealer}) // fsync on
	defer db.Close()
	n := *benchTxN
	applyPathBatch(b, db.Sync(), base, next, n, raw) // warm the page cache
	next += n
	goruntime.GC()
	var m0, m1 goruntime.MemStats
	goruntime.ReadMemStats(&m0)
	w0, tx0 := procWriteBytes(b), db.bolt.Stats().TxStats
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		cpu += applyPathBatch(b, db.Sync(), base, next, n, raw)
		next += n
	}
	b.StopTimer()
	goruntime.ReadMemStats(&m1)
	tx1 := db.bolt.Stats().TxStats
	events := float64(b.N * n)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/events, "ns/event")
	b.ReportMetric(float64(cpu.Nanoseconds())/events, "cpu-ns/event")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/events, "allocs/event")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/events, "allocB/event")
	b.ReportMetric(float64(m1.NumGC-m0.NumGC), "gcs")
	b.ReportMetric(float64(procWriteBytes(b)-w0)/events, "B/event")
	b.ReportMetric(float64(tx1.GetWrite()-tx0.GetWrite())/float64(b.N), "pages/commit")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestGrowingIndexesWritePackedPages holds the fill of the pages the
// apply path's indexes and rows are written in: the event log, the id
// index (appended at each site's newest HLC), the table index (at the
// newest HLC) and the row index (in its newest generation) are packed
// full, the rows to rowsFill. At bbolt's default of half a page every
// commit wrote up to twice the pages (a commit's cost goes by its pages).
func TestGrowingIndexesWritePackedPages(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "fill.db"), Options{NoSync: true})
	defer db.Close()
	raw := make([]byte, 193)
	base := uint64(time.Now().UnixMilli())
	for i := 0; i < 12_000; i += 2000 {
		applyPathBatch(t, db.Sync(), base, i, 2000, raw)
	}
	err := db.bolt.View(func(tx *bbolt.Tx) error {
		for _, c := range []struct {
			bucket []byte
			min    float64
		}{
			{bucketSyncEvents, 0.9}, {bucketSyncEventKeys, 0.85}, {bucketSyncTableIdx, 0.85},
			{bucketSyncRowGens, 0.75}, {bucketSyncRows, 0.8},
		} {
			s := tx.Bucket(c.bucket).Stats()
			fill := float64(s.LeafInuse) / float64(s.LeafAlloc)
			t.Logf("%s: %d keys, %d leaf pages, fill %.2f", c.bucket, s.KeyN, s.LeafPageN, fill)
			if fill < c.min {
				t.Errorf("%s: leaf pages %.2f full, want at least %.2f", c.bucket, fill, c.min)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyBenchStore(b *testing.B, src, dst string) {
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		b.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}
