package ratchet

import (
	"time"

	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// issueAt issues a bundle from d's store at t after applying the schedule
// (what the device does per request) and returns it.
func issueAt(t *testing.T, d *device, at int64) *messages.PrekeyBundle {
	t.Helper()
	now := t0.Add(timeDuration(at))
	ps, _, err := d.prekeys.Refresh(d.id, now)
	if err != nil {
		t.Fatal(err)
	}
	ps, b, err := ps.IssueBundleAt(d.id.Public(), now)
	if err != nil {
		t.Fatal(err)
	}
	d.prekeys = ps
	return &b
}

// TestIssuedOneTimePrekeysKeepTheirMinimumAge: bundle
// requests far beyond MaxOneTime never push out a one-time prekey issued
// less than MinIssuedAge ago: the store stays at MaxOneTime, later
// bundles fall back to the last-resort keys, and the first initiator's
// initiation still succeeds. Past MinIssuedAge the old issued keys go
// and one-time prekeys are handed out again.
func TestIssuedOneTimePrekeysKeepTheirMinimumAge(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob") // MaxOneTime 40, batches of 10
	first := issueAt(t, b, 0)
	if first.OneTimePrekey == nil {
		t.Fatal("first bundle without a one-time prekey")
	}
	lastResort := 0
	for range 110 {
		if issueAt(t, b, 1).OneTimePrekey == nil {
			lastResort++
		}
		if n := b.prekeys.OneTimeCount(); n > b.prekeys.Config().MaxOneTime {
			t.Fatalf("%d one-time prekeys held, MaxOneTime %d", n, b.prekeys.Config().MaxOneTime)
		}
	}
	if !b.prekeys.HasOneTime(first.OneTimePrekey.ID) {
		t.Fatal("the first initiator's one-time prekey was evicted by later bundle requests")
	}
	if lastResort != 110-39 {
		t.Fatalf("%d of 110 bundles without a one-time prekey, want %d (39 left unissued)", lastResort, 110-39)
	}
	env := initiateTo(t, cfg, a, b, first, "in flight")
	b.mustRecv(t, cfg, a, env, []byte("in flight"))

	// Through a round trip of the store's encoding, after MinIssuedAge
	// the issued keys may go and new ones are handed out.
	ps, err := UnmarshalPrekeyStore(mustPrekeys(t, b.prekeys))
	if err != nil {
		t.Fatal(err)
	}
	b.prekeys = ps
	later := issueAt(t, b, int64(DefaultMinIssuedAge)+2)
	if later.OneTimePrekey == nil {
		t.Fatal("no one-time prekey once the issued ones are old enough to go")
	}
	if n := b.prekeys.OneTimeCount(); n > b.prekeys.Config().MaxOneTime {
		t.Fatalf("%d one-time prekeys held, MaxOneTime %d", n, b.prekeys.Config().MaxOneTime)
	}
}

// TestVersion2PrekeysLoad: a version-2 prekey store (no issue times)
// decodes with the same keys; its issued keys count as old.
func TestVersion2PrekeysLoad(t *testing.T) {
	b := newDevice(t, "bob")
	issueAt(t, b, 0)
	pk, err := UnmarshalPrekeyStore(prekeysV2(t, b.prekeys))
	if err != nil {
		t.Fatal(err)
	}
	if pk.OneTimeCount() != b.prekeys.OneTimeCount() || pk.UnissuedOneTimeCount() != b.prekeys.UnissuedOneTimeCount() ||
		pk.CurrentSignedPrekeyID() != b.prekeys.CurrentSignedPrekeyID() {
		t.Fatal("version-2 prekey store decoded differently")
	}
	for _, k := range pk.oneTime {
		if k.issuedAt != 0 {
			t.Fatalf("one-time prekey %d of a version-2 store has issue time %d", k.id, k.issuedAt)
		}
	}
}

func timeDuration(ns int64) time.Duration { return time.Duration(ns) }
