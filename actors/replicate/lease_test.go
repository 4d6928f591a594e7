package replicate

import (
	"context"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var siteB = messages.SiteID{0xb}

func rng(site messages.SiteID) messages.OfferRange {
	return messages.OfferRange{Site: site, From: 1, To: 9, Count: 3, Digest: make([]byte, messages.OfferDigestSize)}
}

// The probe decision, step by step: first come gets the lease, others
// are busy while it lives, "have" needs no lease, a probe never renews,
// delivery does, a lapsed lease that delivered nothing is not granted to
// its holder again, and a push at its sender's tail releases its leases.
func TestDecideProbeLeases(t *testing.T) {
	const ttl = 1000
	leases := map[messages.SiteID]lease{}
	done := map[string]uint64{}
	probe := func(from string, now uint64, have []bool, sites ...messages.SiteID) ([]uint64, bool) {
		var offer []messages.OfferRange
		for _, s := range sites {
			offer = append(offer, rng(s))
		}
		if have == nil {
			have = make([]bool, len(sites))
		}
		return decideProbe(leases, from, offer, have, now, ttl)
	}
	expect := func(step string, got []uint64, gotProbe bool, wantProbe bool, want ...uint64) {
		t.Helper()
		if !slices.Equal(got, want) || gotProbe != wantProbe {
			t.Fatalf("%s: verdicts %v probe %v, want %v probe %v", step, got, gotProbe, want, wantProbe)
		}
	}
	v, p := probe("a", 0, nil, siteA, siteB)
	expect("a first", v, p, false, messages.VerdictSend, messages.VerdictSend)
	v, p = probe("b", 10, []bool{false, true}, siteA, siteB)
	expect("b while a holds both", v, p, true, messages.VerdictBusy, messages.VerdictHave)
	v, p = probe("a", 900, nil, siteA)
	expect("a again", v, p, false, messages.VerdictSend)
	if leases[siteA].until != ttl {
		t.Fatalf("a probe renewed the lease: until %d", leases[siteA].until)
	}
	// a delivers siteB's events: renewed; siteA's lapse undelivered.
	if decidePushLeases(leases, done, "a", []messages.Outcome{{Kind: messages.Applied, Site: siteB}}, false, 950, ttl) {
		t.Fatal("a's own push asked to probe")
	}
	v, p = probe("a", 1000, nil, siteA, siteB)
	expect("a after siteA lapsed", v, p, false, messages.VerdictSend, messages.VerdictSend)
	if l := leases[siteA]; l.holder != "a" || l.until != ttl {
		t.Fatalf("a lapsed lease without delivery was granted again: %+v", l)
	}
	v, p = probe("b", 1001, nil, siteA, siteB)
	expect("b while a holds siteB", v, p, true, messages.VerdictBusy, messages.VerdictBusy)
	if leases[siteA].holder != "a" {
		t.Fatalf("a busy probe took a lease: %+v", leases[siteA])
	}
	v, p = probe("b", 1001, nil, siteA)
	expect("b for siteA alone", v, p, false, messages.VerdictSend)
	if leases[siteA].holder != "b" {
		t.Fatalf("siteA's lease: %+v", leases[siteA])
	}
	// a pushes siteA's events meanwhile: told to probe; b's lease stays.
	if !decidePushLeases(leases, done, "a", []messages.Outcome{{Kind: messages.Duplicate, Site: siteA}}, false, 1002, ttl) || leases[siteA].holder != "b" {
		t.Fatalf("a's push of b's site: %+v", leases[siteA])
	}
	// a probes siteB (its own) and siteA (b's): all busy, and a's siteB
	// lease lapses now, so b, which needs both, is never left waiting
	// for a sender that itself waits.
	v, p = probe("a", 1003, nil, siteB, siteA)
	expect("a for b's site", v, p, true, messages.VerdictBusy, messages.VerdictBusy)
	if l := leases[siteB]; l.holder != "a" || l.until != 1003 {
		t.Fatalf("a's lease after a busy probe: %+v", l)
	}
	v, p = probe("b", 1004, nil, siteA, siteB)
	expect("b after a's lease lapsed", v, p, false, messages.VerdictSend, messages.VerdictSend)
	if leases[siteB].holder != "b" {
		t.Fatalf("siteB's lease: %+v", leases[siteB])
	}
	// b delivers siteB under its lease; a lease that delivered and
	// lapsed may go back to its holder.
	decidePushLeases(leases, done, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteB}}, false, 1950, ttl)
	v, p = probe("b", 1950+ttl, nil, siteB)
	expect("b after its delivered lease lapsed", v, p, false, messages.VerdictSend)
	if leases[siteB].until != 1950+2*ttl {
		t.Fatalf("siteB's lease: %+v", leases[siteB])
	}
	// b reaches its tail: its leases go.
	decidePushLeases(leases, done, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, true, 1950+ttl, ttl)
	if _, ok := leases[siteB]; ok {
		t.Fatalf("b's lease kept after its push reached its tail: %+v", leases[siteA])
	}
	// b's earlier push arriving after the one at its tail takes no lease
	// for a TTL; after that it may again.
	decidePushLeases(leases, done, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, false, 1951+ttl, ttl)
	if _, ok := leases[siteA]; ok {
		t.Fatalf("a late push after the tail took a lease: %+v", leases[siteA])
	}
	decidePushLeases(leases, done, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, false, 1950+2*ttl, ttl)
	if leases[siteA].holder != "b" {
		t.Fatalf("a push a TTL after the tail took no lease: %+v", leases[siteA])
	}
	// Unauthenticated drops name no site: no lease for the zero site.
	decidePushLeases(leases, done, "c", []messages.Outcome{{Kind: messages.Dropped}}, false, 1100, ttl)
	if _, ok := leases[messages.SiteID{}]; ok {
		t.Fatal("a lease for an unauthenticated drop")
	}
}

