package bolt

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/persistence"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// staleCount counts sealed values not under the sealer's current key.
func staleCount(t *testing.T, db *DB, rot persistence.KeyRotator) int {
	t.Helper()
	n := 0
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		if err := tx.Bucket(bucketSyncEvents).ForEach(func(k, v []byte) error {
			var rec eventRecord
			if err := decodeRecord("event", v, &rec, &rec.V); err != nil {
				return err
			}
			if !rot.IsCurrent(rec.Raw) {
				n++
			}
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketSyncSealed).ForEach(func(_, v []byte) error {
			if !rot.IsCurrent(v) {
				n++
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestResealRotatesInterruptiblyAndResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	const events = 23
	old := newTestSealer(1)
	db := mustOpen(t, path, Options{NoSync: true, Sealer: old})
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		for i := 1; i <= events; i++ {
			if _, err := tx.AppendEvent(testEvent(byte(i), tk)); err != nil {
				return err
			}
		}
		for i := range 3 {
			if err := tx.PutSealedMeta(persistence.RecordNodeKey, fmt.Sprint("k", i), []byte(fmt.Sprint("secret", i))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	// Rotate: key 2 is current, key 1 still opens. Crash after the second batch.
	rot := newTestSealer(2, 1)
	batches := 0
	opts := Options{NoSync: true, Sealer: rot, Failpoint: func(name string) error {
		if name == FailpointResealAfterBatch {
			if batches++; batches == 2 {
				return persistence.ErrInjected
			}
		}
		return nil
	}}
	db = mustOpen(t, path, opts)
	if got := staleCount(t, db, rot); got != events+3 {
		t.Fatalf("stale before reseal = %d", got)
	}
	n, err := db.Reseal(ctx, 5)
	if !errors.Is(err, persistence.ErrInjected) || n != 10 {
		t.Fatalf("interrupted Reseal = %d, %v; want 10, ErrInjected", n, err)
	}
	if got := staleCount(t, db, rot); got != events+3-10 {
		t.Fatalf("stale after an interrupted reseal = %d, want %d", got, events+3-10)
	}
	// Restart and resume: the rest is resealed, nothing twice.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	opts.Failpoint = nil
	db = mustOpen(t, path, opts)
	defer db.Close()
	n, err = db.Reseal(ctx, 5)
	if err != nil || n != events+3-10 {
		t.Fatalf("resumed Reseal = %d, %v; want %d", n, err, events+3-10)
	}
	if got := staleCount(t, db, rot); got != 0 {
		t.Fatalf("stale after reseal = %d", got)
	}
	if n, err := db.Reseal(ctx, 5); err != nil || n != 0 {
		t.Fatalf("third Reseal = %d, %v; want 0", n, err)
	}
	// Everything opens under the new key alone.
	db.opts.Sealer = newTestSealer(2)
	if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
		seen := 0
		if err := r.EventsAfter(0, 0, func(ev persistence.StoredEvent) (bool, error) {
			if want := testEvent(ev.ID[0], tk).Raw; string(ev.Raw) != string(want) {
				t.Fatalf("event %d Raw = %x, want %x", ev.Seq, ev.Raw, want)
			}
			seen++
			return true, nil
		}); err != nil {
			return err
		}
		if seen != events {
			t.Fatalf("saw %d events", seen)
		}
		for i := range 3 {
			v, ok, err := r.SealedMeta(persistence.RecordNodeKey, fmt.Sprint("k", i))
			if err != nil || !ok || string(v) != fmt.Sprint("secret", i) {
				t.Fatalf("sealed meta %d = %q, %v, %v", i, v, ok, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestResealWithoutRotatorIsNoop(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "node.db"), Options{NoSync: true})
	defer db.Close()
	if n, err := db.Reseal(ctx, 10); n != 0 || err != nil {
		t.Fatalf("Reseal without a rotator = %d, %v", n, err)
	}
}
