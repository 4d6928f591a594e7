package storetest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// RunInboundStore runs the contract suite of the commit-boundary records
// (persistence/inbound.go) against open: pending inbound (unique per
// (sender, id), persistent strictly increasing sequence never reused,
// paging after a cursor with a sender filter, counts, a hand-off count
// kept across a reopen and frame and sequence untouched by it), processed inbound
// (never replaced, finalization/reason validated, prune by finalizedAt ≤
// cutoff), pending outbound (unique, attempts, paging, counts), retired
// outbound (replaced, validated, prune by retiredAt ≤ cutoff, bounded by
// persistence.MaxRetiredOutbound oldest first), atomicity
// with the rest of a DeliveryTx, copies and survival across a reopen.
func RunInboundStore(t *testing.T, open DeliveryOpenFunc) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open DeliveryOpenFunc)
	}{
		{"PendingPutGetDuplicateDelete", testPendingBasic},
		{"PendingSequenceNeverReused", testPendingSequence},
		{"PendingPagingAndSenderFilter", testPendingPaging},
		{"PendingCounts", testPendingCounts},
		{"PendingDeliveryCount", testPendingDeliveryCount},
		{"ProcessedNeverReplaced", testProcessedBasic},
		{"ProcessedInvalidRefused", testProcessedInvalid},
		{"LegacyOnlyThroughImport", testLegacyImport},
		{"LegacyImportIsAllOrNothing", testLegacyImportAtomic},
		{"ProcessedPruneBoundary", testProcessedPrune},
		{"OutboundPutAttemptDeletePage", testOutbound},
		{"FailedUpdateKeepsNoRecord", testInboundAtomic},
		{"RecordsAreCopied", testInboundCopies},
		{"RecordsSurviveReopen", testInboundReopen},
		{"RetiredPutReplacePruneReopen", testRetired},
		{"RetiredInvalidRefused", testRetiredInvalid},
		{"RetiredBoundEvictsOldest", testRetiredBound},
		{"OutboundSequenceCountsAcceptedSends", testOutboundSequence},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func lid(b byte) messages.LogicalMessageID {
	var id messages.LogicalMessageID
	for i := range id {
		id[i] = b + byte(i)
	}
	return id
}

func pend(sender messages.DeviceAddress, id byte, frame string) persistence.PendingInbound {
	return persistence.PendingInbound{Sender: sender, ID: lid(id), ReceivedAt: 1000 + int64(id), Frame: []byte(frame)}
}

func putPending(t *testing.T, tx persistence.DeliveryTx, p persistence.PendingInbound) uint64 {
	t.Helper()
	seq, err := tx.PutPendingInbound(p)
	if err != nil {
		t.Fatalf("PutPendingInbound: %v", err)
	}
	return seq
}

func pageIn(t *testing.T, r persistence.DeliveryReader, after uint64, sender *messages.DeviceAddress, limit int) []persistence.PendingInbound {
	t.Helper()
	var out []persistence.PendingInbound
	if err := r.PendingInboundAfter(after, sender, func(p persistence.PendingInbound) (bool, error) {
		out = append(out, p)
		return len(out) < limit, nil
	}); err != nil {
		t.Fatalf("PendingInboundAfter: %v", err)
	}
	return out
}

func testPendingBasic(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	var seq uint64
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		seq = putPending(t, tx, pend(a, 1, "frame-1"))
		if _, err := tx.PutPendingInbound(pend(a, 1, "other")); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("second PutPendingInbound: %v, want ErrDuplicate", err)
		}
		p, ok, err := tx.PendingInbound(a, lid(1))
		if err != nil || !ok || string(p.Frame) != "frame-1" {
			t.Fatalf("read inside tx: %+v %v %v", p, ok, err)
		}
		return nil
	})
	if seq == 0 {
		t.Fatal("sequence 0 assigned; sequences start at 1")
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		p, ok, err := r.PendingInbound(a, lid(1))
		if err != nil || !ok {
			t.Fatalf("PendingInbound: %v %v", ok, err)
		}
		want := pend(a, 1, "frame-1")
		want.Sequence = seq
		if p.Sender != want.Sender || p.ID != want.ID || p.Sequence != seq || p.ReceivedAt != want.ReceivedAt || !bytes.Equal(p.Frame, want.Frame) {
			t.Fatalf("PendingInbound = %+v, want %+v", p, want)
		}
		if _, ok, _ := r.PendingInbound(addr("alice", 2), lid(1)); ok {
			t.Fatal("pending entry visible under another device")
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if ok, err := tx.DeletePendingInbound(a, lid(1)); err != nil || !ok {
			t.Fatalf("DeletePendingInbound: %v %v", ok, err)
		}
		if ok, err := tx.DeletePendingInbound(a, lid(1)); err != nil || ok {
			t.Fatalf("second DeletePendingInbound: %v %v", ok, err)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if _, ok, err := r.PendingInbound(a, lid(1)); ok || err != nil {
			t.Fatalf("deleted entry still there: %v %v", ok, err)
		}
		if got := pageIn(t, r, 0, nil, 10); len(got) != 0 {
			t.Fatalf("page after delete: %d entries", len(got))
		}
		return nil
	})
	if err := s.View(context.Background(), func(r persistence.DeliveryReader) error {
		_, _, err := r.PendingInbound(messages.DeviceAddress{}, lid(1))
		return err
	}); err == nil {
		t.Fatal("invalid sender accepted")
	}
}

