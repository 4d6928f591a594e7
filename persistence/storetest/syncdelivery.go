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

// testDeliveryLimits: a cursor with exactly MaxRetry re-offers and a
// progress with exactly MaxPeerGaps gaps are stored and read back whole
// after reopen (no decoder limit below the writer's); one more is
// ErrLimit and keeps nothing of that Update.
func testDeliveryLimits(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	logID := []byte("0123456789abcdef")
	g := persistence.GroupKey{Site: siteB, Schema: "s", Table: "t"}
	retry := make([]uint64, persistence.MaxRetry)
	gaps := make([]persistence.PeerGap, persistence.MaxPeerGaps)
	for i := range retry {
		retry[i] = uint64(2*i + 1)
	}
	for i := range gaps {
		gaps[i] = persistence.PeerGap{Seq: uint64(3*i + 1), Group: g}
	}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutCursor("p", persistence.SenderCursor{Seq: 1 << 20, Retry: retry}); err != nil {
			return err
		}
		return tx.PutPeerProgress("p", persistence.PeerProgress{Log: logID, Through: 1 << 20, Gaps: gaps})
	})
	over := func(name string, fn func(tx persistence.SyncTx) error) {
		t.Helper()
		err := s.Update(ctx, func(tx persistence.SyncTx) error {
			if err := tx.PutCursor("q", persistence.SenderCursor{Seq: 5}); err != nil {
				return err
			}
			return fn(tx)
		})
		if !errors.Is(err, persistence.ErrLimit) {
			t.Fatalf("%s past the limit: %v, want ErrLimit", name, err)
		}
	}
	over("retry", func(tx persistence.SyncTx) error {
		return tx.PutCursor("p", persistence.SenderCursor{Seq: 1, Retry: append(slices.Clone(retry), 1<<30)})
	})
	over("gaps", func(tx persistence.SyncTx) error {
		return tx.PutPeerProgress("p", persistence.PeerProgress{Log: logID, Through: 1, Gaps: append(slices.Clone(gaps), persistence.PeerGap{Seq: 1 << 30, Group: g})})
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		c, ok, err := r.Cursor("p")
		if err != nil || !ok || c.Seq != 1<<20 || !slices.Equal(c.Retry, retry) {
			t.Fatalf("cursor at the limit read back as seq %d with %d re-offers (%v, %v)", c.Seq, len(c.Retry), ok, err)
		}
		p, ok, err := r.PeerProgress("p")
		if err != nil || !ok || p.Through != 1<<20 || !slices.Equal(p.Gaps, gaps) {
			t.Fatalf("progress at the limit read back with %d gaps (%v, %v)", len(p.Gaps), ok, err)
		}
		if _, ok, err := r.Cursor("q"); err != nil || ok {
			t.Fatalf("a refused Update kept a cursor: %v %v", ok, err)
		}
		return nil
	})
	// Shrinking replaces the lists whole.
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutCursor("p", persistence.SenderCursor{Seq: 7, Retry: []uint64{5, 3, 5}}); err != nil {
			return err
		}
		return tx.PutPeerProgress("p", persistence.PeerProgress{Log: logID, Through: 9, Gaps: []persistence.PeerGap{{Seq: 4, Group: g}}})
	})
	view(t, s, func(r persistence.SyncReader) error {
		c, _, _ := r.Cursor("p")
		p, _, _ := r.PeerProgress("p")
		if !slices.Equal(c.Retry, []uint64{3, 5}) || len(p.Gaps) != 1 || p.Gaps[0].Seq != 4 {
			t.Fatalf("after shrinking: retry %v, gaps %v", c.Retry, p.Gaps)
		}
		return nil
	})
}

