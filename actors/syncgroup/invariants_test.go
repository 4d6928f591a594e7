//go:build invariants

package syncgroup

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/internal/invariants"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// recorder collects the violations raised while it is installed.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func record(t *testing.T) *recorder {
	r := &recorder{}
	t.Cleanup(invariants.SetHandler(func(v invariants.Violation) {
		r.mu.Lock()
		r.got = append(r.got, v.Msg)
		r.mu.Unlock()
	}))
	return r
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

func (r *recorder) want(t *testing.T, substr string) {
	t.Helper()
	got := r.take()
	if len(got) != 1 || !strings.Contains(got[0], substr) {
		t.Fatalf("violations = %q, want one containing %q", got, substr)
	}
}

func (r *recorder) none(t *testing.T) {
	t.Helper()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("violations on the honest path: %q", got)
	}
}

// loweringStore is the injected fault for the watermark invariant: its
// transactions store any watermark, lower ones too (the store's own
// refusal, ErrWatermarkRegression, bypassed).
type loweringStore struct {
	persistence.SyncStore
	marks map[persistence.GroupKey]persistence.Watermark
}

type loweringTx struct {
	persistence.SyncTx
	s *loweringStore
}

func (s *loweringStore) Update(ctx context.Context, fn func(persistence.SyncTx) error) error {
	return s.SyncStore.Update(ctx, func(tx persistence.SyncTx) error { return fn(loweringTx{tx, s}) })
}

func (t loweringTx) Watermark(g persistence.GroupKey) (persistence.Watermark, bool, error) {
	w, ok := t.s.marks[g]
	return w, ok, nil
}

func (t loweringTx) PutWatermark(g persistence.GroupKey, w persistence.Watermark) error {
	t.s.marks[g] = w
	return nil
}

var group = persistence.GroupKey{Site: messages.SiteID{7}, Schema: "app", Table: "t"}