func testPendingSequence(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a := addr("alice", 1)
	var seqs []uint64
	for i := byte(1); i <= 3; i++ {
		dUpdate(t, s, func(tx persistence.DeliveryTx) error {
			seqs = append(seqs, putPending(t, tx, pend(a, i, "f")))
			return nil
		})
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		_, err := tx.DeletePendingInbound(a, lid(3))
		return err
	})
	s = reopen()
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		seqs = append(seqs, putPending(t, tx, pend(a, 3, "again")))
		seqs = append(seqs, putPending(t, tx, pend(a, 4, "f")))
		return nil
	})
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("sequences %v not strictly increasing (a deleted sequence was reused after reopen?)", seqs)
		}
	}
}

func testPendingPaging(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a, b := addr("alice", 1), addr("bob", 7)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for i := byte(1); i <= 6; i++ {
			from := a
			if i%2 == 0 {
				from = b
			}
			putPending(t, tx, pend(from, i, "f"))
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		all := pageIn(t, r, 0, nil, 100)
		if len(all) != 6 {
			t.Fatalf("all: %d entries", len(all))
		}
		for i := 1; i < len(all); i++ {
			if all[i].Sequence <= all[i-1].Sequence {
				t.Fatal("page not in sequence order")
			}
		}
		first := pageIn(t, r, 0, nil, 2)
		next := pageIn(t, r, first[1].Sequence, nil, 100)
		if len(first) != 2 || len(next) != 4 || next[0].Sequence != all[2].Sequence {
			t.Fatalf("cursor paging: %d then %d", len(first), len(next))
		}
		onlyB := pageIn(t, r, 0, &b, 100)
		if len(onlyB) != 3 {
			t.Fatalf("sender filter: %d entries, want 3", len(onlyB))
		}
		for _, p := range onlyB {
			if p.Sender != b {
				t.Fatalf("sender filter returned %s", p.Sender)
			}
		}
		rest := pageIn(t, r, onlyB[0].Sequence, &b, 100)
		if len(rest) != 2 || rest[0].Sequence != onlyB[1].Sequence {
			t.Fatalf("sender filter with cursor: %+v", rest)
		}
		if got := pageIn(t, r, all[5].Sequence, nil, 100); len(got) != 0 {
			t.Fatalf("after the last: %d", len(got))
		}
		if got := pageIn(t, r, ^uint64(0), nil, 100); len(got) != 0 {
			t.Fatalf("after max: %d", len(got))
		}
		stop := errors.New("stop")
		if err := r.PendingInboundAfter(0, nil, func(persistence.PendingInbound) (bool, error) { return false, stop }); !errors.Is(err, stop) {
			t.Fatalf("callback error not returned: %v", err)
		}
		return nil
	})
}

func testPendingCounts(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a, b := addr("alice", 1), addr("alice", 2)
	count := func(sender *messages.DeviceAddress) int {
		var n int
		dView(t, s, func(r persistence.DeliveryReader) error {
			var err error
			n, err = r.PendingInboundCount(sender)
			return err
		})
		return n
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		putPending(t, tx, pend(a, 1, "f"))
		putPending(t, tx, pend(a, 2, "f"))
		putPending(t, tx, pend(b, 1, "f"))
		return nil
	})
	if count(nil) != 3 || count(&a) != 2 || count(&b) != 1 {
		t.Fatalf("counts %d %d %d, want 3 2 1", count(nil), count(&a), count(&b))
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		_, err := tx.DeletePendingInbound(a, lid(2))
		return err
	})
	if count(nil) != 2 || count(&a) != 1 {
		t.Fatalf("counts after delete %d %d, want 2 1", count(nil), count(&a))
	}
}

