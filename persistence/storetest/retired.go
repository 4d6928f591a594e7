package storetest

import (
	"errors"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func retired(to messages.DeviceAddress, id byte, how persistence.Retirement, at int64) persistence.RetiredOutbound {
	r := persistence.RetiredOutbound{Recipient: to, ID: lid(id), How: how, RetiredAt: at}
	r.Digest[0], r.Digest[31] = id, byte(how)
	return r
}

func readRetired(t *testing.T, r persistence.DeliveryReader, to messages.DeviceAddress, id byte) (persistence.RetiredOutbound, bool) {
	t.Helper()
	got, ok, err := r.RetiredOutbound(to, lid(id))
	if err != nil {
		t.Fatalf("RetiredOutbound(%s, %d): %v", to, id, err)
	}
	return got, ok
}

// testRetired: an entry reads back as written, per (recipient, id);
// a second put replaces it (count unchanged); a failed Update keeps
// nothing; PruneRetiredOutbound removes RetiredAt ≤ cutoff only; entries
// survive a reopen.
func testRetired(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a, b := addr("alice", 1), addr("alice", 2)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for _, r := range []persistence.RetiredOutbound{
			retired(a, 1, persistence.RetiredAbandoned, 100),
			retired(a, 2, persistence.RetiredAcknowledged, 200),
			retired(b, 1, persistence.RetiredAcknowledged, 300),
		} {
			if n, err := tx.PutRetiredOutbound(r); err != nil || n != 0 {
				t.Fatalf("PutRetiredOutbound: %d %v", n, err)
			}
		}
		if got, ok := readRetired(t, tx, a, 1); !ok || got != retired(a, 1, persistence.RetiredAbandoned, 100) {
			t.Fatalf("inside tx: %+v %v", got, ok)
		}
		return nil
	})
	// Replaced: abandoned, then the same body acknowledged later.
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		_, err := tx.PutRetiredOutbound(retired(a, 1, persistence.RetiredAcknowledged, 400))
		return err
	})
	wantFail := errors.New("rolled back")
	if err := s.Update(ctx, func(tx persistence.DeliveryTx) error {
		if _, err := tx.PutRetiredOutbound(retired(a, 9, persistence.RetiredAbandoned, 1)); err != nil {
			return err
		}
		return wantFail
	}); !errors.Is(err, wantFail) {
		t.Fatalf("failed Update: %v", err)
	}
	check := func(r persistence.DeliveryReader) {
		if got, ok := readRetired(t, r, a, 1); !ok || got != retired(a, 1, persistence.RetiredAcknowledged, 400) {
			t.Fatalf("replaced entry: %+v %v", got, ok)
		}
		if got, ok := readRetired(t, r, b, 1); !ok || got != retired(b, 1, persistence.RetiredAcknowledged, 300) {
			t.Fatalf("entry of another device: %+v %v", got, ok)
		}
		if _, ok := readRetired(t, r, a, 9); ok {
			t.Fatal("entry of a failed Update kept")
		}
		if _, ok := readRetired(t, r, b, 2); ok {
			t.Fatal("entry under another recipient")
		}
		if n, err := r.RetiredOutboundCount(); err != nil || n != 3 {
			t.Fatalf("RetiredOutboundCount = %d %v, want 3", n, err)
		}
	}
	dView(t, s, func(r persistence.DeliveryReader) error { check(r); return nil })
	s = reopen()
	dView(t, s, func(r persistence.DeliveryReader) error { check(r); return nil })
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if n, err := tx.PruneRetiredOutbound(199); err != nil || n != 0 {
			t.Fatalf("prune at 199: %d %v, want 0", n, err)
		}
		if n, err := tx.PruneRetiredOutbound(300); err != nil || n != 2 {
			t.Fatalf("prune at 300: %d %v, want 2", n, err)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if _, ok := readRetired(t, r, a, 2); ok {
			t.Fatal("entry at the cutoff kept")
		}
		if _, ok := readRetired(t, r, a, 1); !ok {
			t.Fatal("entry after the cutoff pruned (its replaced time was before it)")
		}
		if n, err := r.RetiredOutboundCount(); err != nil || n != 1 {
			t.Fatalf("count after prune = %d %v, want 1", n, err)
		}
		return nil
	})
}

