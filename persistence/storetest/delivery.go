package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// DeliveryOpenFunc opens a fresh, empty delivery store for one subtest.
// reopen closes the current handle and returns a new one over the same
// backing data, as a process restart would see it. It registers its own
// cleanup.
type DeliveryOpenFunc func(t *testing.T) (store persistence.DeliveryStore, reopen func() persistence.DeliveryStore)

// RunDeliveryStore runs the persistence.DeliveryStore contract suite
// against open. Decisions it pins where the contract's prose is brief:
// values are copied in and out; reads inside an Update see its writes;
// an Update whose fn fails keeps nothing; DeleteSession keeps the pin;
// Sessions visits addresses in DeviceAddress.Compare order strictly after
// the cursor; invalid addresses are errors; a transaction used after fn
// returned, a cancelled context and a closed store fail as in RunSyncStore.
func RunDeliveryStore(t *testing.T, open DeliveryOpenFunc) {
	tests := []struct {
		name string
		fn   func(t *testing.T, open DeliveryOpenFunc)
	}{
		{"EmptyStoreReadsMissing", testDeliveryEmpty},
		{"PutThenReadInsideAndAfter", testDeliveryPutRead},
		{"UpdateErrorKeepsNothing", testDeliveryAtomic},
		{"ValuesAreCopied", testDeliveryCopies},
		{"DeleteSessionKeepsPin", testDeliveryDelete},
		{"SessionsOrderCursorStop", testDeliverySessionsOrder},
		{"SessionsCallbackMayWrite", testDeliverySessionsWrite},
		{"InvalidAddressIsError", testDeliveryInvalidAddress},
		{"ViewIsReadOnly", testDeliveryViewReadOnly},
		{"TxUsedAfterFnReturnsFails", testDeliveryTxAfter},
		{"CancelledContextFailsBeforeFn", testDeliveryCancelled},
		{"CloseThenEveryCallReturnsErrClosed", testDeliveryClosed},
		{"SurvivesReopen", testDeliveryReopen},
		{"ConcurrentReadModifyWriteLosesNothing", testDeliveryConcurrent},
		{"SkippedKeysPerPeerInOrderWithCounts", testDeliverySkippedKeys},
		{"SkippedKeyEntryLimitAtAndPastTheEdge", testDeliverySkippedEntryLimit},
		{"SkippedKeysEvictedFromTheLargestHolderAtAndPastTheCap", testDeliverySkippedEviction},
		{"SessionWritesCountsCommittedWritesOnlyAndOnlyGrows", testDeliverySessionWrites},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func dUpdate(t *testing.T, s persistence.DeliveryStore, fn func(tx persistence.DeliveryTx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func dView(t *testing.T, s persistence.DeliveryStore, fn func(tx persistence.DeliveryReader) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func addr(user string, dev uint32) messages.DeviceAddress {
	return messages.DeviceAddress{User: user, Device: dev}
}

func identityKey(b byte) messages.IdentityKey {
	var k messages.IdentityKey
	for i := range k.Sign {
		k.Sign[i] = b
		k.DH[i] = b ^ 0x5a
	}
	return k
}

// snapshot is everything readable in a delivery store.
type deliverySnapshot struct {
	identity, prekeys []byte
	hasID, hasPK      bool
	sessions          map[messages.DeviceAddress][]byte
	pins              map[messages.DeviceAddress]messages.IdentityKey
}

func readAll(t *testing.T, r persistence.DeliveryReader, peers []messages.DeviceAddress) deliverySnapshot {
	t.Helper()
	var s deliverySnapshot
	var err error
	if s.identity, s.hasID, err = r.LocalIdentity(); err != nil {
		t.Fatalf("LocalIdentity: %v", err)
	}
	if s.prekeys, s.hasPK, err = r.Prekeys(); err != nil {
		t.Fatalf("Prekeys: %v", err)
	}
	s.sessions = map[messages.DeviceAddress][]byte{}
	s.pins = map[messages.DeviceAddress]messages.IdentityKey{}
	for _, p := range peers {
		v, ok, err := r.Session(p)
		if err != nil {
			t.Fatalf("Session(%s): %v", p, err)
		}
		if ok {
			s.sessions[p] = v
		}
		k, ok, err := r.Pin(p)
		if err != nil {
			t.Fatalf("Pin(%s): %v", p, err)
		}
		if ok {
			s.pins[p] = k
		}
	}
	return s
}

func listSessions(t *testing.T, r persistence.DeliveryReader, after *messages.DeviceAddress) []messages.DeviceAddress {
	t.Helper()
	var out []messages.DeviceAddress
	if err := r.Sessions(after, func(a messages.DeviceAddress) (bool, error) {
		out = append(out, a)
		return true, nil
	}); err != nil {
		t.Fatalf("Sessions: %v", err)
	}
	return out
}

func testDeliveryEmpty(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := readAll(t, r, []messages.DeviceAddress{addr("a", 1)})
		if got.hasID || got.hasPK || len(got.sessions) != 0 || len(got.pins) != 0 || got.identity != nil || got.prekeys != nil {
			t.Fatalf("empty store returned %+v", got)
		}
		if l := listSessions(t, r, nil); len(l) != 0 {
			t.Fatalf("Sessions on empty store: %v", l)
		}
		return nil
	})
}

func testDeliveryPutRead(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a, b := addr("alice", 1), addr("bob", 7)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutLocalIdentity([]byte("id-1")))
		must(t, tx.PutPrekeys([]byte("pk-1")))
		must(t, tx.PutSession(a, []byte("rec-a")))
		must(t, tx.PutPin(b, identityKey(2)))
		// Reads inside the transaction see its writes.
		got := readAll(t, tx, []messages.DeviceAddress{a, b})
		if string(got.identity) != "id-1" || string(got.prekeys) != "pk-1" || string(got.sessions[a]) != "rec-a" || got.pins[b] != identityKey(2) {
			t.Fatalf("inside tx: %+v", got)
		}
		if _, ok := got.sessions[b]; ok {
			t.Fatal("bob has a session he was never given")
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutPrekeys([]byte("pk-2"))) // replace
		must(t, tx.PutSession(a, []byte{}))    // an empty record is present, not missing
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := readAll(t, r, []messages.DeviceAddress{a, b})
		if string(got.identity) != "id-1" || string(got.prekeys) != "pk-2" || got.pins[b] != identityKey(2) {
			t.Fatalf("after commit: %+v", got)
		}
		if v, ok := got.sessions[a]; !ok || len(v) != 0 {
			t.Fatalf("empty session record: %q %v", v, ok)
		}
		return nil
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testDeliveryAtomic(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, []byte("v1")))
		must(t, tx.PutPin(a, identityKey(1)))
		return nil
	})
	boom := errors.New("boom")
	err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		must(t, tx.PutLocalIdentity([]byte("id")))
		must(t, tx.PutPrekeys([]byte("pk")))
		must(t, tx.PutSession(a, []byte("v2")))
		must(t, tx.PutSession(addr("carol", 3), []byte("c")))
		must(t, tx.DeleteSession(a))
		must(t, tx.PutPin(a, identityKey(9)))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := readAll(t, r, []messages.DeviceAddress{a, addr("carol", 3)})
		if got.hasID || got.hasPK || string(got.sessions[a]) != "v1" || len(got.sessions) != 1 || got.pins[a] != identityKey(1) {
			t.Fatalf("failed Update left state behind: %+v", got)
		}
		return nil
	})
}

