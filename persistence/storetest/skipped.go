package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The skipped-key contracts (persistence.DeliveryTx PutSkippedKey,
// DeleteSkippedKey, EvictSkippedKeys; DeliveryReader SkippedKeys,
// SkippedKeyCount): entries read back in number order per peer, counts
// per peer and per device follow every write (a replaced entry is counted
// once, a missing delete is nothing), DeleteSession takes the peer's keys
// with it, a failed Update keeps none, the entry size limit holds at and
// past its edge, and the device-wide eviction takes the lowest numbers of
// the largest holders, at and past the cap.

func skippedEntry(peer messages.DeviceAddress, seq uint64) []byte {
	return []byte(fmt.Sprintf("entry %s %d", peer, seq))
}

// readSkipped returns peer's stored numbers, checking every entry's bytes
// and the per-peer count.
func readSkipped(t *testing.T, r persistence.DeliveryReader, peer messages.DeviceAddress) []uint64 {
	t.Helper()
	var seqs []uint64
	must(t, r.SkippedKeys(peer, func(seq uint64, entry []byte) (bool, error) {
		if want := skippedEntry(peer, seq); !bytes.Equal(entry, want) {
			t.Fatalf("skipped key %s/%d = %q, want %q", peer, seq, entry, want)
		}
		seqs = append(seqs, seq)
		return true, nil
	}))
	n, err := r.SkippedKeyCount(&peer)
	must(t, err)
	if n != len(seqs) {
		t.Fatalf("SkippedKeyCount(%s) = %d, %d stored", peer, n, len(seqs))
	}
	return seqs
}

func wantSkipped(t *testing.T, r persistence.DeliveryReader, want map[messages.DeviceAddress][]uint64, peers ...messages.DeviceAddress) {
	t.Helper()
	total := 0
	for _, p := range peers {
		got := readSkipped(t, r, p)
		if fmt.Sprint(got) != fmt.Sprint(want[p]) {
			t.Fatalf("skipped keys of %s = %v, want %v", p, got, want[p])
		}
		total += len(got)
	}
	n, err := r.SkippedKeyCount(nil)
	must(t, err)
	if n != total {
		t.Fatalf("SkippedKeyCount(nil) = %d, want %d", n, total)
	}
}

func putSkipped(t *testing.T, tx persistence.DeliveryTx, peer messages.DeviceAddress, seqs ...uint64) {
	t.Helper()
	for _, seq := range seqs {
		must(t, tx.PutSkippedKey(peer, seq, skippedEntry(peer, seq)))
	}
}

func testDeliverySkippedKeys(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a, b, c := addr("alice", 1), addr("alice", 2), addr("bob", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, []byte("ra")))
		must(t, tx.PutSession(b, []byte("rb")))
		putSkipped(t, tx, a, 7, 1, 300, 2)
		putSkipped(t, tx, b, 1)
		putSkipped(t, tx, a, 2) // replaced: counted once
		must(t, tx.DeleteSkippedKey(a, 99))
		must(t, tx.DeleteSkippedKey(c, 1))
		// Reads inside the transaction see its writes.
		wantSkipped(t, tx, map[messages.DeviceAddress][]uint64{a: {1, 2, 7, 300}, b: {1}}, a, b, c)
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, map[messages.DeviceAddress][]uint64{a: {1, 2, 7, 300}, b: {1}}, a, b, c)
		return nil
	})
	// A failed Update keeps none of its skipped-key writes.
	boom := errors.New("boom")
	if err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		putSkipped(t, tx, a, 8)
		must(t, tx.DeleteSkippedKey(a, 1))
		must(t, tx.DeleteSession(b))
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want boom", err)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.DeleteSkippedKey(a, 7))
		must(t, tx.DeleteSkippedKey(a, 7)) // again: nothing
		putSkipped(t, tx, a, 301)
		// DeleteSession takes the peer's keys; a new record starts with none.
		must(t, tx.DeleteSession(b))
		wantSkipped(t, tx, map[messages.DeviceAddress][]uint64{a: {1, 2, 300, 301}}, a, b)
		putSkipped(t, tx, b, 5)
		return nil
	})
	s = reopen()
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, map[messages.DeviceAddress][]uint64{a: {1, 2, 300, 301}, b: {5}}, a, b, c)
		// fn stopping early.
		n := 0
		must(t, r.SkippedKeys(a, func(uint64, []byte) (bool, error) { n++; return n < 2, nil }))
		if n != 2 {
			t.Fatalf("SkippedKeys visited %d after fn returned false at 2", n)
		}
		if err := r.SkippedKeys(a, func(uint64, []byte) (bool, error) { return true, boom }); !errors.Is(err, boom) {
			t.Fatalf("SkippedKeys error = %v", err)
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		if tx.PutSkippedKey(addr("", 1), 1, []byte("x")) == nil || tx.DeleteSkippedKey(addr("", 1), 1) == nil {
			t.Fatal("invalid address accepted")
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if err := r.SkippedKeys(addr("", 1), func(uint64, []byte) (bool, error) { return true, nil }); err == nil {
			t.Fatal("SkippedKeys of an invalid address accepted")
		}
		if tx, ok := r.(persistence.DeliveryTx); ok && tx.PutSkippedKey(a, 1, []byte("x")) == nil {
			t.Fatal("PutSkippedKey in a View accepted")
		}
		return nil
	})
}

