// Package storetest is the contract suite every persistence.SyncStore
// implementation passes (persistence/bolt and persistence/memory run it).
// Users who write their own store run it the same way:
//
//	func TestContract(t *testing.T) { storetest.RunSyncStore(t, openMine) }
//
// Decisions the suite pins where the contract's prose is brief:
//
//   - Sequences: AppendEvent assigns LastSeq()+1. The sequence is strictly
//     increasing and never reused across committed transactions, including
//     after DeleteEventsBelow and after a restart (LastSeq is the highest
//     sequence ever assigned, not the highest retained). Sequences handed
//     out inside an Update that does not commit are not consumed: the next
//     committed AppendEvent may receive the same number, which is safe
//     because nothing outside the failed transaction ever saw it durably.
//   - ErrDuplicate from AppendEvent leaves the transaction usable: the
//     duplicate changed nothing, and fn may go on and commit.
//   - Returned values (events, rows, byte slices) are the caller's copies;
//     values passed in are copied too.
//   - Meta keys and key ids are non-empty (PutMeta, PutKey reject "").
//   - A transaction used after its fn returned fails with an error
//     matching persistence.ErrClosed; a cancelled context fails Update and
//     View before fn runs; every call after Close fails with ErrClosed,
//     including a second Close.
package storetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// OpenFunc opens a fresh, empty store for one subtest. reopen closes the
// current handle and returns a new one over the same backing data, as a
// process restart would see it. The OpenFunc registers its own cleanup.
type OpenFunc func(t *testing.T) (store persistence.SyncStore, reopen func() persistence.SyncStore)