// The lease table is bounded: past maxLeases, expired leases are pruned,
// and with none expired a probe is answered "send" without a lease.
func TestLeasesAtAndPastTheBound(t *testing.T) {
	leases := map[messages.SiteID]lease{}
	for i := 0; i < maxLeases; i++ {
		var s messages.SiteID
		s[0], s[1] = byte(i), byte(i>>8)
		s[2] = 1
		leases[s] = lease{holder: "a", until: 100}
	}
	v, _ := decideProbe(leases, "b", []messages.OfferRange{rng(siteA)}, []bool{false}, 50, 1000)
	if v[0] != messages.VerdictSend || len(leases) != maxLeases {
		t.Fatalf("at the bound: verdict %v, %d leases", v, len(leases))
	}
	if _, ok := leases[siteA]; ok {
		t.Fatal("a lease past the bound")
	}
	v, _ = decideProbe(leases, "b", []messages.OfferRange{rng(siteA)}, []bool{false}, 200, 1000)
	if v[0] != messages.VerdictSend || len(leases) != 1 || leases[siteA].holder != "b" {
		t.Fatalf("expired leases not pruned: %d leases", len(leases))
	}
}

// "have" is the receiver's own reading of its store: exactly the offered
// events (count and digest) of the site in the range, nothing more or
// less, and never while a group of the site is held.
func TestProbeHaveIsExactlyWhatTheStoreHolds(t *testing.T) {
	st := newStore(t)
	ev := func(seq uint64, site messages.SiteID, h messages.HLC) persistence.StoredEvent {
		var id persistence.EventID
		id[0], id[1], id[2] = byte(seq), site[0], byte(h)
		return persistence.StoredEvent{ID: id, Site: site, HLC: h, Schema: "app", Table: "t", RowKey: []byte{byte(seq)}, Raw: []byte{1}}
	}
	held := []persistence.StoredEvent{ev(1, siteA, 5), ev(2, siteA, 6), ev(3, siteB, 6), ev(4, siteA, 8)}
	if err := st.Update(context.Background(), func(tx persistence.SyncTx) error {
		for _, e := range held {
			if _, err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	offer := func(evs ...persistence.StoredEvent) messages.OfferRange {
		var os []offered
		for _, e := range evs {
			os = append(os, offered{seq: e.Seq, site: e.Site, hlc: e.HLC, id: e.ID})
		}
		return offerOf(os)[0]
	}
	wide := offer(held[0], held[1])
	wide.To = 8 // the store holds a third event of siteA in [5, 8]
	other := offer(held[0], ev(9, siteA, 6))
	cases := []struct {
		name string
		o    messages.OfferRange
		want bool
	}{
		{"exactly", offer(held[0], held[1], held[3]), true},
		{"a prefix of the range", offer(held[0], held[1]), true},
		{"fewer than held in the range", wide, false},
		{"another event at a held HLC", other, false},
		{"more than held", offer(held[0], held[1], held[3], ev(10, siteA, 9)), false},
		{"other site", offer(held[2]), true},
	}
	s := &Service{deps: testDeps(), leases: leaseTable{sites: map[messages.SiteID]lease{}, done: map[string]uint64{}}, cfg: Config{LeaseTTL: DefaultLeaseTTL}}
	s.deps.Store = st
	for _, c := range cases {
		res, err := s.handleProbe(context.Background(), &messages.SyncPush{V: messages.SyncVersion, From: "x", Log: logA, Offer: []messages.OfferRange{c.o}})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Verdicts[0] == messages.VerdictHave; got != c.want {
			t.Errorf("%s: have = %v, want %v", c.name, got, c.want)
		}
	}
	// A held group of siteA: nothing of siteA is "have".
	if err := st.Update(context.Background(), func(tx persistence.SyncTx) error {
		e := ev(11, siteA, 20)
		e.Table = "missing"
		seq, err := tx.AppendEvent(e)
		if err != nil {
			return err
		}
		return tx.HoldEvent(persistence.GroupKey{Site: siteA, Schema: "app", Table: "missing"}, seq)
	}); err != nil {
		t.Fatal(err)
	}
	res, err := s.handleProbe(context.Background(), &messages.SyncPush{V: messages.SyncVersion, From: "x", Log: logA, Offer: []messages.OfferRange{offer(held[0], held[1], held[3])}})
	if err != nil || res.Verdicts[0] == messages.VerdictHave {
		t.Fatalf("have while a group of the site is held: %+v, %v", res, err)
	}
}
