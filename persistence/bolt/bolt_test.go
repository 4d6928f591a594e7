package bolt

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/storetest"
)

var ctx = context.Background()

// opener returns a storetest open func over a bolt file with opts.
func opener(opts Options) func(t *testing.T) (persistence.SyncStore, func() persistence.SyncStore) {
	return func(t *testing.T) (persistence.SyncStore, func() persistence.SyncStore) {
		path := filepath.Join(t.TempDir(), "node.db")
		db := mustOpen(t, path, opts)
		cur := db
		t.Cleanup(func() { _ = cur.Close() })
		return db.Sync(), func() persistence.SyncStore {
			if err := cur.Close(); err != nil && !errors.Is(err, persistence.ErrClosed) {
				t.Fatalf("close: %v", err)
			}
			cur = mustOpen(t, path, opts)
			return cur.Sync()
		}
	}
}

func mustOpen(t testing.TB, path string, opts Options) *DB {
	t.Helper()
	db, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return db
}

func TestContractPlain(t *testing.T) {
	storetest.RunSyncStore(t, opener(Options{NoSync: true}))
}

func TestContractSealed(t *testing.T) {
	s := newTestSealer(1)
	storetest.RunSyncStore(t, opener(Options{NoSync: true, Sealer: s}))
	if s.opened.Load() == 0 {
		t.Fatal("the sealed path never ran")
	}
}

func TestContractFsync(t *testing.T) {
	if testing.Short() {
		t.Skip("fsync'd contract run skipped in -short")
	}
	storetest.RunSyncStore(t, opener(Options{}))
}

func testEvent(n byte, tk persistence.TableKey) persistence.StoredEvent {
	var id persistence.EventID
	id[0] = n
	return persistence.StoredEvent{ID: id, Raw: []byte{0xd2, n, n}, Site: messages.SiteID{n}, HLC: messages.HLC(n),
		Schema: tk.Schema, Table: tk.Table, RowKey: []byte{n}}
}

// TestSealedRecordMovedToAnotherIDIsCorrupt: docs/protocol.md, "At rest" — a record
// moved to another row fails to open, and a damaged record is an error,
// never "missing".
func TestSealedRecordMovedToAnotherIDIsCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(1)})
	defer db.Close()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	a, b := testEvent(1, tk), testEvent(2, tk)
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(a); err != nil {
			return err
		}
		_, err := tx.AppendEvent(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The plaintext Raw never reaches the file.
	if err := db.bolt.View(func(tx *bbolt.Tx) error {
		ev, err := decodeEvent(1, tx.Bucket(bucketSyncEvents).Get(u64(1)))
		if err != nil {
			return err
		}
		if string(ev.Raw) == string(a.Raw) {
			t.Fatal("Raw stored in plaintext")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Ordered: each case tampers with slot 2 as the previous one left it,
	// and only the last one leaves it undecodable.
	for _, c := range []struct {
		name   string
		tamper func(tx *bbolt.Tx) error
	}{
		// b's record with a's sealed Raw: the identity (b's id) does not match.
		{"sealed raw moved", func(tx *bbolt.Tx) error {
			evs := tx.Bucket(bucketSyncEvents)
			var ra, rb eventRecord
			if err := messages.Unmarshal("t", evs.Get(u64(1)), &ra, 0); err != nil {
				return err
			}
			if err := messages.Unmarshal("t", evs.Get(u64(2)), &rb, 0); err != nil {
				return err
			}
			rb.Raw = ra.Raw
			v, err := messages.Marshal(&rb)
			if err != nil {
				return err
			}
			return evs.Put(u64(2), v)
		}},
		// a's whole record copied into b's slot: the id index disagrees.
		{"whole record moved", func(tx *bbolt.Tx) error {
			evs := tx.Bucket(bucketSyncEvents)
			return evs.Put(u64(2), clone(evs.Get(u64(1))))
		}},
		{"garbage record", func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketSyncEvents).Put(u64(2), []byte{0xff})
		}},
	} {
		name, tamper := c.name, c.tamper
		t.Run(name, func(t *testing.T) {
			if err := db.bolt.Update(func(tx *bbolt.Tx) error { return tamper(tx) }); err != nil {
				t.Fatal(err)
			}
			err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
				_, ok, err := r.Event(b.Site, b.HLC, b.ID)
				if ok {
					t.Fatal("tampered event reported found")
				}
				return err
			})
			if !errors.Is(err, persistence.ErrCorrupt) {
				t.Fatalf("Event of a tampered record: %v, want ErrCorrupt", err)
			}
			if name != "whole record moved" {
				err = db.Sync().View(ctx, func(r persistence.SyncReader) error {
					return r.EventsAfter(1, 0, func(persistence.StoredEvent) (bool, error) { return true, nil })
				})
				if !errors.Is(err, persistence.ErrCorrupt) {
					t.Fatalf("EventsAfter over a tampered record: %v, want ErrCorrupt", err)
				}
			}
		})
	}
	// A sealed meta value moved to another key or type fails to open.
	s := db.Sync()
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		return tx.PutSealedMeta(persistence.RecordNodeKey, "node", []byte("secret"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketSyncSealed)
		v := clone(b.Get(sealedKey(persistence.RecordNodeKey, "node")))
		if err := b.Put(sealedKey(persistence.RecordNodeKey, "other"), v); err != nil {
			return err
		}
		return b.Put(sealedKey(persistence.RecordIdentity, "node"), v)
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rt  persistence.RecordType
		key string
	}{{persistence.RecordNodeKey, "other"}, {persistence.RecordIdentity, "node"}} {
		err := s.View(ctx, func(r persistence.SyncReader) error {
			_, ok, err := r.SealedMeta(c.rt, c.key)
			if ok {
				t.Fatal("moved sealed meta opened")
			}
			return err
		})
		if !errors.Is(err, persistence.ErrCorrupt) {
			t.Fatalf("SealedMeta(%d, %q) moved: %v, want ErrCorrupt", c.rt, c.key, err)
		}
	}
}