// RunSyncStore runs the persistence.SyncStore contract suite against open.
func RunSyncStore(t *testing.T, open func(t *testing.T) (store persistence.SyncStore, reopen func() persistence.SyncStore)) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open OpenFunc)
	}{
		{"CloseThenEveryCallReturnsErrClosed", testClosed},
		{"CancelledContextFailsBeforeFn", testCancelled},
		{"TxUsedAfterFnReturnsFails", testTxAfterReturn},
		{"ViewIsReadOnly", testViewReadOnly},
		{"AppendEventAssignsIncreasingSeq", testAppendSeq},
		{"AppendEventDuplicateChangesNothing", testAppendDuplicate},
		{"UpdateErrorKeepsNothing", testUpdateAtomic},
		{"EventsAfterOrderLimitStop", testEventsAfter},
		{"RowAndTableEventsOnlyTheirOwn", testIndexIsolation},
		{"IndexesReadBackInTheWritingTransaction", testIndexesInWritingTx},
		{"RowsRewrittenInOneTransaction", testRowsRewrittenInOneTx},
		{"DeleteEventsBelowStrictlyBelow", testDeleteBelow},
		{"RowRoundTripKeepsNeverWrittenAndNull", testRowRoundTrip},
		{"RowsByteOrderAndResume", testRows},
		{"RowsNaturalKeyOrder", testRowsNaturalOrder},
		{"IndexesFollowTheRows", testIndexes},
		{"IndexesProperty", testIndexesProperty},
		{"PutRowRejectsBadKey", testPutRowBadKey},
		{"EmptyMetaKeyAndKidRejected", testEmptyNames},
		{"ReturnedAndPassedValuesAreCopies", testCopies},
		{"Horizons", testHorizons},
		{"HeldGroups", testHeld},
		{"MetaAndSealedMeta", testMeta},
		{"KeysReplaceByKid", testKeys},
		{"Tables", testTables},
		{"CallbackErrorsPropagate", testCallbackErrors},
		{"ViewSnapshotIsolation", testViewSnapshot},
		{"ConcurrentUpdatesSerialize", testConcurrent},
		{"EverythingSurvivesReopen", testReopen},
		{"CursorsPerPeerFromGenesis", testCursors},
		{"WatermarksMonotonicAndFailClosed", testWatermarks},
		{"PeerProgressWithGaps", testPeerProgress},
		{"EventKeyedBySiteAndHLC", testEventKeyedBySiteAndHLC},
		{"TableEventKeysInSiteHLCIDOrder", testTableEventKeys},
		{"TableEventSumEqualsTheScan", testTableEventSum},
		{"TableEventSumEqualsTheScanProperty", testTableEventSumProperty},
		{"PreparedEventsStoreAsUnprepared", testPreparedEvents},
		{"RowClocksKeepEventIDs", testRowClocksKeepEventIDs},
		{"EventIDsAtListsOneStamp", testEventIDsAt},
		{"SiteEventIDsListsARangeInOrder", testSiteEventIDs},
		{"GapAndRetryLimitsAtAndPastTheEdge", testDeliveryLimits},
		{"HeldPointLookupUsageAndPurge", testHeldUsage},
		{"DeleteWatermarks", testDeleteWatermarks},
		{"ChangeLog", testChangeLog},
		{"ChangeLogTrimmedAsItGrows", testChangeLogTrimmedAsItGrows},
		{"ChangeLogTrimReportsTablesAndRaiseSkips", testChangeLogTrimReportsTablesAndRaiseSkips},
		{"RecordsKeptAcrossTransactions", testRecordsKeptAcrossTransactions},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

// --- helpers ---

var (
	ctx   = context.Background()
	siteA = messages.SiteID{0xa1, 0xa2, 15: 0xaf}
	siteB = messages.SiteID{0xb1, 0xb2, 15: 0xbf}
	tblAB = persistence.TableKey{Schema: "a", Table: "bc"}
	tblBC = persistence.TableKey{Schema: "ab", Table: "c"} // collides with tblAB when concatenated
	tblX  = persistence.TableKey{Schema: "main", Table: "x"}
	errFn = errors.New("storetest: fn failed on purpose")
)

func update(t *testing.T, s persistence.SyncStore, fn func(tx persistence.SyncTx) error) {
	t.Helper()
	if err := s.Update(ctx, fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func view(t *testing.T, s persistence.SyncStore, fn func(tx persistence.SyncReader) error) {
	t.Helper()
	if err := s.View(ctx, fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func eventID(n int) persistence.EventID {
	var id persistence.EventID
	binary.BigEndian.PutUint64(id[:], uint64(n))
	id[31] = 0x5a
	return id
}

// mkEvent builds a stored event numbered n (its id and Raw derive from n).
func mkEvent(n int, tk persistence.TableKey, rowKey []byte, h messages.HLC) persistence.StoredEvent {
	return persistence.StoredEvent{
		ID: eventID(n), Raw: []byte(fmt.Sprintf("cose-bytes-%d", n)),
		Site: siteA, HLC: h, Schema: tk.Schema, Table: tk.Table, RowKey: rowKey,
	}
}

func appendAll(t *testing.T, s persistence.SyncStore, evs ...persistence.StoredEvent) []uint64 {
	t.Helper()
	var seqs []uint64
	update(t, s, func(tx persistence.SyncTx) error {
		for _, ev := range evs {
			seq, err := tx.AppendEvent(ev)
			if err != nil {
				return err
			}
			seqs = append(seqs, seq)
		}
		return nil
	})
	return seqs
}

func sameEvent(a, b persistence.StoredEvent) bool {
	return a.ID == b.ID && a.Seq == b.Seq && bytes.Equal(a.Raw, b.Raw) && a.Site == b.Site && a.HLC == b.HLC &&
		a.Schema == b.Schema && a.Table == b.Table && bytes.Equal(a.RowKey, b.RowKey)
}

func checkEvent(t *testing.T, r persistence.SyncReader, want persistence.StoredEvent) {
	t.Helper()
	got, ok, err := r.Event(want.Site, want.HLC, want.ID)
	if err != nil || !ok {
		t.Fatalf("Event(%d): ok=%v err=%v", want.Seq, ok, err)
	}
	if !sameEvent(got, want) {
		t.Fatalf("Event: got %+v, want %+v", got, want)
	}
}

func checkNoEvent(t *testing.T, r persistence.SyncReader, id persistence.EventID) {
	t.Helper()
	// Absent under any site and HLC: no retained event has this id.
	err := r.EventsAfter(0, 0, func(ev persistence.StoredEvent) (bool, error) {
		if ev.ID == id {
			t.Fatalf("event %s still retained at seq %d", id, ev.Seq)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := r.Event(siteA, 0, id); err != nil || ok {
		t.Fatalf("Event(%s): ok=%v err=%v, want absent", id, ok, err)
	}
}

func lastSeq(t *testing.T, r persistence.SyncReader) uint64 {
	t.Helper()
	n, err := r.LastSeq()
	if err != nil {
		t.Fatalf("LastSeq: %v", err)
	}
	return n
}

func seqsOf(evs []persistence.StoredEvent) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.Seq
	}
	return out
}

func after(t *testing.T, r persistence.SyncReader, from uint64, limit int) []persistence.StoredEvent {
	t.Helper()
	var out []persistence.StoredEvent
	if err := r.EventsAfter(from, limit, func(ev persistence.StoredEvent) (bool, error) {
		out = append(out, ev)
		return true, nil
	}); err != nil {
		t.Fatalf("EventsAfter: %v", err)
	}
	return out
}

func sortedSeqs(t *testing.T, visit func(fn func(persistence.StoredEvent) (bool, error)) error) []uint64 {
	t.Helper()
	var out []uint64
	if err := visit(func(ev persistence.StoredEvent) (bool, error) {
		out = append(out, ev.Seq)
		return true, nil
	}); err != nil {
		t.Fatalf("visit events: %v", err)
	}
	slices.Sort(out)
	return out
}

func rowEvents(t *testing.T, r persistence.SyncReader, tk persistence.TableKey, rowKey []byte) []uint64 {
	t.Helper()
	return sortedSeqs(t, func(fn func(persistence.StoredEvent) (bool, error)) error { return r.RowEvents(tk, rowKey, fn) })
}

func tableEvents(t *testing.T, r persistence.SyncReader, tk persistence.TableKey) []uint64 {
	t.Helper()
	return sortedSeqs(t, func(fn func(persistence.StoredEvent) (bool, error)) error { return r.TableEvents(tk, fn) })
}

func clock(h messages.HLC, s messages.SiteID) messages.Clock { return messages.Clock{HLC: h, Site: s} }

func key(v any) messages.Columns { return messages.Columns{"id": messages.MustValue(v)} }

// sampleRow has a set cell, a null cell and (by omission) a never-written one.
func sampleRow(tk persistence.TableKey, id any) persistence.Row {
	return persistence.Row{
		Schema: tk.Schema, Table: tk.Table, Key: key(id),
		Exists: true, Existence: clock(7, siteA), Tomb: clock(3, siteB),
		Cells: map[string]persistence.Cell{
			"name": {Value: messages.MustValue("ada"), Clock: clock(7, siteA)},
			"note": {Value: messages.Null, Clock: clock(5, siteB)},
		},
	}
}

func sameRow(a, b persistence.Row) error {
	if a.Schema != b.Schema || a.Table != b.Table || a.Exists != b.Exists || a.Existence != b.Existence || a.Tomb != b.Tomb {
		return fmt.Errorf("header %+v vs %+v", a, b)
	}
	if !bytes.Equal(a.Key.Encode(), b.Key.Encode()) {
		return fmt.Errorf("key %v vs %v", a.Key, b.Key)
	}
	if len(a.Cells) != len(b.Cells) {
		return fmt.Errorf("cells %v vs %v", a.Cells, b.Cells)
	}
	for n, c := range a.Cells {
		d, ok := b.Cells[n]
		if !ok || !c.Value.Equal(d.Value) || c.Clock != d.Clock {
			return fmt.Errorf("cell %q: %+v vs %+v (present %v)", n, c, d, ok)
		}
	}
	return nil
}

func checkRow(t *testing.T, r persistence.SyncReader, want persistence.Row) {
	t.Helper()
	got, ok, err := r.Row(persistence.TableKey{Schema: want.Schema, Table: want.Table}, want.Key.Encode())
	if err != nil || !ok {
		t.Fatalf("Row: ok=%v err=%v", ok, err)
	}
	if err := sameRow(got, want); err != nil {
		t.Fatalf("Row: %v", err)
	}
}

func mustErrIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want an error matching %v", what, err, target)
	}
}

// --- tests ---

func testClosed(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ran := false
	mustErrIs(t, "Update after Close", s.Update(ctx, func(persistence.SyncTx) error { ran = true; return nil }), persistence.ErrClosed)
	mustErrIs(t, "View after Close", s.View(ctx, func(persistence.SyncReader) error { ran = true; return nil }), persistence.ErrClosed)
	// The Close rule (persistence.ErrClosed): a second Close returns nil.
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if ran {
		t.Fatal("fn ran on a closed store")
	}
}

func testCancelled(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	c, cancel := context.WithCancel(ctx)
	cancel()
	ran := false
	mustErrIs(t, "Update", s.Update(c, func(tx persistence.SyncTx) error { ran = true; return tx.PutMeta("k", []byte("v")) }), context.Canceled)
	mustErrIs(t, "View", s.View(c, func(persistence.SyncReader) error { ran = true; return nil }), context.Canceled)
	if ran {
		t.Fatal("fn ran with a cancelled context")
	}
	view(t, s, func(r persistence.SyncReader) error {
		if _, ok, _ := r.Meta("k"); ok {
			t.Fatal("write of a cancelled Update is visible")
		}
		return nil
	})
}

func testTxAfterReturn(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	var leaked persistence.SyncTx
	update(t, s, func(tx persistence.SyncTx) error { leaked = tx; return nil })
	mustErrIs(t, "PutMeta on an ended tx", leaked.PutMeta("k", []byte("v")), persistence.ErrClosed)
	_, _, err := leaked.Meta("k")
	mustErrIs(t, "Meta on an ended tx", err, persistence.ErrClosed)
	var leakedR persistence.SyncReader
	view(t, s, func(r persistence.SyncReader) error { leakedR = r; return nil })
	_, err = leakedR.LastSeq()
	mustErrIs(t, "LastSeq on an ended view", err, persistence.ErrClosed)
}

func testViewReadOnly(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	view(t, s, func(r persistence.SyncReader) error {
		if w, ok := r.(persistence.SyncTx); ok {
			if err := w.PutMeta("k", []byte("v")); err == nil {
				t.Fatal("PutMeta through a View succeeded")
			}
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		if _, ok, _ := r.Meta("k"); ok {
			t.Fatal("a View wrote")
		}
		return nil
	})
}

func testAppendSeq(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	view(t, s, func(r persistence.SyncReader) error {
		if n := lastSeq(t, r); n != 0 {
			t.Fatalf("LastSeq of an empty store = %d", n)
		}
		return nil
	})
	evs := []persistence.StoredEvent{mkEvent(1, tblX, []byte("r1"), 10), mkEvent(2, tblX, []byte("r2"), 5), mkEvent(3, tblAB, []byte("r1"), 7)}
	seqs := appendAll(t, s, evs...)
	seqs = append(seqs, appendAll(t, s, mkEvent(4, tblX, []byte("r1"), 1))...)
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4}) {
		t.Fatalf("seqs = %v, want 1 2 3 4", seqs)
	}
	view(t, s, func(r persistence.SyncReader) error {
		if n := lastSeq(t, r); n != 4 {
			t.Fatalf("LastSeq = %d, want 4", n)
		}
		for i, ev := range evs {
			ev.Seq = seqs[i]
			checkEvent(t, r, ev)
		}
		checkNoEvent(t, r, eventID(99))
		return nil
	})
}

func testAppendDuplicate(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	orig := mkEvent(1, tblX, []byte("r1"), 10)
	appendAll(t, s, orig)
	orig.Seq = 1
	// Same id, hence (by construction: the id hashes the signed bytes,
	// which hold the site and HLC) the same site and HLC.
	dup := mkEvent(1, tblAB, []byte("other"), 10)
	dup.Raw = []byte("different bytes")
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.AppendEvent(dup)
		mustErrIs(t, "AppendEvent of a stored id", err, persistence.ErrDuplicate)
		second := mkEvent(2, tblX, []byte("r1"), 11)
		if _, err := tx.AppendEvent(second); err != nil {
			return err
		}
		_, err = tx.AppendEvent(second)
		mustErrIs(t, "AppendEvent of an id appended in the same tx", err, persistence.ErrDuplicate)
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		checkEvent(t, r, orig)
		if n := lastSeq(t, r); n != 2 {
			t.Fatalf("LastSeq = %d, want 2 (duplicates consume no sequence)", n)
		}
		if got := tableEvents(t, r, tblAB); len(got) != 0 {
			t.Fatalf("duplicate indexed under its table: %v", got)
		}
		if got := rowEvents(t, r, tblX, []byte("r1")); !slices.Equal(got, []uint64{1, 2}) {
			t.Fatalf("RowEvents = %v, want [1 2]", got)
		}
		return nil
	})
}

func testUpdateAtomic(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	appendAll(t, s, mkEvent(1, tblX, []byte("r1"), 10))
	g := persistence.GroupKey{Site: siteA, Schema: "s", Table: "t"}
	err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(mkEvent(2, tblX, []byte("r1"), 11)); err != nil {
			return err
		}
		if n, err := tx.DeleteEventsBelow(tblX, 100); err != nil || n != 2 {
			return fmt.Errorf("DeleteEventsBelow = %d, %v", n, err)
		}
		for _, f := range []func() error{
			func() error { return tx.PutRow(sampleRow(tblX, 1)) },
			func() error { return tx.PutTable(persistence.TableDef{Schema: "s", Table: "t"}) },
			func() error { return tx.SetHorizon(tblX, 5) },
			func() error { return tx.HoldEvent(g, 1) },
			func() error { return tx.PutMeta("m", []byte("v")) },
			func() error { return tx.PutSealedMeta(persistence.RecordNodeKey, "node", []byte("secret")) },
			func() error {
				return tx.PutKey(persistence.KeyEntry{Kid: []byte("k1"), Site: siteA, PublicKey: []byte("pk")})
			},
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return errFn
	})
	mustErrIs(t, "Update whose fn failed", err, errFn)
	view(t, s, func(r persistence.SyncReader) error {
		checkEvent(t, r, func() persistence.StoredEvent { e := mkEvent(1, tblX, []byte("r1"), 10); e.Seq = 1; return e }())
		checkNoEvent(t, r, eventID(2))
		if n := lastSeq(t, r); n != 1 {
			t.Fatalf("LastSeq = %d after a failed Update, want 1", n)
		}
		if _, ok, _ := r.Row(tblX, key(1).Encode()); ok {
			t.Fatal("row of a failed Update kept")
		}
		if _, ok, _ := r.Table(persistence.TableKey{Schema: "s", Table: "t"}); ok {
			t.Fatal("table of a failed Update kept")
		}
		if h, _ := r.Horizon(tblX); h != 0 {
			t.Fatal("horizon of a failed Update kept")
		}
		if gs, _ := r.HeldGroups(); len(gs) != 0 {
			t.Fatal("held group of a failed Update kept")
		}
		if _, ok, _ := r.Meta("m"); ok {
			t.Fatal("meta of a failed Update kept")
		}
		if _, ok, _ := r.SealedMeta(persistence.RecordNodeKey, "node"); ok {
			t.Fatal("sealed meta of a failed Update kept")
		}
		if ks, _ := r.Keys(); len(ks) != 0 {
			t.Fatal("key of a failed Update kept")
		}
		return nil
	})
	// The sequence of the failed Update was not consumed (see package doc).
	if seqs := appendAll(t, s, mkEvent(3, tblX, []byte("r1"), 12)); seqs[0] != 2 {
		t.Fatalf("seq after a failed Update = %d, want 2", seqs[0])
	}
}

