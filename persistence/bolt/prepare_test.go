package bolt

import (
	"bytes"
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// countingSealer counts Seal calls of a testSealer.
type countingSealer struct {
	*testSealer
	sealed atomic.Int64
}

func (s *countingSealer) Seal(t persistence.RecordType, identity, plaintext []byte) ([]byte, error) {
	s.sealed.Add(1)
	return s.testSealer.Seal(t, identity, plaintext)
}

// A prepared event is sealed once, by PrepareEvents on the caller's
// goroutine: AppendEvent, in the single writer, seals nothing, and the
// stored record opens to the event's bytes. An unprepared event is sealed
// by AppendEvent as before.
func TestPreparedEventIsNotSealedAgainInTheTransaction(t *testing.T) {
	s := &countingSealer{testSealer: newTestSealer(1)}
	db := mustOpen(t, filepath.Join(t.TempDir(), "p.db"), Options{NoSync: true, Sealer: s})
	defer db.Close()
	st := db.Sync()
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	mk := func(n byte) persistence.StoredEvent {
		return persistence.StoredEvent{ID: persistence.EventID{n, 0x5a}, Raw: []byte{'r', n}, Site: messages.SiteID{1},
			HLC: messages.HLC(n), Schema: tk.Schema, Table: tk.Table, RowKey: []byte{n}}
	}
	prepared, plain := mk(1), mk(2)
	st.PrepareEvents([]*persistence.StoredEvent{&prepared})
	if got := s.sealed.Load(); got != 1 {
		t.Fatalf("PrepareEvents sealed %d times, want 1", got)
	}
	ctx := context.Background()
	if err := st.Update(ctx, func(tx persistence.SyncTx) error {
		if _, err := tx.AppendEvent(prepared); err != nil {
			return err
		}
		if got := s.sealed.Load(); got != 1 {
			t.Fatalf("AppendEvent of a prepared event sealed again (%d seals)", got)
		}
		_, err := tx.AppendEvent(plain)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := s.sealed.Load(); got != 2 {
		t.Fatalf("%d seals after an unprepared append, want 2", got)
	}
	prepared.Prepared.Release()
	if err := st.View(ctx, func(r persistence.SyncReader) error {
		for _, want := range []persistence.StoredEvent{prepared, plain} {
			got, ok, err := r.Event(want.Site, want.HLC, want.ID)
			if err != nil || !ok || !bytes.Equal(got.Raw, want.Raw) {
				t.Fatalf("event %x read back %q ok=%v err=%v, want %q", want.ID[:1], got.Raw, ok, err, want.Raw)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
