package bolt

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestMigrateLayout5To6 writes what a layout-5 node left on disk — a
// watermark (possibly forged), a progress record holding 5 000 gaps in
// the record (more than its decoder read back), a cursor with re-offers
// in the record, a held entry without its size — and opens it: the
// watermark is gone (fails closed), every gap and re-offer reads back, the
// held signer's usage is counted.
func TestMigrateLayout5To6(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	bdb, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateTo(bdb, discard(), migrations[:5], 5); err != nil {
		t.Fatal(err)
	}
	type oldGap struct {
		_      struct{} `cbor:",toarray"`
		Seq    uint64
		Site   []byte
		Schema string
		Table  string
	}
	site := messages.SiteID{7}
	g := persistence.GroupKey{Site: site, Schema: "app", Table: "later"}
	const nGaps = 5000
	gaps := make([]oldGap, nGaps)
	for i := range gaps {
		gaps[i] = oldGap{Seq: uint64(i + 1), Site: site[:], Schema: g.Schema, Table: g.Table}
	}
	prog, err := messages.Marshal(map[string]any{"v": 1, "log": make([]byte, 16), "through": nGaps, "gaps": gaps})
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := messages.Marshal(map[string]any{"v": 1, "seq": 40, "retry": []uint64{3, 9}})
	wm, _ := messages.Marshal(&watermarkRecord{V: 1, HLC: 1 << 62, Seq: 1})
	ev := testEvent(1, persistence.TableKey{Schema: g.Schema, Table: g.Table})
	ev.Site = site
	if err := bdb.Update(func(tx *bbolt.Tx) error {
		// The append below is today's code, which writes the layout-8 row
		// index: give it that bucket for the append only, then take it out
		// again so the file is layout 5 (migration 7→8 rebuilds the index
		// from the log).
		if _, err := tx.CreateBucket(bucketSyncRowGens); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketSyncIndexes); err != nil { // layout 14's, likewise
			return err
		}
		defer func() { _ = tx.DeleteBucket(bucketSyncIndexes) }()
		defer func() { _ = tx.DeleteBucket(bucketSyncRowGens) }()
		if _, err := tx.CreateBucket(bucketSyncRangeSums); err != nil { // layout 12's, likewise
			return err
		}
		defer func() { _ = tx.DeleteBucket(bucketSyncRangeSums) }()
		st, err := newSyncTx(&DB{bolt: bdb, log: discard()}, wrapTx(tx))
		if err != nil {
			return err
		}
		seq, err := st.AppendEvent(ev)
		if err != nil {
			return err
		}
		if err := st.flush(); err != nil {
			return err
		}
		for _, kv := range []struct{ b, k, v []byte }{
			{bucketSyncPeers, []byte("a@default"), prog},
			{bucketSyncCursors, []byte("a@default"), cur},
			{bucketSyncWatermarks, groupPrefix(nil, persistence.GroupKey{Site: messages.SiteID{9}, Schema: "app", Table: "t"}), wm},
			{bucketSyncHeld, binary.BigEndian.AppendUint64(groupPrefix(nil, g), seq), empty},
		} {
			if err := tx.Bucket(kv.b).Put(kv.k, kv.v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_ = bdb.Close()

	db := mustOpen(t, path, Options{NoSync: true})
	defer db.Close()
	err = db.Sync().View(ctx, func(r persistence.SyncReader) error {
		n := 0
		if err := r.Watermarks(func(persistence.GroupKey, persistence.Watermark) (bool, error) { n++; return true, nil }); err != nil || n != 0 {
			t.Fatalf("%d watermarks survived the migration (%v)", n, err)
		}
		p, ok, err := r.PeerProgress("a@default")
		if err != nil || !ok || p.Through != nGaps || len(p.Gaps) != nGaps || p.Gaps[nGaps-1] != (persistence.PeerGap{Seq: nGaps, Group: g}) {
			t.Fatalf("progress after migration: through %d, %d gaps, %v, %v", p.Through, len(p.Gaps), ok, err)
		}
		c, ok, err := r.Cursor("a@default")
		if err != nil || !ok || c.Seq != 40 || len(c.Retry) != 2 || c.Retry[1] != 9 {
			t.Fatalf("cursor after migration: %+v, %v, %v", c, ok, err)
		}
		if u, err := r.HeldUsage(site); err != nil || u.Events != 1 || u.Bytes < int64(len(ev.Raw)) {
			t.Fatalf("held usage after migration: %+v, %v", u, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