func testEventsAfter(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	var evs []persistence.StoredEvent
	for i := 1; i <= 300; i++ { // more than one internal scan chunk
		evs = append(evs, mkEvent(i, tblX, []byte{byte(i % 7)}, messages.HLC(1000-i)))
	}
	appendAll(t, s, evs...)
	view(t, s, func(r persistence.SyncReader) error {
		all := after(t, r, 0, 0)
		if len(all) != 300 {
			t.Fatalf("EventsAfter(0) visited %d, want 300", len(all))
		}
		for i, ev := range all {
			want := evs[i]
			want.Seq = uint64(i + 1)
			if !sameEvent(ev, want) {
				t.Fatalf("EventsAfter[%d] = %+v, want %+v", i, ev, want)
			}
		}
		if got := seqsOf(after(t, r, 10, 3)); !slices.Equal(got, []uint64{11, 12, 13}) {
			t.Fatalf("EventsAfter(10, limit 3) = %v", got)
		}
		if got := seqsOf(after(t, r, 298, 0)); !slices.Equal(got, []uint64{299, 300}) {
			t.Fatalf("EventsAfter(298) = %v", got)
		}
		if got := after(t, r, 300, 0); len(got) != 0 {
			t.Fatalf("EventsAfter(LastSeq) = %v", seqsOf(got))
		}
		if got := after(t, r, ^uint64(0), 0); len(got) != 0 {
			t.Fatalf("EventsAfter(max) = %v", seqsOf(got))
		}
		var n int
		if err := r.EventsAfter(0, 0, func(persistence.StoredEvent) (bool, error) { n++; return n < 5, nil }); err != nil || n != 5 {
			t.Fatalf("EventsAfter stop after 5: visited %d, err %v", n, err)
		}
		return nil
	})
	// Deleted events are skipped.
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.DeleteEventsBelow(tblX, messages.HLC(1000-150)) // removes seqs 151..300
		return err
	})
	view(t, s, func(r persistence.SyncReader) error {
		if got := seqsOf(after(t, r, 148, 0)); !slices.Equal(got, []uint64{149, 150}) {
			t.Fatalf("EventsAfter(148) after deletion = %v", got)
		}
		return nil
	})
}

