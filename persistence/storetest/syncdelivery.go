package storetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/persistence"
)

// testCursors: a cursor is absent (genesis) until stored, is kept per peer
// name, survives reopen, and what a caller passes in is copied.
func testCursors(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	view(t, s, func(r persistence.SyncReader) error {
		if _, ok, err := r.Cursor("b@inproc"); err != nil || ok {
			t.Fatalf("fresh cursor: ok=%v err=%v; want absent", ok, err)
		}
		if _, _, err := r.Cursor(""); err == nil {
			t.Fatal("empty peer name accepted")
		}
		return nil
	})
	retry := []uint64{3, 7}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutCursor("b@inproc", persistence.SenderCursor{Seq: 40, Retry: retry}); err != nil {
			return err
		}
		return tx.PutCursor("b@remote", persistence.SenderCursor{Seq: 2})
	})
	retry[0] = 99
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		c, ok, err := r.Cursor("b@inproc")
		if err != nil || !ok || c.Seq != 40 || !slices.Equal(c.Retry, []uint64{3, 7}) {
			t.Fatalf("Cursor(b@inproc) = %+v, %v, %v", c, ok, err)
		}
		c, ok, err = r.Cursor("b@remote")
		if err != nil || !ok || c.Seq != 2 || len(c.Retry) != 0 {
			t.Fatalf("Cursor(b@remote) = %+v, %v, %v", c, ok, err)
		}
		return nil
	})
}

// testWatermarks: absent means not applied; stored watermarks are listed
// and survive reopen; a regression is refused and changes nothing.
func testWatermarks(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	g1 := persistence.GroupKey{Site: siteA, Schema: tblAB.Schema, Table: tblAB.Table}
	g2 := persistence.GroupKey{Site: siteA, Schema: tblBC.Schema, Table: tblBC.Table}
	g3 := persistence.GroupKey{Site: siteB, Schema: tblAB.Schema, Table: tblAB.Table}
	view(t, s, func(r persistence.SyncReader) error {
		if _, ok, err := r.Watermark(g1); err != nil || ok {
			t.Fatalf("fresh watermark present: %v %v", ok, err)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		for g, w := range map[persistence.GroupKey]persistence.Watermark{g1: {HLC: 10, Seq: 4}, g2: {HLC: 20, Seq: 5}, g3: {HLC: 30, Seq: 6}} {
			if err := tx.PutWatermark(g, w); err != nil {
				return err
			}
		}
		return tx.PutWatermark(g1, persistence.Watermark{HLC: 12, Seq: 9})
	})
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if err := tx.PutWatermark(g2, persistence.Watermark{HLC: 25, Seq: 9}); err != nil {
			return err
		}
		return tx.PutWatermark(g1, persistence.Watermark{HLC: 11, Seq: 10})
	})
	if !errors.Is(err, persistence.ErrWatermarkRegression) {
		t.Fatalf("regression: %v, want ErrWatermarkRegression", err)
	}
	s = reopen()
	got := map[persistence.GroupKey]persistence.Watermark{}
	view(t, s, func(r persistence.SyncReader) error {
		return r.Watermarks(func(g persistence.GroupKey, w persistence.Watermark) (bool, error) {
			got[g] = w
			return true, nil
		})
	})
	want := map[persistence.GroupKey]persistence.Watermark{g1: {HLC: 12, Seq: 9}, g2: {HLC: 20, Seq: 5}, g3: {HLC: 30, Seq: 6}}
	if len(got) != len(want) {
		t.Fatalf("Watermarks = %v, want %v", got, want)
	}
	for g, w := range want {
		if got[g] != w {
			t.Fatalf("Watermarks[%v] = %v, want %v (the failed Update must keep nothing)", g, got[g], w)
		}
	}
	var n int
	view(t, s, func(r persistence.SyncReader) error {
		return r.Watermarks(func(persistence.GroupKey, persistence.Watermark) (bool, error) { n++; return false, nil })
	})
	if n != 1 {
		t.Fatalf("Watermarks visited %d after fn returned false", n)
	}
}

// testPeerProgress: per sender, with gaps naming their group, replaced
// whole, surviving reopen.
func testPeerProgress(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	logID := []byte("0123456789abcdef")
	g := persistence.GroupKey{Site: siteB, Schema: "s", Table: "t"}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutPeerProgress("a", persistence.PeerProgress{Log: logID, Through: 5, Gaps: []persistence.PeerGap{{Seq: 2, Group: g}}}); err != nil {
			return err
		}
		return tx.PutPeerProgress("a", persistence.PeerProgress{Log: logID, Through: 9, Gaps: []persistence.PeerGap{{Seq: 2, Group: g}, {Seq: 8, Group: g}}})
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		p, ok, err := r.PeerProgress("a")
		if err != nil || !ok || p.Through != 9 || string(p.Log) != string(logID) || len(p.Gaps) != 2 || p.Gaps[1] != (persistence.PeerGap{Seq: 8, Group: g}) {
			t.Fatalf("PeerProgress(a) = %+v, %v, %v", p, ok, err)
		}
		if _, ok, err := r.PeerProgress("b"); err != nil || ok {
			t.Fatalf("PeerProgress(b) present: %v %v", ok, err)
		}
		return nil
	})
}

// testEventKeyedBySiteAndHLC: Event finds an event under its own site and
// HLC only (the index is keyed by them; SSP/1 §12 step 4 keys the insert
// on the id, which determines both).
func testEventKeyedBySiteAndHLC(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	ev := mkEvent(7, tblX, []byte("r"), 42)
	appendAll(t, s, ev)
	view(t, s, func(r persistence.SyncReader) error {
		if got, ok, err := r.Event(ev.Site, ev.HLC, ev.ID); err != nil || !ok || got.Seq != 1 {
			t.Fatalf("Event under its own site and HLC: %+v %v %v", got, ok, err)
		}
		if _, ok, err := r.Event(siteB, ev.HLC, ev.ID); err != nil || ok {
			t.Fatalf("Event under another site: %v %v", ok, err)
		}
		if _, ok, err := r.Event(ev.Site, ev.HLC+1, ev.ID); err != nil || ok {
			t.Fatalf("Event under another HLC: %v %v", ok, err)
		}
		return nil
	})
}