func testDeliveryCopies(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	in := []byte("record")
	id := []byte("ident")
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, in))
		must(t, tx.PutLocalIdentity(id))
		in[0], id[0] = 'X', 'X' // mutate after Put, inside the tx
		return nil
	})
	in[1] = 'Y'
	dView(t, s, func(r persistence.DeliveryReader) error {
		v, _, err := r.Session(a)
		must(t, err)
		if string(v) != "record" {
			t.Fatalf("stored value aliased the caller's slice: %q", v)
		}
		v[0] = 'Z'
		i, _, err := r.LocalIdentity()
		must(t, err)
		if string(i) != "ident" {
			t.Fatalf("identity aliased: %q", i)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		v, _, err := r.Session(a)
		must(t, err)
		if string(v) != "record" {
			t.Fatalf("returned value aliased the store: %q", v)
		}
		return nil
	})
}

func testDeliveryDelete(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("alice", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, []byte("r")))
		must(t, tx.PutPin(a, identityKey(4)))
		must(t, tx.DeleteSession(addr("nobody", 0))) // missing: not an error
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.DeleteSession(a))
		if _, ok, err := tx.Session(a); err != nil || ok {
			t.Fatalf("deleted session visible in its tx: ok=%v err=%v", ok, err)
		}
		if l := listSessions(t, tx, nil); len(l) != 0 {
			t.Fatalf("deleted session listed in its tx: %v", l)
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := readAll(t, r, []messages.DeviceAddress{a})
		if len(got.sessions) != 0 || got.pins[a] != identityKey(4) {
			t.Fatalf("after delete: %+v", got)
		}
		return nil
	})
	// Re-create after delete.
	dUpdate(t, s, func(tx persistence.DeliveryTx) error { return tx.PutSession(a, []byte("r2")) })
	dView(t, s, func(r persistence.DeliveryReader) error {
		if v, ok, err := r.Session(a); err != nil || !ok || string(v) != "r2" {
			t.Fatalf("re-created session: %q %v %v", v, ok, err)
		}
		return nil
	})
}