func testIndexIsolation(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	// Row keys that are prefixes of each other, tables whose names collide
	// when concatenated, and an empty schema.
	tblE := persistence.TableKey{Schema: "", Table: "abc"}
	evs := []persistence.StoredEvent{
		mkEvent(1, tblAB, []byte("a"), 1),
		mkEvent(2, tblAB, []byte("ab"), 2),
		mkEvent(3, tblAB, []byte("a"), 3),
		mkEvent(4, tblBC, []byte("a"), 4),
		mkEvent(5, tblBC, []byte("abc"), 5),
		mkEvent(6, tblE, []byte("a"), 6),
		mkEvent(7, tblAB, []byte("a\x00"), 7),
	}
	appendAll(t, s, evs...)
	view(t, s, func(r persistence.SyncReader) error {
		for _, c := range []struct {
			tk   persistence.TableKey
			row  string
			want []uint64
		}{
			{tblAB, "a", []uint64{1, 3}},
			{tblAB, "ab", []uint64{2}},
			{tblAB, "a\x00", []uint64{7}},
			{tblAB, "abc", nil},
			{tblBC, "a", []uint64{4}},
			{tblBC, "abc", []uint64{5}},
			{tblBC, "ab", nil},
			{tblE, "a", []uint64{6}},
			{persistence.TableKey{Schema: "abc"}, "a", nil},
		} {
			if got := rowEvents(t, r, c.tk, []byte(c.row)); !slices.Equal(got, c.want) {
				t.Fatalf("RowEvents(%q/%q, %q) = %v, want %v", c.tk.Schema, c.tk.Table, c.row, got, c.want)
			}
		}
		for _, c := range []struct {
			tk   persistence.TableKey
			want []uint64
		}{
			{tblAB, []uint64{1, 2, 3, 7}}, {tblBC, []uint64{4, 5}}, {tblE, []uint64{6}},
			{persistence.TableKey{Schema: "abc"}, nil}, {persistence.TableKey{Schema: "a", Table: "b"}, nil},
		} {
			if got := tableEvents(t, r, c.tk); !slices.Equal(got, c.want) {
				t.Fatalf("TableEvents(%q/%q) = %v, want %v", c.tk.Schema, c.tk.Table, got, c.want)
			}
		}
		// Each visited event carries its full record.
		return r.RowEvents(tblBC, []byte("abc"), func(ev persistence.StoredEvent) (bool, error) {
			want := evs[4]
			want.Seq = 5
			if !sameEvent(ev, want) {
				t.Fatalf("RowEvents event = %+v, want %+v", ev, want)
			}
			return true, nil
		})
	})
}

// testIndexesInWritingTx: events appended in one transaction, out of
// every index's key order (HLCs falling, rows interleaved, two tables),
// are visible to RowEvents, TableEvents, TableEventKeys and
// DeleteEventsBelow in that same transaction, between further appends, and
// exactly the same after the commit (a store may put index entries late,
// never lose or misplace them).
func testIndexesInWritingTx(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	rows := [][]byte{[]byte("r3"), []byte("r1"), []byte("r2")}
	var first, second []persistence.StoredEvent
	for i := 0; i < 30; i++ {
		tk := tblX
		if i%5 == 4 {
			tk = tblAB
		}
		ev := mkEvent(i+1, tk, rows[i%3], messages.HLC(1000-10*i))
		if i%2 == 1 {
			ev.Site = siteB
		}
		if i < 20 {
			first = append(first, ev)
		} else {
			second = append(second, ev)
		}
	}
	// want lists the seqs of rowKey's (or, nil, the table's) events among
	// the first n appended (seq i+1 is event i).
	want := func(n int, tk persistence.TableKey, rowKey []byte, minHLC messages.HLC) []uint64 {
		var out []uint64
		for i, ev := range append(slices.Clone(first), second...)[:n] {
			if (persistence.TableKey{Schema: ev.Schema, Table: ev.Table}) == tk && (rowKey == nil || bytes.Equal(ev.RowKey, rowKey)) && ev.HLC >= minHLC {
				out = append(out, uint64(i+1))
			}
		}
		return out
	}
	// check compares every index with want; minX is tblX's deletion bound.
	check := func(r persistence.SyncReader, n int, minX messages.HLC, when string) {
		t.Helper()
		for _, tk := range []persistence.TableKey{tblX, tblAB} {
			minHLC := messages.HLC(0)
			if tk == tblX {
				minHLC = minX
			}
			for _, rk := range rows {
				if got, w := rowEvents(t, r, tk, rk), want(n, tk, rk, minHLC); !slices.Equal(got, w) {
					t.Fatalf("%s: RowEvents(%s, %s) = %v, want %v", when, tk.Table, rk, got, w)
				}
			}
			if got, w := tableEvents(t, r, tk), want(n, tk, nil, minHLC); !slices.Equal(got, w) {
				t.Fatalf("%s: TableEvents(%s) = %v, want %v", when, tk.Table, got, w)
			}
			if got, w := len(tableKeys(t, r, tk, 0)), len(want(n, tk, nil, minHLC)); got != w || w == 0 {
				t.Fatalf("%s: TableEventKeys(%s) lists %d keys, want %d", when, tk.Table, got, w)
			}
		}
	}
	update(t, s, func(tx persistence.SyncTx) error {
		for _, ev := range first {
			if _, err := tx.AppendEvent(ev); err != nil {
				return err
			}
		}
		check(tx, len(first), 0, "in the writing transaction")
		for _, ev := range second {
			if _, err := tx.AppendEvent(ev); err != nil {
				return err
			}
		}
		check(tx, len(first)+len(second), 0, "after more appends")
		// Events 0..29 have HLCs 1000..710: below 800 are events 21..29.
		if n, err := tx.DeleteEventsBelow(tblX, 800); err != nil || n != len(want(30, tblX, nil, 0))-len(want(30, tblX, nil, 800)) {
			t.Fatalf("DeleteEventsBelow(800) in the writing transaction = %d, %v", n, err)
		}
		check(tx, 30, 800, "after DeleteEventsBelow in the writing transaction")
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		check(r, 30, 800, "after the commit")
		return nil
	})
	view(t, reopen(), func(r persistence.SyncReader) error {
		check(r, 30, 800, "after reopen")
		return nil
	})
}

