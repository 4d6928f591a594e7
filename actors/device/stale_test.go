package device_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
)

// staleCount reads syncmesh_delivery_stale_pending_total{side, reason}.
func staleCount(t *testing.T, reg *prometheus.Registry, side, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_delivery_stale_pending_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if len(l) == 2 && l["side"] == side && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// staleTweak configures the pending check by hand (no schedule) with a
// registry and a notice log.
func staleTweak(reg *prometheus.Registry, notices *[]device.StalePending, more func(*device.Config)) func(*device.Config) {
	return func(c *device.Config) {
		c.Registerer, c.StaleAfter, c.StaleCheckInterval = reg, time.Hour, -1
		c.OnStale = func(s device.StalePending) { *notices = append(*notices, s) }
		if more != nil {
			more(c)
		}
	}
}

// TestAttackUnansweredInitiationIsSurfacedAndReinitiatedOnlyUnderRetry:
// alice's first message to bob is held in transit
// while bob serves enough bundles, past the minimum age, to evict the
// one-time prekey it names: the initiation can never succeed. An hour
// later alice's pending check reports it once (notice and metric, reason
// unanswered_initiation). With Retry off nothing is sent again; with
// Retry on alice resets the session and resends with a new initiation,
// which bob delivers and acknowledges.
func TestAttackUnansweredInitiationIsSurfacedAndReinitiatedOnlyUnderRetry(t *testing.T) {
	for _, retry := range []bool{false, true} {
		t.Run(map[bool]string{false: "retry off", true: "retry on"}[retry], func(t *testing.T) {
			ms := newMesh(t)
			reg := prometheus.NewRegistry()
			var notices []device.StalePending
			a := ms.add(aliceAddr, staleTweak(reg, &notices, func(c *device.Config) {
				if retry {
					c.Retry = device.RetryPolicy{Interval: 24 * time.Hour} // the schedule never runs in the test
				}
			}))
			pk := ratchet.DefaultPrekeyConfig()
			pk.OneTimeBatch, pk.OneTimeThreshold, pk.MaxOneTime, pk.MinIssuedAge = 4, 2, 8, time.Minute
			b := ms.add(bobAddr, func(c *device.Config) {
				c.Session = func(s *session.Config) { s.RefreshInterval = -1; s.Prekeys = pk }
			})
			sm := a.send(b, "first")
			held := b.takeOne()
			ms.clock.Advance(2 * time.Minute)
			for range 20 {
				if _, err := b.d.Bundle(bg); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.recv(held); err == nil {
				t.Fatal("the held initiation was accepted after its one-time prekey was evicted")
			}
			if got, err := a.d.CheckPending(bg); err != nil || len(got) != 0 {
				t.Fatalf("check before StaleAfter: %+v, %v", got, err)
			}
			ms.clock.Advance(time.Hour)
			got, err := a.d.CheckPending(bg)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !got[0].Sent || got[0].Peer != bobAddr || got[0].ID != sm.ID ||
				got[0].Reason != device.StaleUnansweredInitiation || got[0].Reinitiated != retry {
				t.Fatalf("stale: %+v", got)
			}
			if len(notices) != 1 || notices[0] != got[0] {
				t.Fatalf("notices: %+v", notices)
			}
			if n := staleCount(t, reg, "sent", device.StaleUnansweredInitiation); n != 1 {
				t.Fatalf("stale metric %v, want 1", n)
			}
			if again, err := a.d.CheckPending(bg); err != nil || len(again) != 0 {
				t.Fatalf("second check reported again: %+v, %v", again, err)
			}
			if !retry {
				if q := b.take(); len(q) != 0 {
					t.Fatalf("retry off: %d envelopes sent again", len(q))
				}
				if p := a.sentPending(); len(p) != 1 {
					t.Fatalf("retry off: %d pending, want 1", len(p))
				}
				return
			}
			r := b.mustRecv(b.takeOne())
			if r.Kind != device.Delivery || string(r.Message.Plaintext) != "first" {
				t.Fatalf("re-initiated: %+v", r)
			}
			b.commit(a, sm.ID)
			a.pump()
			if p := a.sentPending(); len(p) != 0 {
				t.Fatalf("%d still pending after the re-initiation was acknowledged", len(p))
			}
		})
	}
}

// TestPendingPastStaleAfterIsReportedOnBothSides: on
// an established session bob leaves one message uncommitted; he commits another whose ACK is lost
// (Retry off). An hour later bob's check reports the uncommitted one and
// alice's both unacknowledged ones, each once, with their metrics.
func TestPendingPastStaleAfterIsReportedOnBothSides(t *testing.T) {
	ms := newMesh(t)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	var na, nb []device.StalePending
	a := ms.add(aliceAddr, staleTweak(regA, &na, nil))
	b := ms.add(bobAddr, staleTweak(regB, &nb, nil))
	hello := a.send(b, "hello") // bob answers: an established session
	b.pump()
	b.commit(a, hello.ID)
	a.pump()
	kept := a.send(b, "kept")
	b.pump()
	lost := a.send(b, "lost ack")
	b.pump()
	b.commit(a, lost.ID)
	a.take() // the ACK is lost
	ms.clock.Advance(time.Hour)
	got, err := b.d.CheckPending(bg)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Sent || got[0].Peer != aliceAddr || got[0].ID != kept.ID || got[0].Reason != device.StaleUncommitted {
		t.Fatalf("bob: %+v", got)
	}
	if staleCount(t, regB, "received", device.StaleUncommitted) != 1 || len(nb) != 1 {
		t.Fatalf("bob: metric %v, notices %+v", staleCount(t, regB, "received", device.StaleUncommitted), nb)
	}
	got, err = a.d.CheckPending(bg)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, s := range got {
		if !s.Sent || s.Peer != bobAddr || s.Reason != device.StaleUnacknowledged {
			t.Fatalf("alice: %+v", s)
		}
		ids[s.ID.String()] = true
	}
	if len(got) != 2 || !ids[kept.ID.String()] || !ids[lost.ID.String()] {
		t.Fatalf("alice: %+v", got)
	}
	if staleCount(t, regA, "sent", device.StaleUnacknowledged) != 2 || len(na) != 2 {
		t.Fatalf("alice: metric %v, notices %+v", staleCount(t, regA, "sent", device.StaleUnacknowledged), na)
	}
	for _, d := range []*dev{a, b} {
		if again, err := d.d.CheckPending(bg); err != nil || len(again) != 0 {
			t.Fatalf("%s reported again: %+v, %v", d.addr, again, err)
		}
	}
}

// TestAttackSendAfterPeerReinstallIsNotSilent: bob
// reinstalls (a new identity at his address). Alice's Send on the old
// session succeeds — the transport took it — but bob cannot decrypt it.
// An hour later alice's check reports it with the reason
// peer_identity_changed (bob's bundle names another identity than the
// pin), and nothing is sent again on its own.
func TestAttackSendAfterPeerReinstallIsNotSilent(t *testing.T) {
	ms := newMesh(t)
	reg := prometheus.NewRegistry()
	var notices []device.StalePending
	a := ms.add(aliceAddr, staleTweak(reg, &notices, func(c *device.Config) { c.Retry = device.RetryPolicy{Interval: 24 * time.Hour} }))
	b := ms.add(bobAddr, nil)
	first := a.send(b, "hello")
	b.pump()
	b.commit(a, first.ID)
	a.pump()
	b2 := ms.add(bobAddr, nil) // reinstalled: a fresh store and identity
	sm := a.send(b2, "after the reinstall")
	if _, err := b2.recv(b2.takeOne()); err == nil {
		t.Fatal("the reinstalled bob decrypted a message of the old session")
	}
	ms.clock.Advance(time.Hour)
	got, err := a.d.CheckPending(bg)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != sm.ID || got[0].Reason != device.StalePeerIdentityChanged || got[0].Reinitiated {
		t.Fatalf("stale: %+v", got)
	}
	if len(notices) != 1 || staleCount(t, reg, "sent", device.StalePeerIdentityChanged) != 1 {
		t.Fatalf("notices %+v, metric %v", notices, staleCount(t, reg, "sent", device.StalePeerIdentityChanged))
	}
	if q := b2.take(); len(q) != 0 {
		t.Fatalf("%d envelopes sent to the reinstalled bob on their own", len(q))
	}
}