func TestFailpointBeforeCommitAborts(t *testing.T) {
	var armed atomic.Value // string
	armed.Store("")
	opts := Options{NoSync: true, Failpoint: func(name string) error {
		if armed.Load().(string) == name {
			return persistence.ErrInjected
		}
		return nil
	}}
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, opts)
	defer db.Close()
	s := db.Sync()
	put := func(v string) error {
		return s.Update(ctx, func(tx persistence.SyncTx) error {
			if _, err := tx.AppendEvent(testEvent(v[0], persistence.TableKey{Schema: "s", Table: "t"})); err != nil {
				return err
			}
			return tx.PutMeta("k", []byte(v))
		})
	}
	get := func(db *DB) (string, uint64) {
		var v []byte
		var last uint64
		if err := db.Sync().View(ctx, func(r persistence.SyncReader) error {
			var err error
			v, _, err = r.Meta("k")
			if err != nil {
				return err
			}
			last, err = r.LastSeq()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return string(v), last
	}
	if err := put("a"); err != nil {
		t.Fatal(err)
	}
	armed.Store(FailpointSyncUpdateBeforeCommit)
	if err := put("b"); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("Update at %s: %v, want ErrInjected", FailpointSyncUpdateBeforeCommit, err)
	}
	if v, last := get(db); v != "a" || last != 1 {
		t.Fatalf("after an aborted commit: meta %q, last seq %d; want a, 1", v, last)
	}
	armed.Store(FailpointSyncUpdateAfterCommit)
	if err := put("c"); !errors.Is(err, persistence.ErrInjected) {
		t.Fatalf("Update at %s: %v, want ErrInjected", FailpointSyncUpdateAfterCommit, err)
	}
	// A "crash" after commit: the data is durable across a reopen.
	armed.Store("")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = mustOpen(t, path, opts)
	if v, last := get(db); v != "c" || last != 2 {
		t.Fatalf("after a crash past commit: meta %q, last seq %d; want c, 2", v, last)
	}
}

func TestOpenNewerLayoutFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true})
	if err := db.bolt.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaLayoutVersion, u64(LayoutVersion+1))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{NoSync: true}); !errors.Is(err, persistence.ErrLayoutVersion) {
		t.Fatalf("Open of a newer layout: %v, want ErrLayoutVersion", err)
	}
}

func TestMigrationsRunInOrderInOneTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	var ran []uint64
	step := func(to uint64) func(*wtx) error {
		return func(tx *wtx) error {
			ran = append(ran, to)
			_, err := tx.CreateBucketIfNotExists([]byte{byte(to)})
			return err
		}
	}
	list := []migration{{from: 0, to: 1, fn: step(1)}, {from: 1, to: 2, fn: step(2)}, {from: 2, to: 3, fn: func(*wtx) error { return errors.New("boom") }}}
	if err := migrateTo(bdb, discard(), list, 3); err == nil {
		t.Fatal("failing migration succeeded")
	}
	// Nothing of the failed run is kept: version and buckets are unchanged.
	if err := bdb.View(func(tx *bbolt.Tx) error {
		if v, _ := layoutVersion(wrapTx(tx)); v != 0 || tx.Bucket([]byte{1}) != nil {
			t.Fatalf("partial migration kept: version %d", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ran = nil
	if err := migrateTo(bdb, discard(), list[:2], 2); err != nil {
		t.Fatal(err)
	}
	if len(ran) != 2 || ran[0] != 1 || ran[1] != 2 {
		t.Fatalf("migrations ran %v, want [1 2]", ran)
	}
	ran = nil
	if err := migrateTo(bdb, discard(), list[:2], 2); err != nil || len(ran) != 0 {
		t.Fatalf("re-open re-ran migrations %v (%v)", ran, err)
	}
}

var updateFixture = flag.Bool("update-fixture", false, "regenerate testdata/layout_v1.db")

const fixturePath = "testdata/layout_v1.db"

var fixtureTable = persistence.TableKey{Schema: "app", Table: "notes"}

// TestGenerateFixtureV1 writes the frozen layout-1 file when run with
// -update-fixture (it applies only the 0→1 migration, so it writes layout 1
// whatever LayoutVersion is). The committed file is what old nodes left on
// disk: regenerate it only if layout 1 itself was wrong before a release.
func TestGenerateFixtureV1(t *testing.T) {
	if !*updateFixture {
		t.Skip("run with -update-fixture to regenerate " + fixturePath)
	}
	_ = os.Remove(fixturePath)
	bdb, err := bbolt.Open(fixturePath, 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:1], 1); err != nil { // layout 1 exactly
		t.Fatal(err)
	}
	db := &DB{bolt: bdb, log: discard()}
	defer db.Close()
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(testEvent(1, fixtureTable)); err != nil {
			return err
		}
		if err := tx.PutRow(persistence.Row{Schema: "app", Table: "notes", Key: messages.Columns{"id": messages.MustValue(1)},
			Exists: true, Existence: messages.Clock{HLC: 1, Site: messages.SiteID{1}},
			Cells: map[string]persistence.Cell{"body": {Value: messages.Null, Clock: messages.Clock{HLC: 1, Site: messages.SiteID{1}}}}}); err != nil {
			return err
		}
		if err := tx.SetHorizon(fixtureTable, 1); err != nil {
			return err
		}
		return tx.PutMeta("mesh", []byte("fixture"))
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOpenFixtureV1 opens a copy of the frozen layout-1 file: Open migrates
// it to LayoutVersion and every layout-1 record reads back.
func TestOpenFixtureV1(t *testing.T) {
	src, err := os.Open(fixturePath)
	if err != nil {
		t.Fatalf("fixture: %v", err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), "v1.db")
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
	err = db.Sync().View(ctx, func(r persistence.SyncReader) error {
		want := testEvent(1, fixtureTable)
		ev, ok, err := r.Event(want.Site, want.HLC, want.ID) // found through the index layout 5 rebuilt
		if err != nil || !ok || ev.Seq != 1 || string(ev.Raw) != string(testEvent(1, fixtureTable).Raw) {
			t.Fatalf("fixture event: %+v, %v, %v", ev, ok, err)
		}
		row, ok, err := r.Row(fixtureTable, messages.Columns{"id": messages.MustValue(1)}.Encode())
		if err != nil || !ok || !row.Exists || !row.Cells["body"].Value.IsNull() {
			t.Fatalf("fixture row: %+v, %v, %v", row, ok, err)
		}
		if h, err := r.Horizon(fixtureTable); err != nil || h != 1 {
			t.Fatalf("fixture horizon: %v, %v", h, err)
		}
		if v, ok, err := r.Meta("mesh"); err != nil || !ok || string(v) != "fixture" {
			t.Fatalf("fixture meta: %q, %v, %v", v, ok, err)
		}
		if n, err := r.LastSeq(); err != nil || n != 1 {
			t.Fatalf("fixture last seq: %d, %v", n, err)
		}
		if got := rowSeqs(t, r, fixtureTable, want.RowKey); len(got) != 1 || got[0] != 1 { // the row index layout 8 rebuilt
			t.Fatalf("fixture row events: %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDBCloseClosesEveryHandle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true, Sealer: newTestSealer(2, 1)})
	s := db.Sync()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	mustClosed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, persistence.ErrClosed) {
			t.Fatalf("%s after DB.Close: %v, want ErrClosed", what, err)
		}
	}
	mustClosed("Update", s.Update(ctx, func(persistence.SyncTx) error { return nil }))
	mustClosed("View", s.View(ctx, func(persistence.SyncReader) error { return nil }))
	mustClosed("new Sync().View", db.Sync().View(ctx, func(persistence.SyncReader) error { return nil }))
	_, err := db.Reseal(ctx, 1)
	mustClosed("Reseal", err)
	// The Close rule (persistence.ErrClosed): a second Close returns nil.
	if err := db.Close(); err != nil {
		t.Fatalf("second DB.Close: %v, want nil", err)
	}
}

func TestOpenLockedFileTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	if _, err := Open(path, Options{NoSync: true, Timeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("second Open of a locked file succeeded")
	} else if !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("second Open of a locked file: %v, want persistence.ErrLocked", err)
	}
}

func TestCommitsCountsCommittedUpdatesPerPlane(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	s := d.Sync()
	for i := 0; i < 3; i++ {
		if err := s.Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta("k", []byte{byte(i)}) }); err != nil {
			t.Fatal(err)
		}
	}
	// A failed Update does not commit and is not counted.
	_ = s.Update(ctx, func(tx persistence.SyncTx) error { return errors.New("abort") })
	if err := d.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := d.Commits(); got != (CommitStats{Sync: 3, Delivery: 1}) {
		t.Fatalf("Commits() = %+v, want {Sync:3 Delivery:1}", got)
	}
}