// testRowsRewrittenInOneTx: a row put several times in one transaction
// reads back as its last version there (Row and Rows, rows written during
// a Rows scan included), stays the caller's copy both ways, and commits
// as its last version; a failed transaction keeps none of it.
func testRowsRewrittenInOneTx(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	version := func(id any, h messages.HLC) persistence.Row {
		r := sampleRow(tblX, id)
		r.Existence = clock(h, siteA)
		r.Cells["name"] = persistence.Cell{Value: messages.MustValue(fmt.Sprintf("v%d", h)), Clock: clock(h, siteA)}
		return r
	}
	update(t, s, func(tx persistence.SyncTx) error {
		for h := messages.HLC(1); h <= 3; h++ {
			for _, id := range []int{3, 1, 2} {
				r := version(id, h)
				if err := tx.PutRow(r); err != nil {
					return err
				}
				r.Cells["name"] = persistence.Cell{Value: messages.MustValue("changed after PutRow")}
				checkRow(t, tx, version(id, h))
			}
		}
		got, _, err := tx.Row(tblX, key(1).Encode())
		if err != nil {
			return err
		}
		got.Cells["name"] = persistence.Cell{Value: messages.MustValue("changed after Row")}
		checkRow(t, tx, version(1, 3))
		// A scan sees the last versions; its callback may write (whether
		// the scan then sees that write is not part of the contract).
		var seen []string
		err = tx.Rows(tblX, nil, func(rowKey []byte, r persistence.Row) (bool, error) {
			var id int
			var name string
			if err := r.Key["id"].Decode(&id); err != nil {
				return false, err
			}
			if err := r.Cells["name"].Value.Decode(&name); err != nil {
				return false, err
			}
			seen = append(seen, fmt.Sprintf("%d:%s", id, name))
			if len(seen) == 1 {
				return true, tx.PutRow(version(9, 4))
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		if len(seen) < 3 || seen[0] != "1:v3" || seen[1] != "2:v3" || seen[2] != "3:v3" {
			t.Fatalf("Rows in the writing transaction saw %v, want rows 1, 2, 3 at v3 first", seen)
		}
		return nil
	})
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		if err := tx.PutRow(version(1, 8)); err != nil {
			return err
		}
		return errFn
	}); !errors.Is(err, errFn) {
		t.Fatalf("failing Update: %v", err)
	}
	committed := func(r persistence.SyncReader) error {
		for _, id := range []int{1, 2, 3} {
			checkRow(t, r, version(id, 3))
		}
		checkRow(t, r, version(9, 4))
		return nil
	}
	view(t, s, committed)
	view(t, reopen(), committed)
}

func testDeleteBelow(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	evs := []persistence.StoredEvent{
		mkEvent(1, tblX, []byte("r1"), 10),
		mkEvent(2, tblX, []byte("r2"), 20),
		mkEvent(3, tblX, []byte("r1"), 30),
		mkEvent(4, tblX, []byte("r1"), 20),
		mkEvent(5, tblAB, []byte("r1"), 5), // another table, below every horizon used here
		mkEvent(6, tblX, []byte("r3"), 19),
	}
	appendAll(t, s, evs...)
	update(t, s, func(tx persistence.SyncTx) error {
		if n, err := tx.DeleteEventsBelow(tblX, 0); err != nil || n != 0 {
			t.Fatalf("DeleteEventsBelow(0) = %d, %v", n, err)
		}
		n, err := tx.DeleteEventsBelow(tblX, 20) // strictly below: 10 and 19 go, 20 stays
		if err != nil || n != 2 {
			t.Fatalf("DeleteEventsBelow(20) = %d, %v; want 2", n, err)
		}
		if n, err := tx.DeleteEventsBelow(tblX, 20); err != nil || n != 0 {
			t.Fatalf("second DeleteEventsBelow(20) = %d, %v; want 0", n, err)
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		checkNoEvent(t, r, eventID(1))
		checkNoEvent(t, r, eventID(6))
		for _, i := range []int{2, 3, 4, 5} {
			ev := evs[i-1]
			ev.Seq = uint64(i)
			checkEvent(t, r, ev)
		}
		if got := rowEvents(t, r, tblX, []byte("r1")); !slices.Equal(got, []uint64{3, 4}) {
			t.Fatalf("RowEvents(r1) = %v, want [3 4]", got)
		}
		if got := rowEvents(t, r, tblX, []byte("r3")); len(got) != 0 {
			t.Fatalf("RowEvents(r3) = %v, want none", got)
		}
		if got := tableEvents(t, r, tblX); !slices.Equal(got, []uint64{2, 3, 4}) {
			t.Fatalf("TableEvents = %v, want [2 3 4]", got)
		}
		if got := tableEvents(t, r, tblAB); !slices.Equal(got, []uint64{5}) {
			t.Fatalf("TableEvents(other table) = %v, want [5]", got)
		}
		if got := seqsOf(after(t, r, 0, 0)); !slices.Equal(got, []uint64{2, 3, 4, 5}) {
			t.Fatalf("EventsAfter = %v", got)
		}
		if n := lastSeq(t, r); n != 6 {
			t.Fatalf("LastSeq = %d after deletion, want 6", n)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error {
		if n, err := tx.DeleteEventsBelow(tblX, ^messages.HLC(0)); err != nil || n != 3 {
			t.Fatalf("DeleteEventsBelow(max) = %d, %v; want 3", n, err)
		}
		return nil
	})
	if seqs := appendAll(t, s, mkEvent(7, tblX, []byte("r1"), 40)); seqs[0] != 7 {
		t.Fatalf("seq after deleting the newest events = %d, want 7 (never reused)", seqs[0])
	}
}

func testRowRoundTrip(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	row := sampleRow(tblX, 1)
	dead := persistence.Row{Schema: tblX.Schema, Table: tblX.Table, Key: key(2), Exists: false, Tomb: clock(9, siteB), Existence: clock(9, siteB)}
	fresh := persistence.Row{Schema: tblX.Schema, Table: tblX.Table, Key: messages.Columns{"a": messages.MustValue(1), "b": messages.MustValue("x")}}
	update(t, s, func(tx persistence.SyncTx) error {
		for _, r := range []persistence.Row{row, dead, fresh} {
			if err := tx.PutRow(r); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		checkRow(t, r, row)
		checkRow(t, r, dead)
		checkRow(t, r, fresh)
		got, _, _ := r.Row(tblX, key(1).Encode())
		if c, ok := got.Cells["note"]; !ok || !c.Value.IsNull() {
			t.Fatalf("null cell = %+v (present %v), want present and null", c, ok)
		}
		if _, ok := got.Cells["never"]; ok {
			t.Fatal("never-written column present")
		}
		if _, ok, err := r.Row(tblX, key(3).Encode()); ok || err != nil {
			t.Fatalf("absent row: ok=%v err=%v", ok, err)
		}
		if _, ok, err := r.Row(tblAB, key(1).Encode()); ok || err != nil {
			t.Fatalf("row under another table: ok=%v err=%v", ok, err)
		}
		return nil
	})
	// PutRow replaces the whole state.
	row2 := row
	row2.Cells = map[string]persistence.Cell{"name": {Value: messages.MustValue("bob"), Clock: clock(8, siteA)}}
	row2.Existence = clock(8, siteA)
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutRow(row2) })
	view(t, s, func(r persistence.SyncReader) error { checkRow(t, r, row2); return nil })
}

// testRows: a table without a definition keys its rows by their CBOR
// encoding alone (no key column order to follow).
func testRows(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	ids := []any{"b", "a", "ab", "", 3, 1, 300, "zz", []byte{0}, -1}
	var want [][]byte
	update(t, s, func(tx persistence.SyncTx) error {
		for _, id := range ids {
			want = append(want, key(id).Encode())
			if err := tx.PutRow(sampleRow(tblAB, id)); err != nil {
				return err
			}
		}
		// Rows of a colliding table and of a prefix table must not show.
		if err := tx.PutRow(sampleRow(tblBC, "a")); err != nil {
			return err
		}
		return tx.PutRow(sampleRow(persistence.TableKey{Schema: "a", Table: "b"}, "c"))
	})
	sort.Slice(want, func(i, j int) bool { return bytes.Compare(want[i], want[j]) < 0 })
	rows := func(r persistence.SyncReader, from []byte, stop int) [][]byte {
		var out [][]byte
		if err := r.Rows(tblAB, from, func(k []byte, row persistence.Row) (bool, error) {
			if !bytes.Equal(row.Key.Encode(), k) || row.Schema != tblAB.Schema || row.Table != tblAB.Table {
				t.Fatalf("Rows: row %+v under key %x", row, k)
			}
			out = append(out, k)
			return stop == 0 || len(out) < stop, nil
		}); err != nil {
			t.Fatalf("Rows: %v", err)
		}
		return out
	}
	view(t, s, func(r persistence.SyncReader) error {
		if got := rows(r, nil, 0); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("Rows = %x, want %x", got, want)
		}
		if got := rows(r, want[3], 0); !slices.EqualFunc(got, want[4:], bytes.Equal) {
			t.Fatalf("Rows after a stored key = %x, want %x", got, want[4:])
		}
		between := append(bytes.Clone(want[3]), 0) // not stored: resumes at the next key
		if got := rows(r, between, 0); !slices.EqualFunc(got, want[4:], bytes.Equal) {
			t.Fatalf("Rows after an absent key = %x, want %x", got, want[4:])
		}
		if got := rows(r, nil, 2); !slices.EqualFunc(got, want[:2], bytes.Equal) {
			t.Fatalf("Rows stopped at 2 = %x", got)
		}
		if got := rows(r, want[len(want)-1], 0); len(got) != 0 {
			t.Fatalf("Rows after the last key = %x", got)
		}
		return nil
	})
}

func testPutRowBadKey(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	for name, k := range map[string]messages.Columns{
		"nil":       nil,
		"empty":     {},
		"malformed": {"id": messages.Value{0xff, 0x00}},
	} {
		err := s.Update(ctx, func(tx persistence.SyncTx) error {
			return tx.PutRow(persistence.Row{Schema: "s", Table: "t", Key: k})
		})
		if err == nil {
			t.Fatalf("PutRow with a %s key succeeded", name)
		}
	}
}

func testEmptyNames(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	if err := s.Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta("", []byte("v")) }); err == nil {
		t.Fatal("PutMeta with an empty key succeeded")
	}
	if err := s.Update(ctx, func(tx persistence.SyncTx) error {
		return tx.PutKey(persistence.KeyEntry{Site: siteA, PublicKey: []byte("pk")})
	}); err == nil {
		t.Fatal("PutKey with an empty kid succeeded")
	}
}

