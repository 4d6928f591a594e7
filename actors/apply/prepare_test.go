package apply

import (
	"context"
	"crypto/ed25519"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/clock"
	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// appendSpy records, for every event its transactions append, whether it
// arrived prepared for those very bytes.
type appendSpy struct {
	persistence.SyncStore
	mu                 sync.Mutex
	prepared, unprepar int
}

func (s *appendSpy) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	return s.SyncStore.Update(ctx, func(tx persistence.SyncTx) error { return fn(&spyTx{SyncTx: tx, s: s}) })
}

type spyTx struct {
	persistence.SyncTx
	s *appendSpy
}

func (t *spyTx) AppendEvent(ev persistence.StoredEvent) (uint64, error) {
	t.s.mu.Lock()
	if ev.Prepared.For(&ev) {
		t.s.prepared++
	} else {
		t.s.unprepar++
	}
	t.s.mu.Unlock()
	return t.SyncTx.AppendEvent(ev)
}

// The chokepoint prepares every event it hands to the single writer on
// its verifiers (the key expansion and, on a sealing store, the seal are
// done before the transaction), both for ApplyBatch and for one Apply,
// and the events apply as before: the sums equal the scan of the keys.
func TestChokepointPreparesEventsOffTheWriter(t *testing.T) {
	ctx := context.Background()
	spy := &appendSpy{SyncStore: memory.New()}
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	stopped := make(chan struct{})
	var count atomic.Int64
	r := syncgroup.NewRouter(sys, "t", syncgroup.Deps{
		Store: spy, Notify: func(messages.Notice) {}, Observe: func(messages.HLC) {},
		Count: func(messages.Outcome) { count.Add(1) }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	stop := func() { r.Stop(5 * time.Second); close(stopped) }
	before := persistence.PreparedOutstanding()
	tk := persistence.TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	if err := r.Write(ctx, func(tx persistence.SyncTx) error { return tx.PutTable(tk) }); err != nil {
		t.Fatal(err)
	}
	site := messages.SiteID{7}
	signer := sign.NewSigner(site, ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	kr, err := sign.NewKeyring(signer.Key())
	if err != nil {
		t.Fatal(err)
	}
	var ring atomic.Pointer[sign.Keyring]
	ring.Store(kr)
	mesh := []byte("mesh")
	scope, _ := ParseScope(nil)
	c := New(Config{MeshID: mesh, Keyring: &ring, Clock: clock.New(time.Now, 0, nil, 0), Scope: scope, Router: r,
		Notify: func(messages.Notice) {}, Count: func(messages.Outcome) {}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Stopped: stopped})
	now := uint64(time.Now().UnixMilli()) << 16
	raws := make([][]byte, 4*sign.BatchSize+5)
	for i := range raws {
		e := &messages.Event{Site: site, HLC: messages.HLC(now + uint64(i)), Schema: "s", Table: "t",
			Key: messages.Columns{"id": messages.MustValue(i % 7)}, Payload: messages.Columns{"v": messages.MustValue(i)}}
		if raws[i], err = signer.Sign(e, mesh); err != nil {
			t.Fatal(err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	tail := raws[3*sign.BatchSize:]
	raws = raws[:3*sign.BatchSize]
	outs, err := c.ApplyBatch(ctx, raws[1:])
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Apply(ctx, raws[0])
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range append(outs, out) {
		if o.Kind != messages.Applied {
			t.Fatalf("event %d: %v", i, o)
		}
	}
	if spy.prepared != len(raws) || spy.unprepar != 0 {
		t.Fatalf("the writer appended %d prepared and %d unprepared events, want %d and 0", spy.prepared, spy.unprepar, len(raws))
	}
	if got := persistence.PreparedOutstanding(); got != before {
		t.Fatalf("%d preparations outstanding once every event was answered, %d before", got, before)
	}
	// A caller that stops waiting leaves its events to the groups, which
	// release their preparations once the transaction ends.
	if _, err := c.ApplyBatch(cancelled, tail); err == nil {
		// Answered before the cancellation was seen: also fine.
		t.Log("the cancelled batch was answered at once")
	}
	stop() // drains: every accepted request is answered
	if got := persistence.PreparedOutstanding(); got != before {
		t.Fatalf("%d preparations outstanding after a cancelled caller's batch was committed, %d before", got, before)
	}
	if err := spy.View(ctx, func(rd persistence.SyncReader) error {
		got, err := rd.TableEventSum(persistence.TableKey{Schema: "s", Table: "t"}, 0)
		if err != nil {
			return err
		}
		var want persistence.RangeSum
		if err := rd.TableEventKeys(persistence.TableKey{Schema: "s", Table: "t"}, 0, func(k persistence.EventKey) (bool, error) {
			want.Add(k)
			return true, nil
		}); err != nil {
			return err
		}
		if got != want || got.Count != uint64(len(raws)+len(tail)) {
			t.Fatalf("range sum of %d events differs from the scan of %d keys", got.Count, want.Count)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
