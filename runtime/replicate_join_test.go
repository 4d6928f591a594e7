package runtime

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
)

// joinMesh is a writer w whose history three relays s1..s3 hold, each in
// the same log order, and a joiner j that accepts pushes from the relays
// only (w never reaches it: no claim of w's raises j's watermarks, so
// nothing but the probe can tell a relay what j already holds).
type joinMesh struct {
	*testMeshNet
	events, signed int
}

var joinRelays = []string{"s1", "s2", "s3"}

func newJoinMesh(t *testing.T, events int) *joinMesh {
	t.Helper()
	m := newTestMesh(t, 1, []string{"w", "s1", "s2", "s3", "j"}, func(string) Config { return Config{PushBatch: 50} })
	w := m.nodes["w"]
	for i := 0; i < events; i++ {
		if _, err := w.Upsert(w.ctx, "app", "t", map[string]any{"id": int64(i)}, map[string]any{"a": fmt.Sprint("value ", i)}); err != nil {
			t.Fatal(err)
		}
	}
	log, err := w.Log(w.ctx, 0, 0)
	if err != nil || len(log) != events {
		t.Fatalf("writer log: %d entries, %v", len(log), err)
	}
	jm := &joinMesh{testMeshNet: m, events: events}
	var raws [][]byte
	for _, e := range log {
		raws = append(raws, e.Raw)
		jm.signed += len(e.Raw)
	}
	for _, s := range joinRelays {
		for i := 0; i < len(raws); i += 64 {
			outs, err := m.nodes[s].ApplySignedBatch(w.ctx, raws[i:min(i+64, len(raws))])
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				if o.Kind != messages.Applied {
					t.Fatalf("%s: %v", s, o)
				}
			}
		}
		m.link(s, "j")
	}
	return jm
}

// joinTotals are what the joiner received from all relays.
type joinTotals struct {
	events int    // events carried by the relays' pushes
	bytes  uint64 // encoded pushes (probes included) handed to the joiner
}

func (m *joinMesh) check(t *testing.T, got joinTotals) {
	t.Helper()
	j := m.nodes["j"]
	if seq, err := j.LastSeq(j.ctx); err != nil || seq != uint64(m.events) {
		t.Fatalf("joiner holds %d of %d events (%v)", seq, m.events, err)
	}
	if s, ref := state(t, j.Node), state(t, m.nodes["w"].Node); s != ref {
		t.Fatalf("joiner's state differs from the writer's:\n%s\n---\n%s", s, ref)
	}
	mean := float64(m.signed) / float64(m.events)
	perEvent := float64(got.bytes) / float64(m.events)
	t.Logf("%d events received for %d held; %.1f wire bytes per event, %.2f x the mean signed size %.1f B", got.events, m.events, perEvent, perEvent/mean, mean)
	if float64(got.events) > 1.05*float64(m.events) {
		t.Fatalf("the joiner received %d events from 3 relays for %d distinct ones", got.events, m.events)
	}
	if perEvent > 1.2*mean {
		t.Fatalf("%.1f wire bytes per event, more than 1.2 x the mean signed size %.1f B", perEvent, mean)
	}
}