func testCopies(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	ev := mkEvent(1, tblX, []byte("r1"), 10)
	row := sampleRow(tblX, 1)
	meta := []byte("meta-value")
	kid := []byte("kid-1")
	update(t, s, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(ev); err != nil {
			return err
		}
		if err := tx.PutRow(row); err != nil {
			return err
		}
		if err := tx.PutMeta("m", meta); err != nil {
			return err
		}
		if err := tx.PutSealedMeta(persistence.RecordNodeKey, "node", meta); err != nil {
			return err
		}
		if err := tx.PutTable(persistence.TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"c"}}); err != nil {
			return err
		}
		if err := tx.PutKey(persistence.KeyEntry{Kid: kid, Site: siteA, PublicKey: []byte("pk")}); err != nil {
			return err
		}
		// Mutating inputs after the puts, inside the tx, must not reach the store.
		ev.Raw[0], ev.RowKey[0], meta[0], kid[0] = 'X', 'X', 'X', 'X'
		row.Cells["name"].Value[1] = 'X'
		row.Cells["extra"] = persistence.Cell{Value: messages.Null}
		return nil
	})
	wantEv := mkEvent(1, tblX, []byte("r1"), 10)
	wantEv.Seq = 1
	wantRow := sampleRow(tblX, 1)
	mutate := func(r persistence.SyncReader) {
		e, _, _ := r.Event(wantEv.Site, wantEv.HLC, wantEv.ID)
		e.Raw[0], e.RowKey[0] = 'Y', 'Y'
		_ = r.EventsAfter(0, 0, func(e persistence.StoredEvent) (bool, error) { e.Raw[0] = 'Y'; return true, nil })
		_ = r.RowEvents(tblX, []byte("r1"), func(e persistence.StoredEvent) (bool, error) { e.Raw[0] = 'Y'; return true, nil })
		rw, _, _ := r.Row(tblX, wantRow.Key.Encode())
		rw.Cells["name"].Value[1] = 'Y'
		rw.Key["id"][0] = 0
		_ = r.Rows(tblX, nil, func(k []byte, rw persistence.Row) (bool, error) {
			k[0] = 0
			rw.Cells["note"].Value[0] = 0
			return true, nil
		})
		m, _, _ := r.Meta("m")
		m[0] = 'Y'
		sm, _, _ := r.SealedMeta(persistence.RecordNodeKey, "node")
		sm[0] = 'Y'
		defs, _ := r.Tables()
		defs[0].KeyColumns[0] = "Y"
		ks, _ := r.Keys()
		ks[0].Kid[0], ks[0].PublicKey[0] = 'Y', 'Y'
		hs, _ := r.HeldEvents(persistence.GroupKey{})
		_ = hs
	}
	check := func(r persistence.SyncReader) {
		checkEvent(t, r, wantEv)
		checkRow(t, r, wantRow)
		if m, _, _ := r.Meta("m"); string(m) != "meta-value" {
			t.Fatalf("Meta = %q", m)
		}
		if m, _, _ := r.SealedMeta(persistence.RecordNodeKey, "node"); string(m) != "meta-value" {
			t.Fatalf("SealedMeta = %q", m)
		}
		if d, _, _ := r.Table(persistence.TableKey{Schema: "s", Table: "t"}); d.KeyColumns[0] != "id" {
			t.Fatalf("Table = %+v", d)
		}
		if ks, _ := r.Keys(); string(ks[0].Kid) != "kid-1" || string(ks[0].PublicKey) != "pk" {
			t.Fatalf("Keys = %+v", ks)
		}
	}
	view(t, s, func(r persistence.SyncReader) error { mutate(r); return nil })
	view(t, s, func(r persistence.SyncReader) error { check(r); return nil })
	update(t, s, func(tx persistence.SyncTx) error { mutate(tx); check(tx); return nil })
	view(t, s, func(r persistence.SyncReader) error { check(r); return nil })
}

func testHorizons(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.SetHorizon(tblAB, 100); err != nil {
			return err
		}
		return tx.SetHorizon(tblX, 7)
	})
	update(t, s, func(tx persistence.SyncTx) error { return tx.SetHorizon(tblX, 9) })
	view(t, s, func(r persistence.SyncReader) error {
		for tk, want := range map[persistence.TableKey]messages.HLC{tblAB: 100, tblX: 9, tblBC: 0} {
			if h, err := r.Horizon(tk); err != nil || h != want {
				t.Fatalf("Horizon(%v) = %v, %v; want %v", tk, h, err, want)
			}
		}
		return nil
	})
}