// testDeliverySkippedEntryLimit: an entry of MaxSkippedKeyEntry bytes is
// stored, one byte more is ErrInvalidRecord and changes nothing.
func testDeliverySkippedEntryLimit(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	edge := bytes.Repeat([]byte{0xAB}, persistence.MaxSkippedKeyEntry)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error { return tx.PutSkippedKey(a, 1, edge) })
	err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		return tx.PutSkippedKey(a, 2, append(edge, 0))
	})
	if !errors.Is(err, persistence.ErrInvalidRecord) {
		t.Fatalf("entry of %d bytes: %v, want ErrInvalidRecord", persistence.MaxSkippedKeyEntry+1, err)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		var got [][]byte
		must(t, r.SkippedKeys(a, func(_ uint64, e []byte) (bool, error) { got = append(got, e); return true, nil }))
		if len(got) != 1 || !bytes.Equal(got[0], edge) {
			t.Fatalf("stored %d entries after the refused one", len(got))
		}
		return nil
	})
}

// testDeliverySkippedEviction: at the cap nothing goes; past it the
// largest holder loses its lowest numbers first, holders at one level
// share the cut (the lower address one more), and a smaller holder keeps
// everything while larger ones hold more.
func testDeliverySkippedEviction(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a, b, c := addr("a", 1), addr("b", 1), addr("c", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		putSkipped(t, tx, a, 1, 2, 3, 4, 5)
		putSkipped(t, tx, b, 10, 11, 12)
		putSkipped(t, tx, c, 20)
		return nil
	})
	evict := func(limit int, want []persistence.SkippedEviction) {
		t.Helper()
		dUpdate(t, s, func(tx persistence.DeliveryTx) error {
			got, err := tx.EvictSkippedKeys(limit)
			must(t, err)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("EvictSkippedKeys(%d) = %v, want %v", limit, got, want)
			}
			return nil
		})
	}
	evict(9, nil) // at the cap
	evict(100, nil)
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, map[messages.DeviceAddress][]uint64{a: {1, 2, 3, 4, 5}, b: {10, 11, 12}, c: {20}}, a, b, c)
		return nil
	})
	evict(8, []persistence.SkippedEviction{{Peer: a, Count: 1}}) // one past it
	evict(5, []persistence.SkippedEviction{{Peer: a, Count: 2}, {Peer: b, Count: 1}})
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, map[messages.DeviceAddress][]uint64{a: {4, 5}, b: {11, 12}, c: {20}}, a, b, c)
		return nil
	})
	evict(4, []persistence.SkippedEviction{{Peer: a, Count: 1}}) // a tie: the lower address
	evict(0, []persistence.SkippedEviction{{Peer: a, Count: 1}, {Peer: b, Count: 2}, {Peer: c, Count: 1}})
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, nil, a, b, c)
		return nil
	})
	// Keys written and evicted in one transaction.
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		putSkipped(t, tx, c, 30, 31, 32)
		putSkipped(t, tx, a, 40)
		got, err := tx.EvictSkippedKeys(2)
		must(t, err)
		if want := []persistence.SkippedEviction{{Peer: c, Count: 2}}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("EvictSkippedKeys in the writing transaction = %v, want %v", got, want)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		wantSkipped(t, r, map[messages.DeviceAddress][]uint64{a: {40}, c: {32}}, a, b, c)
		return nil
	})
}