func testDeliverySessionsOrder(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	// Users chosen so that byte order, length order and NUL handling differ.
	peers := []messages.DeviceAddress{
		addr("b", 1), addr("a", 2), addr("a", 1), addr("ab", 0), addr("a\x00", 5), addr("a\x00b", 0),
		addr("a", 0xFFFFFFFF), addr("é", 3), addr("B", 9), addr("a\x01", 0), addr("a", 256),
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for i, p := range peers {
			must(t, tx.PutSession(p, []byte{byte(i)}))
		}
		return nil
	})
	want := slices.Clone(peers)
	slices.SortFunc(want, messages.DeviceAddress.Compare)
	dView(t, s, func(r persistence.DeliveryReader) error {
		if got := listSessions(t, r, nil); !slices.Equal(got, want) {
			t.Fatalf("Sessions order:\n got %q\nwant %q", got, want)
		}
		for i, after := range want {
			if got := listSessions(t, r, &after); !slices.Equal(got, want[i+1:]) {
				t.Fatalf("Sessions after %q: got %q want %q", after, got, want[i+1:])
			}
		}
		// A cursor that is not stored starts at the next stored address.
		cur := addr("a", 3)
		if got := listSessions(t, r, &cur); len(got) == 0 || got[0].Compare(cur) <= 0 {
			t.Fatalf("Sessions after absent cursor: %q", got)
		}
		// Stop early and error propagation.
		n := 0
		must(t, r.Sessions(nil, func(messages.DeviceAddress) (bool, error) { n++; return n < 3, nil }))
		if n != 3 {
			t.Fatalf("Sessions did not stop: %d calls", n)
		}
		boom := errors.New("boom")
		if err := r.Sessions(nil, func(messages.DeviceAddress) (bool, error) { return true, boom }); !errors.Is(err, boom) {
			t.Fatalf("Sessions error: %v", err)
		}
		return nil
	})
}