func testHeld(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	g1 := persistence.GroupKey{Site: siteA, Schema: tblAB.Schema, Table: tblAB.Table}
	g2 := persistence.GroupKey{Site: siteA, Schema: tblBC.Schema, Table: tblBC.Table}
	g3 := persistence.GroupKey{Site: siteB, Schema: tblAB.Schema, Table: tblAB.Table}
	update(t, s, func(tx persistence.SyncTx) error {
		for _, h := range []struct {
			g   persistence.GroupKey
			seq uint64
		}{{g1, 5}, {g1, 1}, {g1, 300}, {g1, 3}, {g1, 3}, {g2, 2}, {g3, 9}} {
			if err := tx.HoldEvent(h.g, h.seq); err != nil {
				return err
			}
		}
		return nil
	})
	groups := func(r persistence.SyncReader) []persistence.GroupKey {
		gs, err := r.HeldGroups()
		if err != nil {
			t.Fatalf("HeldGroups: %v", err)
		}
		slices.SortFunc(gs, func(a, b persistence.GroupKey) int {
			return cmpStrings(a.Site.String()+"/"+a.Schema+"/"+a.Table, b.Site.String()+"/"+b.Schema+"/"+b.Table)
		})
		return gs
	}
	held := func(r persistence.SyncReader, g persistence.GroupKey) []uint64 {
		seqs, err := r.HeldEvents(g)
		if err != nil {
			t.Fatalf("HeldEvents: %v", err)
		}
		return seqs
	}
	view(t, s, func(r persistence.SyncReader) error {
		if got := groups(r); !slices.Equal(got, []persistence.GroupKey{g1, g2, g3}) {
			t.Fatalf("HeldGroups = %v, want %v", got, []persistence.GroupKey{g1, g2, g3})
		}
		if got := held(r, g1); !slices.Equal(got, []uint64{1, 3, 5, 300}) {
			t.Fatalf("HeldEvents(g1) = %v, want [1 3 5 300]", got)
		}
		if got := held(r, g2); !slices.Equal(got, []uint64{2}) {
			t.Fatalf("HeldEvents(g2) = %v", got)
		}
		if got := held(r, persistence.GroupKey{Site: siteB}); len(got) != 0 {
			t.Fatalf("HeldEvents(unknown) = %v", got)
		}
		return nil
	})
	update(t, s, func(tx persistence.SyncTx) error { return tx.ReleaseGroup(g1) })
	update(t, s, func(tx persistence.SyncTx) error { return tx.ReleaseGroup(g1) }) // releasing twice is fine
	view(t, s, func(r persistence.SyncReader) error {
		if got := groups(r); len(got) != 2 || slices.Contains(got, g1) {
			t.Fatalf("HeldGroups after release = %v", got)
		}
		if got := held(r, g1); len(got) != 0 {
			t.Fatalf("HeldEvents(released) = %v", got)
		}
		if got := held(r, g3); !slices.Equal(got, []uint64{9}) {
			t.Fatalf("HeldEvents(g3) = %v", got)
		}
		return nil
	})
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func testMeta(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	update(t, s, func(tx persistence.SyncTx) error {
		for _, f := range []func() error{
			func() error { return tx.PutMeta("k", []byte("plain")) },
			func() error { return tx.PutMeta("empty", []byte{}) },
			func() error { return tx.PutSealedMeta(persistence.RecordNodeKey, "k", []byte("secret-node")) },
			func() error { return tx.PutSealedMeta(persistence.RecordIdentity, "k", []byte("secret-identity")) },
			func() error { return tx.PutMeta("k2", []byte("v1")) },
			func() error { return tx.PutMeta("k2", []byte("v2")) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(r persistence.SyncReader) error {
		for k, want := range map[string]string{"k": "plain", "k2": "v2", "empty": ""} {
			if v, ok, err := r.Meta(k); err != nil || !ok || string(v) != want {
				t.Fatalf("Meta(%q) = %q, %v, %v; want %q", k, v, ok, err, want)
			}
		}
		if _, ok, err := r.Meta("absent"); ok || err != nil {
			t.Fatalf("Meta(absent): ok=%v err=%v", ok, err)
		}
		for rt, want := range map[persistence.RecordType]string{persistence.RecordNodeKey: "secret-node", persistence.RecordIdentity: "secret-identity"} {
			if v, ok, err := r.SealedMeta(rt, "k"); err != nil || !ok || string(v) != want {
				t.Fatalf("SealedMeta(%d) = %q, %v, %v; want %q", rt, v, ok, err, want)
			}
		}
		if _, ok, err := r.SealedMeta(persistence.RecordSession, "k"); ok || err != nil {
			t.Fatalf("SealedMeta(other type): ok=%v err=%v", ok, err)
		}
		if _, ok, err := r.SealedMeta(persistence.RecordNodeKey, "k2"); ok || err != nil {
			t.Fatalf("SealedMeta of a plain meta key: ok=%v err=%v", ok, err)
		}
		return nil
	})
}

func testKeys(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	k1 := persistence.KeyEntry{Kid: []byte("kid-1"), Site: siteA, PublicKey: []byte("pk-1")}
	k2 := persistence.KeyEntry{Kid: []byte("kid-2"), Site: siteB, PublicKey: []byte("pk-2"), Cutoff: 42}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutKey(k1); err != nil {
			return err
		}
		return tx.PutKey(k2)
	})
	k1b := k1
	k1b.PublicKey, k1b.Cutoff = []byte("pk-1b"), 7
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutKey(k1b) })
	view(t, s, func(r persistence.SyncReader) error {
		ks, err := r.Keys()
		if err != nil {
			t.Fatalf("Keys: %v", err)
		}
		slices.SortFunc(ks, func(a, b persistence.KeyEntry) int { return bytes.Compare(a.Kid, b.Kid) })
		if len(ks) != 2 {
			t.Fatalf("Keys = %+v, want 2 entries", ks)
		}
		for i, want := range []persistence.KeyEntry{k1b, k2} {
			got := ks[i]
			if !bytes.Equal(got.Kid, want.Kid) || got.Site != want.Site || !bytes.Equal(got.PublicKey, want.PublicKey) || got.Cutoff != want.Cutoff {
				t.Fatalf("Keys[%d] = %+v, want %+v", i, got, want)
			}
		}
		return nil
	})
}

func testTables(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	d1 := persistence.TableDef{Schema: "a", Table: "bc", KeyColumns: []string{"id"}, Columns: []string{"x", "y"}}
	d2 := persistence.TableDef{Schema: "ab", Table: "c", KeyColumns: []string{"k1", "k2"}, Columns: nil}
	update(t, s, func(tx persistence.SyncTx) error {
		if err := tx.PutTable(d1); err != nil {
			return err
		}
		return tx.PutTable(d2)
	})
	d1b := d1
	d1b.Columns = []string{"x", "y", "z"}
	// Column types round-trip; a type a newer build declared reads as any.
	d1b.Types = map[string]messages.ColumnType{"id": messages.TypeInteger, "x": messages.TypeText, "y": messages.TypeAny, "z": 200}
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutTable(d1b) })
	same := func(a, b persistence.TableDef) bool {
		for _, c := range append(slices.Clone(b.KeyColumns), b.Columns...) {
			if a.TypeOf(c) != b.TypeOf(c) {
				return false
			}
		}
		return a.Schema == b.Schema && a.Table == b.Table && slices.Equal(a.KeyColumns, b.KeyColumns) && slices.Equal(a.Columns, b.Columns)
	}
	view(t, s, func(r persistence.SyncReader) error {
		for _, want := range []persistence.TableDef{d1b, d2} {
			got, ok, err := r.Table(persistence.TableKey{Schema: want.Schema, Table: want.Table})
			if err != nil || !ok || !same(got, want) {
				t.Fatalf("Table = %+v, %v, %v; want %+v", got, ok, err, want)
			}
		}
		if _, ok, err := r.Table(persistence.TableKey{Schema: "a", Table: "b"}); ok || err != nil {
			t.Fatalf("absent Table: ok=%v err=%v", ok, err)
		}
		defs, err := r.Tables()
		if err != nil || len(defs) != 2 {
			t.Fatalf("Tables = %+v, %v", defs, err)
		}
		for _, want := range []persistence.TableDef{d1b, d2} {
			if !slices.ContainsFunc(defs, func(d persistence.TableDef) bool { return same(d, want) }) {
				t.Fatalf("Tables = %+v, missing %+v", defs, want)
			}
		}
		return nil
	})
}

func testCallbackErrors(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	appendAll(t, s, mkEvent(1, tblX, []byte("r"), 1), mkEvent(2, tblX, []byte("r"), 2))
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutRow(sampleRow(tblX, 1)) })
	view(t, s, func(r persistence.SyncReader) error {
		fail := func(persistence.StoredEvent) (bool, error) { return true, errFn }
		mustErrIs(t, "EventsAfter", r.EventsAfter(0, 0, fail), errFn)
		mustErrIs(t, "RowEvents", r.RowEvents(tblX, []byte("r"), fail), errFn)
		mustErrIs(t, "TableEvents", r.TableEvents(tblX, fail), errFn)
		mustErrIs(t, "Rows", r.Rows(tblX, nil, func([]byte, persistence.Row) (bool, error) { return true, errFn }), errFn)
		n := 0
		stop := func(persistence.StoredEvent) (bool, error) { n++; return false, nil }
		if err := r.RowEvents(tblX, []byte("r"), stop); err != nil || n != 1 {
			t.Fatalf("RowEvents stop: visited %d, err %v", n, err)
		}
		n = 0
		if err := r.TableEvents(tblX, stop); err != nil || n != 1 {
			t.Fatalf("TableEvents stop: visited %d, err %v", n, err)
		}
		return nil
	})
	// Writes from inside a callback of an Update are allowed.
	update(t, s, func(tx persistence.SyncTx) error {
		return tx.TableEvents(tblX, func(ev persistence.StoredEvent) (bool, error) {
			return true, tx.PutMeta("seen-"+fmt.Sprint(ev.Seq), []byte{1})
		})
	})
	view(t, s, func(r persistence.SyncReader) error {
		for _, k := range []string{"seen-1", "seen-2"} {
			if _, ok, _ := r.Meta(k); !ok {
				t.Fatalf("write from inside a callback lost: %s", k)
			}
		}
		return nil
	})
}