func dig(b byte) *[32]byte {
	var d [32]byte
	for i := range d {
		d[i] = b
	}
	return &d
}

func testProcessedBasic(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	c := persistence.ProcessedInbound{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, FinalizedAt: 5000, Digest: dig(7)}
	d := persistence.ProcessedInbound{Sender: a, ID: lid(2), Finalization: persistence.FinalizationDiscarded, FinalizedAt: 6000, Digest: dig(8), Reason: persistence.DiscardRejectedByPolicy}
	legacy := persistence.ProcessedInbound{Sender: a, ID: lid(3), Finalization: persistence.FinalizationCommitted, FinalizedAt: 7000, Legacy: true}
	importLegacy(t, s, persistence.LegacyProcessed{Sender: a, ID: lid(3), FinalizedAt: 7000})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutProcessedInbound(c))
		must(t, tx.PutProcessedInbound(d))
		other := d
		other.ID = lid(1)
		if err := tx.PutProcessedInbound(other); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("replacing a processed entry: %v, want ErrDuplicate", err)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		for _, want := range []persistence.ProcessedInbound{c, d, legacy} {
			got, ok, err := r.ProcessedInbound(want.Sender, want.ID)
			if err != nil || !ok {
				t.Fatalf("ProcessedInbound: %v %v", ok, err)
			}
			if got.Finalization != want.Finalization || got.FinalizedAt != want.FinalizedAt || got.Reason != want.Reason ||
				got.Legacy != want.Legacy ||
				(got.Digest == nil) != (want.Digest == nil) || (got.Digest != nil && *got.Digest != *want.Digest) {
				t.Fatalf("ProcessedInbound = %+v, want %+v", got, want)
			}
		}
		if n, err := r.ProcessedInboundCount(); err != nil || n != 3 {
			t.Fatalf("ProcessedInboundCount = %d %v", n, err)
		}
		return nil
	})
}

func testProcessedInvalid(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	for _, p := range []persistence.ProcessedInbound{
		{Sender: a, ID: lid(1), Finalization: 0, Digest: dig(1)},
		{Sender: a, ID: lid(1), Finalization: 9, Digest: dig(1)},
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationDiscarded, Reason: 0, Digest: dig(1)},
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationDiscarded, Reason: 99, Digest: dig(1)},
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, Reason: persistence.DiscardOther, Digest: dig(1)},
		{Sender: messages.DeviceAddress{}, ID: lid(1), Finalization: persistence.FinalizationCommitted, Digest: dig(1)},
		// A current-layout entry always has a digest, and the legacy
		// marker is written only by ImportLegacyProcessed.
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted},
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, Legacy: true},
		{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, Legacy: true, Digest: dig(1)},
	} {
		err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error { return tx.PutProcessedInbound(p) })
		if !errors.Is(err, persistence.ErrInvalidRecord) {
			t.Errorf("PutProcessedInbound(%+v): %v, want ErrInvalidRecord", p, err)
		}
	}
}

// importLegacy imports legacy entries as a migration from an older schema
// does (persistence.LegacyImporter, which every delivery store implements).
func importLegacy(t *testing.T, s persistence.DeliveryStore, entries ...persistence.LegacyProcessed) {
	t.Helper()
	imp, ok := s.(persistence.LegacyImporter)
	if !ok {
		t.Fatalf("%T does not implement persistence.LegacyImporter", s)
	}
	if err := imp.ImportLegacyProcessed(context.Background(), entries); err != nil {
		t.Fatalf("ImportLegacyProcessed: %v", err)
	}
}