func TestInvariantWatermarkLowered(t *testing.T) {
	rec := record(t)
	s := CheckWriters(&loweringStore{SyncStore: memory.New(), marks: map[persistence.GroupKey]persistence.Watermark{}})
	put := func(h messages.HLC) {
		t.Helper()
		if err := s.Update(context.Background(), func(tx persistence.SyncTx) error {
			return tx.PutWatermark(group, persistence.Watermark{HLC: h, Seq: uint64(h)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	put(10)
	put(20)
	rec.none(t)
	put(15) // the fault: stored although lower
	rec.want(t, "watermark")
}

// The honest store refuses the regression itself: no violation.
func TestInvariantWatermarkRefusedIsNoViolation(t *testing.T) {
	rec := record(t)
	s := CheckWriters(memory.New())
	for _, h := range []messages.HLC{10, 20, 15} {
		err := s.Update(context.Background(), func(tx persistence.SyncTx) error {
			return tx.PutWatermark(group, persistence.Watermark{HLC: h, Seq: 1})
		})
		if h == 15 && !errors.Is(err, persistence.ErrWatermarkRegression) {
			t.Fatalf("lowering to 15: %v, want ErrWatermarkRegression", err)
		} else if h != 15 && err != nil {
			t.Fatal(err)
		}
	}
	rec.none(t)
}

func row(exists bool, ex, tomb messages.HLC, cells map[string]messages.HLC) persistence.Row {
	r := persistence.Row{Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}, Exists: exists,
		Existence: messages.Clock{HLC: ex}, Tomb: messages.Clock{HLC: tomb}, Cells: map[string]persistence.Cell{}}
	for c, h := range cells {
		r.Cells[c] = persistence.Cell{Value: messages.MustValue(int(h)), Clock: messages.Clock{HLC: h}}
	}
	return r
}

func TestInvariantCanonicalRowTable(t *testing.T) {
	for _, c := range []struct {
		name string
		row  persistence.Row
		why  string
	}{
		{"live", row(true, 5, 0, map[string]messages.HLC{"a": 5, "b": 3}), ""},
		{"resurrected", row(true, 9, 4, map[string]messages.HLC{"a": 9}), ""},
		{"deleted", row(false, 4, 4, map[string]messages.HLC{"a": 7}), "above existence"},
		{"deleted, cleared", row(false, 4, 4, nil), ""},
		{"no existence", row(false, 0, 0, nil), "no existence"},
		{"tomb above existence", row(true, 3, 4, nil), "tombstone clock above existence"},
		{"deleted below a later tomb", row(false, 6, 4, nil), "not the tombstone clock"},
		{"cell under the tombstone", row(true, 9, 4, map[string]messages.HLC{"a": 4}), "at or below the tombstone"},
		{"cell above existence", row(true, 5, 0, map[string]messages.HLC{"a": 6}), "above existence"},
		{"empty key", persistence.Row{Schema: "app", Table: "t", Exists: true, Existence: messages.Clock{HLC: 1}}, "empty key"},
	} {
		got := uncanonical(c.row)
		if (c.why == "") != (got == "") || !strings.Contains(got, c.why) {
			t.Errorf("%s: uncanonical = %q, want %q", c.name, got, c.why)
		}
	}
}

// write runs fn in a committer transaction.
func write(r *Router, fn func(tx persistence.SyncTx) error) error {
	return r.Write(context.Background(), fn)
}

func newTestRouter(t *testing.T, s persistence.SyncStore) *Router {
	sys := actor.NewActorSystem()
	r := NewRouter(sys, "t", Deps{Store: s, Notify: func(messages.Notice) {}, Observe: func(messages.HLC) {}, Count: func(messages.Outcome) {}})
	t.Cleanup(func() { r.Stop(5 * time.Second); sys.Shutdown() })
	return r
}

// Once a committer owns the store, rows written outside it fire the
// ownership invariant; the
// committer's own writes do not; a non-canonical row written by the
// committer fails its transaction, which rolls back.
func TestInvariantOnlyTheCommitterWritesRows(t *testing.T) {
	rec := record(t)
	mem := memory.New()
	s := CheckWriters(mem)
	good := row(true, 5, 0, map[string]messages.HLC{"a": 5})
	direct := func() {
		t.Helper()
		if err := s.Update(context.Background(), func(tx persistence.SyncTx) error { return tx.PutRow(good) }); err != nil {
			t.Fatal(err)
		}
	}
	direct() // before a committer owns the store (a node's setup in Open)
	rec.none(t)

	r := newTestRouter(t, s)
	direct()
	rec.want(t, "PutRow outside the committer")
	if err := write(r, func(tx persistence.SyncTx) error { return tx.PutRow(good) }); err != nil {
		t.Fatal(err)
	}
	rec.none(t)

	restore := invariants.SetHandler(func(v invariants.Violation) { panic(v) }) // the default: a panic
	bad := row(true, 5, 0, map[string]messages.HLC{"a": 6})
	bad.Key = messages.Columns{"id": messages.MustValue(2)}
	err := write(r, func(tx persistence.SyncTx) error { return tx.PutRow(bad) })
	restore()
	var v invariants.Violation
	if !errors.As(err, &v) || !strings.Contains(v.Msg, "not canonical") {
		t.Fatalf("committer write of a non-canonical row: %v, want the violation", err)
	}
	if err := mem.View(context.Background(), func(tx persistence.SyncReader) error {
		_, ok, err := tx.Row(persistence.TableKey{Schema: "app", Table: "t"}, bad.Key.Encode())
		if ok {
			t.Error("the violating row was stored")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestInvariantRouterStoppedTwice(t *testing.T) {
	rec := record(t)
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	r := NewRouter(sys, "t", Deps{Store: memory.New(), Notify: func(messages.Notice) {}, Observe: func(messages.HLC) {}, Count: func(messages.Outcome) {}})
	r.Stop(time.Second)
	rec.none(t)
	r.Stop(time.Second)
	rec.want(t, "torn down twice")
}