func testViewSnapshot(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	update(t, s, func(tx persistence.SyncTx) error { return tx.PutMeta("k", []byte("old")) })
	done := make(chan error, 1)
	view(t, s, func(r persistence.SyncReader) error {
		if v, _, _ := r.Meta("k"); string(v) != "old" {
			t.Fatalf("Meta = %q before the Update", v)
		}
		wrote := make(chan struct{})
		go func() {
			done <- s.Update(ctx, func(tx persistence.SyncTx) error {
				defer close(wrote)
				if _, err := tx.AppendEvent(mkEvent(1, tblX, []byte("r"), 1)); err != nil {
					return err
				}
				if err := tx.PutRow(sampleRow(tblX, 1)); err != nil {
					return err
				}
				return tx.PutMeta("k", []byte("new"))
			})
		}()
		<-wrote
		// Give the commit a chance to land (it may also wait for this View to end).
		select {
		case err := <-done:
			done <- err
		case <-time.After(50 * time.Millisecond):
		}
		if v, _, _ := r.Meta("k"); string(v) != "old" {
			t.Fatalf("View saw a later Update: Meta = %q", v)
		}
		if n := lastSeq(t, r); n != 0 {
			t.Fatalf("View saw a later Update: LastSeq = %d", n)
		}
		checkNoEvent(t, r, eventID(1))
		if _, ok, _ := r.Row(tblX, key(1).Encode()); ok {
			t.Fatal("View saw a later Update's row")
		}
		return nil
	})
	if err := <-done; err != nil {
		t.Fatalf("concurrent Update: %v", err)
	}
	view(t, s, func(r persistence.SyncReader) error {
		if v, _, _ := r.Meta("k"); string(v) != "new" {
			t.Fatalf("Meta = %q after the Update", v)
		}
		return nil
	})
}

func testConcurrent(t *testing.T, open OpenFunc) {
	s, _ := open(t)
	const writers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := w*each + i + 1
				errs <- s.Update(ctx, func(tx persistence.SyncTx) error {
					_, err := tx.AppendEvent(mkEvent(n, tblX, []byte{byte(w)}, messages.HLC(n)))
					return err
				})
				errs <- s.View(ctx, func(r persistence.SyncReader) error { _, err := r.LastSeq(); return err })
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	view(t, s, func(r persistence.SyncReader) error {
		all := after(t, r, 0, 0)
		if len(all) != writers*each || lastSeq(t, r) != writers*each {
			t.Fatalf("%d events, LastSeq %d; want %d", len(all), lastSeq(t, r), writers*each)
		}
		for i, ev := range all {
			if ev.Seq != uint64(i+1) {
				t.Fatalf("event %d has seq %d", i, ev.Seq)
			}
		}
		return nil
	})
}

func testReopen(t *testing.T, open OpenFunc) {
	s, reopen := open(t)
	g := persistence.GroupKey{Site: siteB, Schema: "s", Table: "t"}
	def := persistence.TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"name"}}
	k := persistence.KeyEntry{Kid: []byte("kid"), Site: siteA, PublicKey: []byte("pk"), Cutoff: 77}
	row := sampleRow(tblX, 1)
	dead := persistence.Row{Schema: tblX.Schema, Table: tblX.Table, Key: key(2), Tomb: clock(9, siteB), Existence: clock(9, siteB)}
	evs := []persistence.StoredEvent{
		mkEvent(1, tblX, []byte("r1"), 10), mkEvent(2, tblX, []byte("r1"), 20), mkEvent(3, tblAB, []byte("r1"), 1),
		mkEvent(4, tblBC, []byte("q"), 50), mkEvent(5, tblBC, []byte("q"), 60),
	}
	appendAll(t, s, evs...)
	update(t, s, func(tx persistence.SyncTx) error {
		for _, f := range []func() error{
			func() error { return tx.PutTable(def) },
			func() error { return tx.PutKey(k) },
			func() error { return tx.PutRow(row) },
			func() error { return tx.PutRow(dead) },
			func() error { return tx.SetHorizon(tblX, 15) },
			func() error { return tx.HoldEvent(g, 3) },
			func() error { return tx.HoldEvent(g, 1) },
			func() error { return tx.PutMeta("mesh", []byte("mesh-id")) },
			func() error { return tx.PutSealedMeta(persistence.RecordNodeKey, "node", []byte("node-secret")) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		if _, err := tx.DeleteEventsBelow(tblX, 15); err != nil { // removes seq 1
			return err
		}
		_, err := tx.DeleteEventsBelow(tblBC, 100) // removes seqs 4, 5: the newest
		return err
	})
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		if n := lastSeq(t, r); n != 5 {
			t.Fatalf("LastSeq after reopen = %d, want 5", n)
		}
		for _, i := range []int{2, 3} {
			ev := evs[i-1]
			ev.Seq = uint64(i)
			checkEvent(t, r, ev)
		}
		for _, i := range []int{1, 4, 5} {
			checkNoEvent(t, r, eventID(i))
		}
		if got := rowEvents(t, r, tblX, []byte("r1")); !slices.Equal(got, []uint64{2}) {
			t.Fatalf("RowEvents after reopen = %v", got)
		}
		if got := tableEvents(t, r, tblBC); len(got) != 0 {
			t.Fatalf("TableEvents after reopen = %v", got)
		}
		if got := seqsOf(after(t, r, 0, 0)); !slices.Equal(got, []uint64{2, 3}) {
			t.Fatalf("EventsAfter after reopen = %v", got)
		}
		checkRow(t, r, row)
		checkRow(t, r, dead)
		if d, ok, err := r.Table(persistence.TableKey{Schema: "s", Table: "t"}); err != nil || !ok || !slices.Equal(d.Columns, def.Columns) {
			t.Fatalf("Table after reopen = %+v, %v, %v", d, ok, err)
		}
		if ks, err := r.Keys(); err != nil || len(ks) != 1 || ks[0].Cutoff != 77 || !bytes.Equal(ks[0].PublicKey, k.PublicKey) {
			t.Fatalf("Keys after reopen = %+v, %v", ks, err)
		}
		if h, err := r.Horizon(tblX); err != nil || h != 15 {
			t.Fatalf("Horizon after reopen = %v, %v", h, err)
		}
		if gs, err := r.HeldGroups(); err != nil || !slices.Equal(gs, []persistence.GroupKey{g}) {
			t.Fatalf("HeldGroups after reopen = %v, %v", gs, err)
		}
		if seqs, err := r.HeldEvents(g); err != nil || !slices.Equal(seqs, []uint64{1, 3}) {
			t.Fatalf("HeldEvents after reopen = %v, %v", seqs, err)
		}
		if v, ok, err := r.Meta("mesh"); err != nil || !ok || string(v) != "mesh-id" {
			t.Fatalf("Meta after reopen = %q, %v, %v", v, ok, err)
		}
		if v, ok, err := r.SealedMeta(persistence.RecordNodeKey, "node"); err != nil || !ok || string(v) != "node-secret" {
			t.Fatalf("SealedMeta after reopen = %q, %v, %v", v, ok, err)
		}
		return nil
	})
	// Sequences are never reused after a restart, even though the newest
	// events were deleted.
	if seqs := appendAll(t, s, mkEvent(6, tblX, []byte("r1"), 30)); seqs[0] != 6 {
		t.Fatalf("first seq after reopen = %d, want 6", seqs[0])
	}
	update(t, s, func(tx persistence.SyncTx) error {
		_, err := tx.AppendEvent(mkEvent(2, tblX, []byte("r1"), 20))
		mustErrIs(t, "AppendEvent of a retained id after reopen", err, persistence.ErrDuplicate)
		return nil
	})
	// A second restart keeps the new state too.
	s = reopen()
	view(t, s, func(r persistence.SyncReader) error {
		if n := lastSeq(t, r); n != 6 {
			t.Fatalf("LastSeq after second reopen = %d, want 6", n)
		}
		return nil
	})
}