// The legacy rule (an entry without digest acknowledges any body) holds
// only for an entry carrying the legacy marker, which only the import
// writes: it reads back committed, without digest, with Legacy set, is
// never replaced, and pruned like any other entry.
func testLegacyImport(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a := addr("alice", 1)
	importLegacy(t, s, persistence.LegacyProcessed{Sender: a, ID: lid(1), FinalizedAt: 100}, persistence.LegacyProcessed{Sender: a, ID: lid(2), FinalizedAt: 200})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		err := tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, FinalizedAt: 5, Digest: dig(1)})
		if !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("a processed entry over a legacy one: %v, want ErrDuplicate", err)
		}
		return nil
	})
	s = reopen()
	dView(t, s, func(r persistence.DeliveryReader) error {
		for i, at := range []int64{100, 200} {
			got, ok, err := r.ProcessedInbound(a, lid(byte(i+1)))
			if err != nil || !ok || !got.Legacy || got.Digest != nil || got.Finalization != persistence.FinalizationCommitted || got.FinalizedAt != at || got.Reason != 0 {
				t.Fatalf("legacy entry %d = %+v, %v, %v", i+1, got, ok, err)
			}
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if n, err := tx.PruneProcessedInbound(150); err != nil || n != 1 {
			t.Fatalf("prune = %d, %v; want 1", n, err)
		}
		return nil
	})
}

// An import with an invalid address or an entry that exists writes
// nothing.
func testLegacyImportAtomic(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	imp := s.(persistence.LegacyImporter)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		return tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: a, ID: lid(9), Finalization: persistence.FinalizationCommitted, FinalizedAt: 1, Digest: dig(1)})
	})
	for _, tc := range []struct {
		bad  persistence.LegacyProcessed
		want error
	}{
		{persistence.LegacyProcessed{Sender: a, ID: lid(9)}, persistence.ErrDuplicate},
		{persistence.LegacyProcessed{Sender: messages.DeviceAddress{}, ID: lid(3)}, persistence.ErrInvalidRecord},
	} {
		err := imp.ImportLegacyProcessed(context.Background(), []persistence.LegacyProcessed{{Sender: a, ID: lid(1)}, tc.bad})
		if !errors.Is(err, tc.want) {
			t.Fatalf("import with %+v: %v, want %v", tc.bad, err, tc.want)
		}
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		if _, ok, err := r.ProcessedInbound(a, lid(1)); err != nil || ok {
			t.Fatalf("a failed import kept an entry: %v %v", ok, err)
		}
		if n, err := r.ProcessedInboundCount(); err != nil || n != 1 {
			t.Fatalf("ProcessedInboundCount = %d %v, want 1", n, err)
		}
		return nil
	})
}

func testProcessedPrune(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for i, at := range []int64{-5, 999, 1000, 1001} {
			must(t, tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: a, ID: lid(byte(i)), Finalization: persistence.FinalizationCommitted, FinalizedAt: at, Digest: dig(1)}))
		}
		putPending(t, tx, pend(a, 50, "f"))
		return nil
	})
	var n int
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		var err error
		n, err = tx.PruneProcessedInbound(1000)
		return err
	})
	if n != 3 {
		t.Fatalf("pruned %d, want 3 (finalizedAt ≤ cutoff, negative included)", n)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		for i, keep := range []bool{false, false, false, true} {
			if _, ok, err := r.ProcessedInbound(a, lid(byte(i))); err != nil || ok != keep {
				t.Fatalf("entry %d present=%v (%v), want %v", i, ok, err, keep)
			}
		}
		if _, ok, _ := r.PendingInbound(a, lid(50)); !ok {
			t.Fatal("prune removed a pending entry")
		}
		if c, _ := r.ProcessedInboundCount(); c != 1 {
			t.Fatalf("count after prune %d", c)
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		var err error
		n, err = tx.PruneProcessedInbound(1000)
		return err
	})
	if n != 0 {
		t.Fatalf("second prune removed %d", n)
	}
}