func testRetiredInvalid(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	for _, r := range []persistence.RetiredOutbound{
		retired(a, 1, 0, 1),
		retired(a, 1, 4, 1),
		retired(a, 1, persistence.RetiredLost, 1), // a lost entry has no digest
		retired(messages.DeviceAddress{}, 1, persistence.RetiredAbandoned, 1),
	} {
		if err := s.Update(ctx, func(tx persistence.DeliveryTx) error {
			_, err := tx.PutRetiredOutbound(r)
			return err
		}); !errors.Is(err, persistence.ErrInvalidRecord) {
			t.Fatalf("PutRetiredOutbound(%+v): %v, want ErrInvalidRecord", r, err)
		}
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		if n, err := r.RetiredOutboundCount(); err != nil || n != 0 {
			t.Fatalf("count = %d %v, want 0", n, err)
		}
		return nil
	})
}

// testRetiredBound: past persistence.MaxRetiredOutbound entries the oldest
// are removed first, and PutRetiredOutbound says how many.
func testRetiredBound(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	id := func(i int) messages.LogicalMessageID {
		var l messages.LogicalMessageID
		l[0], l[1], l[2] = byte(i>>16), byte(i>>8), byte(i)
		return l
	}
	put := func(tx persistence.DeliveryTx, i int) int {
		n, err := tx.PutRetiredOutbound(persistence.RetiredOutbound{Recipient: a, ID: id(i), How: persistence.RetiredAbandoned, RetiredAt: int64(1000 + i)})
		if err != nil {
			t.Fatalf("PutRetiredOutbound %d: %v", i, err)
		}
		return n
	}
	max := persistence.MaxRetiredOutbound
	// Newest first: the oldest entry is the last one put. In transactions
	// of a few thousand puts, as a device writes them.
	const batch = 4096
	for hi := max; hi >= 1; hi -= batch {
		dUpdate(t, s, func(tx persistence.DeliveryTx) error {
			for i := hi; i >= 1 && i > hi-batch; i-- {
				if n := put(tx, i); n != 0 {
					t.Fatalf("put %d evicted %d at or under the bound", i, n)
				}
			}
			return nil
		})
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if n := put(tx, 0); n != 1 {
			t.Fatalf("put past the bound evicted %d, want 1", n)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if n, err := r.RetiredOutboundCount(); err != nil || n != max {
			t.Fatalf("count = %d %v, want %d", n, err, max)
		}
		if _, ok, err := r.RetiredOutbound(a, id(0)); err != nil || ok {
			t.Fatalf("oldest entry kept: %v %v", ok, err)
		}
		for _, i := range []int{1, max} {
			if _, ok, err := r.RetiredOutbound(a, id(i)); err != nil || !ok {
				t.Fatalf("entry %d: %v %v", i, ok, err)
			}
		}
		return nil
	})
}

// testOutboundSequence: OutboundSequence is the highest outbound sequence
// assigned, kept when rows are deleted; RaiseOutboundSequence only raises
// it, and the next send is numbered above the floor, across a reopen.
func testOutboundSequence(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a := addr("alice", 1)
	seqOf := func(r persistence.DeliveryReader) uint64 {
		t.Helper()
		v, err := r.OutboundSequence()
		if err != nil {
			t.Fatalf("OutboundSequence: %v", err)
		}
		return v
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		if v := seqOf(r); v != 0 {
			t.Fatalf("OutboundSequence of an empty store = %d", v)
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for i := byte(1); i <= 2; i++ {
			if _, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: a, ID: lid(i), Body: []byte("b")}); err != nil {
				return err
			}
		}
		if _, err := tx.DeletePendingOutbound(a, lid(2)); err != nil {
			return err
		}
		if v := seqOf(tx); v != 2 {
			t.Fatalf("OutboundSequence after two sends = %d, want 2", v)
		}
		must(t, tx.RaiseOutboundSequence(10))
		must(t, tx.RaiseOutboundSequence(5))
		if v := seqOf(tx); v != 10 {
			t.Fatalf("OutboundSequence after raising to 10 then 5 = %d, want 10", v)
		}
		return nil
	})
	s = reopen()
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		seq, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: a, ID: lid(3), Body: []byte("b")})
		if err != nil || seq != 11 {
			t.Fatalf("send after the raise: sequence %d %v, want 11", seq, err)
		}
		return nil
	})
}