// testHeldUsage: IsHeld is a point lookup per (group, seq); HeldUsage
// counts a signer's held events and bytes across its groups; releasing
// and purging give them back; purging also removes the events.
func testHeldUsage(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	g1 := persistence.GroupKey{Site: siteA, Schema: "inv", Table: "a"}
	g2 := persistence.GroupKey{Site: siteA, Schema: "inv", Table: "b"}
	e1, e2, e3 := mkEvent(1, persistence.TableKey{Schema: "inv", Table: "a"}, []byte("r1"), 5), mkEvent(2, persistence.TableKey{Schema: "inv", Table: "a"}, []byte("r2"), 6), mkEvent(3, persistence.TableKey{Schema: "inv", Table: "b"}, []byte("r3"), 7)
	seqs := appendAll(t, s, e1, e2, e3)
	update(t, s, func(tx persistence.SyncTx) error {
		for i, g := range []persistence.GroupKey{g1, g1, g2} {
			if err := tx.HoldEvent(g, seqs[i]); err != nil {
				return err
			}
		}
		return tx.HoldEvent(g1, seqs[0]) // twice: counted once
	})
	size := int64(len(e1.Raw) + len(e2.Raw) + len(e3.Raw))
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		for _, c := range []struct {
			g    persistence.GroupKey
			seq  uint64
			want bool
		}{{g1, seqs[0], true}, {g1, seqs[1], true}, {g1, seqs[2], false}, {g2, seqs[2], true}, {g2, seqs[0], false}} {
			if got, err := r.IsHeld(c.g, c.seq); err != nil || got != c.want {
				t.Fatalf("IsHeld(%v, %d) = %v, %v; want %v", c.g.Table, c.seq, got, err, c.want)
			}
		}
		if u, err := r.HeldUsage(siteA); err != nil || u.Events != 3 || u.Bytes < size {
			t.Fatalf("HeldUsage = %+v, %v; want 3 events, at least %d bytes", u, err, size)
		}
		if u, err := r.HeldUsage(siteB); err != nil || u != (persistence.HeldUsage{}) {
			t.Fatalf("HeldUsage(other) = %+v, %v", u, err)
		}
		return nil
	})
	var purged int
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.ReleaseGroup(g2); err != nil {
			return err
		}
		var err error
		purged, err = tx.PurgeHeld(g1)
		return err
	})
	view(t, s, func(r persistence.SyncReader) error {
		if u, err := r.HeldUsage(siteA); err != nil || u != (persistence.HeldUsage{}) || purged != 2 {
			t.Fatalf("after release and purge: usage %+v (%v), purged %d", u, err, purged)
		}
		if ok, _ := r.IsHeld(g1, seqs[0]); ok {
			t.Fatal("purged entry still held")
		}
		if _, ok, err := r.Event(e1.Site, e1.HLC, e1.ID); err != nil || ok {
			t.Fatalf("purged event still in the log: %v %v", ok, err)
		}
		if _, ok, err := r.Event(e3.Site, e3.HLC, e3.ID); err != nil || !ok {
			t.Fatalf("released event left the log: %v %v", ok, err)
		}
		n := 0
		if err := r.TableEvents(persistence.TableKey{Schema: "inv", Table: "a"}, func(persistence.StoredEvent) (bool, error) { n++; return true, nil }); err != nil || n != 0 {
			t.Fatalf("purged table still lists %d events (%v)", n, err)
		}
		return nil
	})
}

// testDeleteWatermarks removes every watermark; absence then reads as
// not applied, and a watermark may start again from anywhere.
func testDeleteWatermarks(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	g := persistence.GroupKey{Site: siteA, Schema: "s", Table: "t"}
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutWatermark(g, persistence.Watermark{HLC: 50, Seq: 3}) })
	var n int
	update(t, s, func(tx persistence.SyncTx) error {
		var err error
		n, err = tx.DeleteWatermarks()
		return err
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		if _, ok, err := r.Watermark(g); err != nil || ok || n != 1 {
			t.Fatalf("after DeleteWatermarks (%d): present=%v %v", n, ok, err)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutWatermark(g, persistence.Watermark{HLC: 10, Seq: 1}) })
}