func testOutbound(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a, b := addr("alice", 1), addr("bob", 1)
	out := func(to messages.DeviceAddress, id byte) persistence.PendingOutbound {
		return persistence.PendingOutbound{Recipient: to, ID: lid(id), CreatedAt: 10, Body: []byte{id}}
	}
	var s1, s2 uint64
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		var err error
		if s1, err = tx.PutPendingOutbound(out(a, 1)); err != nil {
			return err
		}
		if s2, err = tx.PutPendingOutbound(out(b, 2)); err != nil {
			return err
		}
		if _, err := tx.PutPendingOutbound(out(a, 1)); !errors.Is(err, persistence.ErrDuplicate) {
			t.Fatalf("duplicate outbound: %v", err)
		}
		if n, err := tx.MarkOutboundAttempt(a, lid(1), 77); err != nil || n != 1 {
			t.Fatalf("MarkOutboundAttempt = %d %v", n, err)
		}
		if _, err := tx.MarkOutboundAttempt(a, lid(9), 77); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("MarkOutboundAttempt missing: %v", err)
		}
		return nil
	})
	if s1 == 0 || s2 <= s1 {
		t.Fatalf("outbound sequences %d %d", s1, s2)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		p, ok, err := r.PendingOutbound(a, lid(1))
		if err != nil || !ok || p.Attempts != 1 || p.LastAttemptAt != 77 || p.Sequence != s1 || !bytes.Equal(p.Body, []byte{1}) || p.CreatedAt != 10 {
			t.Fatalf("PendingOutbound = %+v %v %v", p, ok, err)
		}
		var got []persistence.PendingOutbound
		must(t, r.PendingOutboundAfter(0, nil, func(p persistence.PendingOutbound) (bool, error) { got = append(got, p); return true, nil }))
		if len(got) != 2 || got[0].Sequence != s1 || got[1].Sequence != s2 {
			t.Fatalf("PendingOutboundAfter: %+v", got)
		}
		got = nil
		must(t, r.PendingOutboundAfter(0, &b, func(p persistence.PendingOutbound) (bool, error) { got = append(got, p); return true, nil }))
		if len(got) != 1 || got[0].Recipient != b {
			t.Fatalf("recipient filter: %+v", got)
		}
		got = nil
		must(t, r.PendingOutboundAfter(s1, nil, func(p persistence.PendingOutbound) (bool, error) { got = append(got, p); return true, nil }))
		if len(got) != 1 || got[0].Sequence != s2 {
			t.Fatalf("cursor: %+v", got)
		}
		if n, err := r.PendingOutboundCount(); n != 2 || err != nil {
			t.Fatalf("count %d %v", n, err)
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if ok, err := tx.DeletePendingOutbound(a, lid(1)); !ok || err != nil {
			t.Fatalf("DeletePendingOutbound: %v %v", ok, err)
		}
		if ok, err := tx.DeletePendingOutbound(a, lid(1)); ok || err != nil {
			t.Fatalf("second DeletePendingOutbound: %v %v", ok, err)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if n, _ := r.PendingOutboundCount(); n != 1 {
			t.Fatalf("count after delete %d", n)
		}
		return nil
	})
}

func testInboundAtomic(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error { putPending(t, tx, pend(a, 1, "keep")); return nil })
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		if _, err := tx.DeletePendingInbound(a, lid(1)); err != nil {
			return err
		}
		must(t, tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: a, ID: lid(1), Finalization: persistence.FinalizationCommitted, FinalizedAt: 1, Digest: dig(1)}))
		putPending(t, tx, pend(a, 2, "x"))
		if _, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: a, ID: lid(3), Body: []byte{}}); err != nil {
			return err
		}
		must(t, tx.PutSession(a, []byte("s")))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update: %v", err)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		if _, ok, _ := r.PendingInbound(a, lid(1)); !ok {
			t.Fatal("failed update removed the pending entry")
		}
		if _, ok, _ := r.ProcessedInbound(a, lid(1)); ok {
			t.Fatal("failed update kept the processed entry")
		}
		if _, ok, _ := r.PendingInbound(a, lid(2)); ok {
			t.Fatal("failed update kept a new pending entry")
		}
		if n, _ := r.PendingOutboundCount(); n != 0 {
			t.Fatal("failed update kept an outbound entry")
		}
		if _, ok, _ := r.Session(a); ok {
			t.Fatal("failed update kept the session")
		}
		if n, _ := r.PendingInboundCount(nil); n != 1 {
			t.Fatalf("pending count %d after failed update", n)
		}
		return nil
	})
}

func testInboundCopies(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	p := pend(a, 1, "frame")
	o := persistence.PendingOutbound{Recipient: a, ID: lid(1), Body: []byte("body")}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		putPending(t, tx, p)
		_, err := tx.PutPendingOutbound(o)
		p.Frame[0], o.Body[0] = 'X', 'X'
		return err
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		got, _, _ := r.PendingInbound(a, lid(1))
		if string(got.Frame) != "frame" {
			t.Fatalf("stored frame aliased the caller's slice: %q", got.Frame)
		}
		got.Frame[0] = 'Y'
		again, _, _ := r.PendingInbound(a, lid(1))
		if string(again.Frame) != "frame" {
			t.Fatal("returned frame aliases the store")
		}
		ob, _, _ := r.PendingOutbound(a, lid(1))
		if string(ob.Body) != "body" {
			t.Fatalf("stored body aliased the caller's slice: %q", ob.Body)
		}
		return nil
	})
}