func testDeliverySessionsWrite(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	var peers []messages.DeviceAddress
	for i := range 600 { // more than one scan chunk
		peers = append(peers, addr(fmt.Sprintf("u%04d", i), uint32(i)))
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		for _, p := range peers {
			must(t, tx.PutSession(p, []byte("old")))
		}
		return nil
	})
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		return tx.Sessions(nil, func(a messages.DeviceAddress) (bool, error) {
			if a.Device%2 == 0 {
				return true, tx.DeleteSession(a)
			}
			return true, tx.PutSession(a, []byte("new"))
		})
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := listSessions(t, r, nil)
		if len(got) != 300 {
			t.Fatalf("%d sessions left, want 300", len(got))
		}
		for _, a := range got {
			v, _, err := r.Session(a)
			must(t, err)
			if a.Device%2 == 0 || string(v) != "new" {
				t.Fatalf("%s = %q", a, v)
			}
		}
		return nil
	})
}

func testDeliveryInvalidAddress(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	bad := []messages.DeviceAddress{{User: ""}, {User: "\xff\xfe"}, {User: string(bytes.Repeat([]byte("x"), messages.MaxUserIDLen+1))}}
	err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		for _, a := range bad {
			if tx.PutSession(a, []byte("r")) == nil {
				t.Errorf("PutSession(%q) accepted", a.User)
			}
			if tx.PutPin(a, identityKey(1)) == nil {
				t.Errorf("PutPin(%q) accepted", a.User)
			}
			if tx.DeleteSession(a) == nil {
				t.Errorf("DeleteSession(%q) accepted", a.User)
			}
			if _, _, err := tx.Session(a); err == nil {
				t.Errorf("Session(%q) accepted", a.User)
			}
			if _, _, err := tx.Pin(a); err == nil {
				t.Errorf("Pin(%q) accepted", a.User)
			}
		}
		return nil
	})
	must(t, err)
}

func testDeliveryViewReadOnly(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	dView(t, s, func(r persistence.DeliveryReader) error {
		if tx, ok := r.(persistence.DeliveryTx); ok {
			if tx.PutSession(addr("a", 1), []byte("x")) == nil || tx.PutLocalIdentity([]byte("x")) == nil ||
				tx.PutPrekeys([]byte("x")) == nil || tx.PutPin(addr("a", 1), identityKey(1)) == nil ||
				tx.DeleteSession(addr("a", 1)) == nil {
				t.Fatal("write inside View succeeded")
			}
		}
		return nil
	})
	dView(t, s, func(r persistence.DeliveryReader) error {
		if got := readAll(t, r, []messages.DeviceAddress{addr("a", 1)}); got.hasID || got.hasPK || len(got.sessions)+len(got.pins) != 0 {
			t.Fatalf("View wrote: %+v", got)
		}
		return nil
	})
}

func testDeliveryTxAfter(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	var saved persistence.DeliveryTx
	dUpdate(t, s, func(tx persistence.DeliveryTx) error { saved = tx; return nil })
	if err := saved.PutSession(addr("a", 1), []byte("x")); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("PutSession after Update: %v", err)
	}
	if _, _, err := saved.Session(addr("a", 1)); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("Session after Update: %v", err)
	}
	var savedR persistence.DeliveryReader
	dView(t, s, func(r persistence.DeliveryReader) error { savedR = r; return nil })
	if _, _, err := savedR.LocalIdentity(); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("LocalIdentity after View: %v", err)
	}
}