// A node joining from three relays at once, all holding the same
// history, receives each event about once: the relays probe before they
// push, the joiner leases each origin site to one of them and answers the
// others "busy" (push nothing of it yet) or "have" (it already holds
// exactly those events). Cycles run in turn (deterministic counts) and
// from three goroutines at once; the joiner's clock is frozen, so no
// lease expires.
func TestJoinFromThreePeersReceivesEachEventOnce(t *testing.T) {
	const events = 300
	t.Run("in turn", func(t *testing.T) {
		m := newJoinMesh(t, events)
		pushes0, _ := m.net.Bytes()
		var got joinTotals
		ctx := context.Background()
		for round := 0; ; round++ {
			if round > 100 {
				t.Fatal("relays not done after 100 rounds")
			}
			done := true
			for _, s := range joinRelays {
				rep, err := m.nodes[s].SyncNow(ctx, "j", "")
				if err != nil || rep.Err != nil {
					t.Fatalf("SyncNow %s: %v %v", s, err, rep.Err)
				}
				got.events += rep.Offered
				done = done && rep.Done()
			}
			if done {
				break
			}
		}
		pushes, _ := m.net.Bytes()
		got.bytes = pushes - pushes0
		if got.events != events {
			t.Fatalf("relays in turn offered %d events for %d", got.events, events)
		}
		m.check(t, got)
	})
	t.Run("at once", func(t *testing.T) {
		m := newJoinMesh(t, events)
		pushes0, _ := m.net.Bytes()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var mu sync.Mutex
		var got joinTotals
		var wg sync.WaitGroup
		errs := make(chan error, len(joinRelays))
		for _, s := range joinRelays {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					before, err := m.nodes["j"].LastSeq(ctx)
					if err != nil {
						errs <- err
						return
					}
					rep, err := m.nodes[s].SyncNow(ctx, "j", "")
					if err == nil {
						err = rep.Err
					}
					if err != nil {
						errs <- fmt.Errorf("SyncNow %s: %w", s, err)
						return
					}
					mu.Lock()
					got.events += rep.Offered
					mu.Unlock()
					if rep.Done() {
						if seq, _ := m.nodes["j"].LastSeq(ctx); seq == events {
							return
						}
					}
					if rep.Deferred > 0 && rep.Through == rep.After {
						// Left to the lease holder: like a sender's next
						// cycle, probe again once the joiner moved on.
						for {
							seq, err := m.nodes["j"].LastSeq(ctx)
							if err != nil || seq > before || seq == events || ctx.Err() != nil {
								break
							}
							time.Sleep(time.Millisecond)
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		pushes, _ := m.net.Bytes()
		got.bytes = pushes - pushes0
		m.check(t, got)
	})
}

// A peer that takes a site's lease and delivers nothing stalls the joiner
// for one lease TTL, not forever: probing again neither renews the lease
// nor, once it lapsed, takes it back, and the relay waiting for it then
// delivers everything. The joiner's clock is the test's.
func TestJoinLeaseHolderThatDeliversNothingStallsOneTTL(t *testing.T) {
	m := newJoinMesh(t, 120)
	ctx := context.Background()
	j, s1 := m.nodes["j"], m.nodes["s1"]
	if err := j.AcceptPeer("h"); err != nil {
		t.Fatal(err)
	}
	wSite := m.nodes["w"].Identity().Site
	grab := func() uint64 {
		t.Helper()
		res, err := j.HandlePush(ctx, &messages.SyncPush{V: messages.SyncVersion, From: "h", Log: bytes.Repeat([]byte{9}, 16), Tail: 1000,
			Offer: []messages.OfferRange{{Site: wSite, From: 0, To: 1 << 62, Count: 50, Digest: make([]byte, messages.OfferDigestSize)}}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Verdicts[0]
	}
	deferred := func(when string) {
		t.Helper()
		rep, err := s1.SyncNow(ctx, "j", "")
		if err != nil || rep.Err != nil {
			t.Fatalf("%s: %v %v", when, err, rep.Err)
		}
		if rep.Offered != 0 || rep.Deferred == 0 || rep.Through != 0 {
			t.Fatalf("%s: s1 pushed while h held the lease: %+v", when, rep)
		}
		if seq, _ := j.LastSeq(ctx); seq != 0 {
			t.Fatalf("%s: the joiner holds %d events", when, seq)
		}
	}
	if v := grab(); v != messages.VerdictSend {
		t.Fatalf("h's first probe: verdict %d, want send (the lease)", v)
	}
	deferred("h holds the lease")
	j.wall.Advance(replicate.DefaultLeaseTTL / 2)
	grab() // does not renew
	deferred("half a TTL later")
	j.wall.Advance(replicate.DefaultLeaseTTL/2 + time.Millisecond)
	grab() // lapsed without delivery: not granted again
	var got int
	for round := 0; ; round++ {
		if round > 20 {
			t.Fatal("s1 not done after 20 cycles")
		}
		rep, err := s1.SyncNow(ctx, "j", "")
		if err != nil || rep.Err != nil {
			t.Fatalf("SyncNow: %v %v", err, rep.Err)
		}
		if round == 0 && rep.Offered == 0 {
			t.Fatalf("after the lease lapsed s1 still defers: %+v", rep)
		}
		got += rep.Offered
		if rep.Done() {
			break
		}
	}
	if got != m.events {
		t.Fatalf("s1 offered %d events for %d", got, m.events)
	}
	if seq, err := j.LastSeq(ctx); err != nil || seq != uint64(m.events) {
		t.Fatalf("joiner holds %d of %d events (%v)", seq, m.events, err)
	}
}