func testInboundReopen(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a := addr("alice", 1)
	var seq uint64
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		seq = putPending(t, tx, pend(a, 1, "frame"))
		must(t, tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: a, ID: lid(2), Finalization: persistence.FinalizationDiscarded, FinalizedAt: 3, Digest: dig(2), Reason: persistence.DiscardExpired}))
		_, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: a, ID: lid(3), Body: []byte("b")})
		return err
	})
	s = reopen()
	dView(t, s, func(r persistence.DeliveryReader) error {
		p, ok, err := r.PendingInbound(a, lid(1))
		if !ok || err != nil || p.Sequence != seq || string(p.Frame) != "frame" {
			t.Fatalf("pending after reopen: %+v %v %v", p, ok, err)
		}
		d, ok, err := r.ProcessedInbound(a, lid(2))
		if !ok || err != nil || d.Reason != persistence.DiscardExpired || d.Digest == nil || *d.Digest != *dig(2) {
			t.Fatalf("processed after reopen: %+v %v %v", d, ok, err)
		}
		if _, ok, err := r.PendingOutbound(a, lid(3)); !ok || err != nil {
			t.Fatalf("outbound after reopen: %v %v", ok, err)
		}
		return nil
	})
}

// testPendingDeliveryCount: PutPendingInbound keeps the Deliveries given,
// CountInboundDelivery adds one and returns it (inside the transaction and
// after it, in a point read and a page, across a reopen) and changes
// nothing else; a count rolled back with its transaction is not kept; an
// entry not pending is ErrNotFound and writes nothing.
func testPendingDeliveryCount(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a := addr("alice", 1)
	p := pend(a, 1, "frame-1")
	p.Deliveries = 1
	var seq uint64
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		seq = putPending(t, tx, p)
		putPending(t, tx, pend(a, 2, "frame-2")) // Deliveries 0 as given
		return nil
	})
	count := func(want uint32) {
		t.Helper()
		dUpdate(t, s, func(tx persistence.DeliveryTx) error {
			n, err := tx.CountInboundDelivery(a, lid(1))
			if err != nil || n != want {
				t.Fatalf("CountInboundDelivery = %d, %v; want %d", n, err, want)
			}
			if q, _, _ := tx.PendingInbound(a, lid(1)); q.Deliveries != want {
				t.Fatalf("inside the tx: Deliveries %d, want %d", q.Deliveries, want)
			}
			return nil
		})
	}
	check := func(want uint32) {
		t.Helper()
		dView(t, s, func(r persistence.DeliveryReader) error {
			q, ok, err := r.PendingInbound(a, lid(1))
			if !ok || err != nil || q.Deliveries != want || q.Sequence != seq || string(q.Frame) != "frame-1" || q.ReceivedAt != p.ReceivedAt {
				t.Fatalf("PendingInbound = %+v, %v, %v; want Deliveries %d, sequence %d, frame kept", q, ok, err, want, seq)
			}
			page := pageIn(t, r, 0, nil, 10)
			if len(page) != 2 || page[0].Deliveries != want || page[1].Deliveries != 0 {
				t.Fatalf("page: %+v", page)
			}
			return nil
		})
	}
	check(1)
	count(2)
	check(2)
	// A count rolled back with its transaction is not kept.
	errBoom := errors.New("boom")
	if err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		if _, err := tx.CountInboundDelivery(a, lid(1)); err != nil {
			t.Fatalf("CountInboundDelivery: %v", err)
		}
		return errBoom
	}); !errors.Is(err, errBoom) {
		t.Fatalf("failed Update: %v", err)
	}
	check(2)
	s = reopen()
	check(2)
	count(3)
	check(3)
	if err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		_, err := tx.CountInboundDelivery(a, lid(9))
		return err
	}); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("CountInboundDelivery of an entry not pending: %v, want ErrNotFound", err)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if _, err := tx.DeletePendingInbound(a, lid(1)); err != nil {
			return err
		}
		if _, err := tx.CountInboundDelivery(a, lid(1)); !errors.Is(err, persistence.ErrNotFound) {
			t.Fatalf("CountInboundDelivery after delete: %v, want ErrNotFound", err)
		}
		return nil
	})
}