func testDeliveryCancelled(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.Update(ctx, func(persistence.DeliveryTx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Update: %v", err)
	}
	if err := s.View(ctx, func(persistence.DeliveryReader) error { ran = true; return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("View: %v", err)
	}
	if ran {
		t.Fatal("fn ran with a cancelled context")
	}
}

func testDeliveryClosed(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	must(t, s.Close())
	if err := s.Update(context.Background(), func(persistence.DeliveryTx) error { return nil }); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("Update after Close: %v", err)
	}
	if err := s.View(context.Background(), func(persistence.DeliveryReader) error { return nil }); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("View after Close: %v", err)
	}
	// The Close rule (persistence.ErrClosed): a second Close returns nil.
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func testDeliveryReopen(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	if reopen == nil {
		t.Skip("store cannot reopen")
	}
	a := addr("alice", 1)
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutLocalIdentity([]byte("id")))
		must(t, tx.PutPrekeys([]byte("pk")))
		must(t, tx.PutSession(a, []byte("rec")))
		return tx.PutPin(a, identityKey(3))
	})
	s = reopen()
	dView(t, s, func(r persistence.DeliveryReader) error {
		got := readAll(t, r, []messages.DeviceAddress{a})
		if string(got.identity) != "id" || string(got.prekeys) != "pk" || string(got.sessions[a]) != "rec" || got.pins[a] != identityKey(3) {
			t.Fatalf("after reopen: %+v", got)
		}
		return nil
	})
}

// testDeliveryConcurrent checks that Updates are serialized: concurrent
// read-modify-write of one value loses no increment.
func testDeliveryConcurrent(t *testing.T, open DeliveryOpenFunc) {
	s, _ := open(t)
	a := addr("counter", 1)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
					v, _, err := tx.Session(a)
					if err != nil {
						return err
					}
					return tx.PutSession(a, append(v, 1))
				})
				if err != nil {
					errs <- err
					return
				}
				_ = s.View(context.Background(), func(r persistence.DeliveryReader) error {
					_, _, err := r.Session(a)
					return err
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	dView(t, s, func(r persistence.DeliveryReader) error {
		v, _, err := r.Session(a)
		must(t, err)
		if len(v) != workers*each {
			t.Fatalf("lost updates: %d of %d", len(v), workers*each)
		}
		return nil
	})
}

// testDeliverySessionWrites checks the session write count a restore
// mark compares with: every committed PutSession and DeleteSession counts
// one, a failed Update counts nothing, RaiseSessionWrites only raises,
// and the count survives a reopen.
func testDeliverySessionWrites(t *testing.T, open DeliveryOpenFunc) {
	s, reopen := open(t)
	a, b := addr("alice", 1), addr("bob", 2)
	count := func() uint64 {
		t.Helper()
		var n uint64
		dView(t, s, func(r persistence.DeliveryReader) error {
			var err error
			n, err = r.SessionWrites()
			return err
		})
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("empty store: SessionWrites %d, want 0", n)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, []byte("r1")))
		must(t, tx.PutSession(a, []byte("r2")))
		must(t, tx.PutSession(b, []byte("r3")))
		n, err := tx.SessionWrites()
		if err != nil || n != 3 {
			t.Fatalf("inside the update: SessionWrites %d, %v; want 3", n, err)
		}
		return nil
	})
	if n := count(); n != 3 {
		t.Fatalf("after three puts: %d, want 3", n)
	}
	boom := errors.New("boom")
	if err := s.Update(context.Background(), func(tx persistence.DeliveryTx) error {
		must(t, tx.PutSession(a, []byte("r4")))
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failed update: %v", err)
	}
	if n := count(); n != 3 {
		t.Fatalf("a failed update counted: %d, want 3", n)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error { return tx.DeleteSession(b) })
	if n := count(); n != 4 {
		t.Fatalf("after a delete: %d, want 4", n)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.RaiseSessionWrites(2))
		return nil
	})
	if n := count(); n != 4 {
		t.Fatalf("a raise to a lower floor lowered it: %d, want 4", n)
	}
	dUpdate(t, s, func(tx persistence.DeliveryTx) error {
		must(t, tx.RaiseSessionWrites(100))
		return tx.PutSession(a, []byte("r5"))
	})
	if n := count(); n != 101 {
		t.Fatalf("raise to 100 then a put: %d, want 101", n)
	}
	if reopen == nil {
		return
	}
	s = reopen()
	if n := count(); n != 101 {
		t.Fatalf("after reopen: %d, want 101", n)
	}
}
