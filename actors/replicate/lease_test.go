package replicate

import (
	"context"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

var (
	siteB = messages.SiteID{0xb}
	siteC = messages.SiteID{0xc}
)

func rng(site messages.SiteID) messages.OfferRange {
	return messages.OfferRange{Site: site, From: 1, To: 9, Count: 3, Digest: make([]byte, messages.OfferDigestSize)}
}

// The probe decision, step by step: first come gets the lease, others
// are busy while it lives, "have" needs no lease, a probe never renews,
// delivery does, a lapsed lease that delivered nothing is not granted to
// its holder again, and a push at its sender's tail releases its leases.
func TestDecideProbeLeases(t *testing.T) {
	const ttl = 1000
	st := newLeaseState()
	leases := st.sites
	probe := func(from string, now uint64, have []bool, sites ...messages.SiteID) ([]uint64, bool) {
		var offer []messages.OfferRange
		for _, s := range sites {
			offer = append(offer, rng(s))
		}
		if have == nil {
			have = make([]bool, len(sites))
		}
		return decideProbe(&st, from, offer, have, now, ttl)
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
	if decidePushLeases(&st, "a", []messages.Outcome{{Kind: messages.Applied, Site: siteB}}, false, 950, ttl) {
		t.Fatal("a's own push asked to probe")
	}
	v, p = probe("a", 1000, nil, siteA, siteB)
	expect("a after siteA lapsed", v, p, false, messages.VerdictSend, messages.VerdictSend)
	if l, ok := leases[siteA]; ok {
		t.Fatalf("a lapsed lease without delivery was granted again: %+v", l)
	}
	v, p = probe("b", 1001, nil, siteA, siteB)
	expect("b while a holds siteB", v, p, true, messages.VerdictBusy, messages.VerdictBusy)
	if l, ok := leases[siteA]; ok {
		t.Fatalf("a busy probe took a lease: %+v", l)
	}
	v, p = probe("b", 1001, nil, siteA)
	expect("b for siteA alone", v, p, false, messages.VerdictSend)
	if leases[siteA].holder != "b" {
		t.Fatalf("siteA's lease: %+v", leases[siteA])
	}
	// a pushes siteA's events meanwhile: told to probe; b's lease stays.
	if !decidePushLeases(&st, "a", []messages.Outcome{{Kind: messages.Duplicate, Site: siteA}}, false, 1002, ttl) || leases[siteA].holder != "b" {
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
	decidePushLeases(&st, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteB}}, false, 1950, ttl)
	v, p = probe("b", 1950+ttl, nil, siteB)
	expect("b after its delivered lease lapsed", v, p, false, messages.VerdictSend)
	if leases[siteB].until != 1950+2*ttl {
		t.Fatalf("siteB's lease: %+v", leases[siteB])
	}
	// b reaches its tail: its leases go. (b's siteA lease lapsed
	// undelivered: b is banned from it; siteC is new.)
	decidePushLeases(&st, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteC}}, true, 1950+ttl, ttl)
	if _, ok := leases[siteB]; ok {
		t.Fatalf("b's lease kept after its push reached its tail: %+v", leases[siteB])
	}
	// b's earlier push arriving after the one at its tail takes no lease
	// for a TTL; after that it may again.
	decidePushLeases(&st, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteC}}, false, 1951+ttl, ttl)
	if _, ok := leases[siteC]; ok {
		t.Fatalf("a late push after the tail took a lease: %+v", leases[siteC])
	}
	decidePushLeases(&st, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteC}}, false, 1950+2*ttl, ttl)
	if leases[siteC].holder != "b" {
		t.Fatalf("a push a TTL after the tail took no lease: %+v", leases[siteC])
	}
	decidePushLeases(&st, "b", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, false, 1950+2*ttl, ttl)
	if l, ok := leases[siteA]; ok {
		t.Fatalf("b took the lease it is banned from by delivering: %+v", l)
	}
	// Unauthenticated drops name no site: no lease for the zero site.
	decidePushLeases(&st, "c", []messages.Outcome{{Kind: messages.Dropped}}, false, 1100, ttl)
	if _, ok := leases[messages.SiteID{}]; ok {
		t.Fatal("a lease for an unauthenticated drop")
	}
}

// The lease table is bounded: past maxLeases, expired leases are pruned,
// and with none expired a probe is answered "send" without a lease.
func TestLeasesAtAndPastTheBound(t *testing.T) {
	st := newLeaseState()
	leases := st.sites
	for i := 0; i < maxLeases; i++ {
		var s messages.SiteID
		s[0], s[1] = byte(i), byte(i>>8)
		s[2] = 1
		leases[s] = lease{holder: "a", until: 100}
	}
	v, _ := decideProbe(&st, "b", []messages.OfferRange{rng(siteA)}, []bool{false}, 50, 1000)
	if v[0] != messages.VerdictSend || len(leases) != maxLeases {
		t.Fatalf("at the bound: verdict %v, %d leases", v, len(leases))
	}
	if _, ok := leases[siteA]; ok {
		t.Fatal("a lease past the bound")
	}
	v, _ = decideProbe(&st, "b", []messages.OfferRange{rng(siteA)}, []bool{false}, 200, 1000)
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
	s := &Service{deps: testDeps(), leases: leaseTable{leaseState: newLeaseState()}, cfg: Config{LeaseTTL: DefaultLeaseTTL}}
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

// A probe that takes an origin site's lease and releases it without
// delivering, over and over, must not keep the site: the ban is kept
// apart from the lease, so the release does not lift it, and another
// sender gets the lease.
func TestAttackLeaseRetakenAfterReleaseIsBanned(t *testing.T) {
	const ttl = 1000
	st := newLeaseState()
	v, _ := decideProbe(&st, "m", []messages.OfferRange{rng(siteA)}, []bool{false}, 0, ttl)
	if v[0] != messages.VerdictSend || st.sites[siteA].holder != "m" {
		t.Fatalf("first probe: %v %+v", v, st.sites[siteA])
	}
	// m's push reaches its tail delivering nothing: the lease goes.
	decidePushLeases(&st, "m", nil, true, 10, ttl)
	for round := uint64(0); round < 5; round++ {
		now := 20 + round*3*ttl
		decideProbe(&st, "m", []messages.OfferRange{rng(siteA)}, []bool{false}, now, ttl)
		if l, ok := st.sites[siteA]; ok && l.holder == "m" {
			t.Fatalf("round %d: m re-took the lease it released undelivered: %+v", round, l)
		}
		v, _ = decideProbe(&st, "r", []messages.OfferRange{rng(siteA)}, []bool{false}, now+1, ttl)
		if v[0] != messages.VerdictSend {
			t.Fatalf("round %d: an honest sender's probe answered %v", round, v)
		}
		// r delivers and reaches its tail.
		decidePushLeases(&st, "r", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, true, now+2, ttl)
	}
	// The ban expires: m may take the lease again after banPeriod TTLs.
	decideProbe(&st, "m", []messages.OfferRange{rng(siteA)}, []bool{false}, 10+banPeriod*ttl, ttl)
	if st.sites[siteA].holder != "m" {
		t.Fatalf("the ban did not expire: %+v", st.sites[siteA])
	}
}

// An origin's own live pushes (each reaching its log's tail) are never
// asked to probe, whoever holds its site's lease: a relay's lease cannot
// make them wait.
func TestAttackRelayLeaseNeverDelaysLivePushes(t *testing.T) {
	const ttl = 1000
	st := newLeaseState()
	decideProbe(&st, "relay", []messages.OfferRange{rng(siteA)}, []bool{false}, 0, ttl)
	if st.sites[siteA].holder != "relay" {
		t.Fatal("setup: the relay holds no lease")
	}
	if decidePushLeases(&st, "origin", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, true, 5, ttl) {
		t.Fatal("the origin's live push was asked to probe behind a relay's lease")
	}
	// A catch-up push (not at its tail) still defers to the holder.
	if !decidePushLeases(&st, "origin", []messages.Outcome{{Kind: messages.Applied, Site: siteA}}, false, 6, ttl) {
		t.Fatal("a catch-up push was not asked to probe")
	}
}

// Bans are bounded per holder: past maxBansPerHolder sites, the holder is
// refused every lease until its bans expire; nothing grows further.
func TestLeaseBansAtAndPastTheBound(t *testing.T) {
	b := leaseBans{}
	site := func(i int) messages.SiteID { return messages.SiteID{byte(i), byte(i >> 8), 7} }
	for i := 0; i < maxBansPerHolder; i++ {
		b.ban("m", site(i), 0, 5000)
	}
	if len(b["m"].sites) != maxBansPerHolder || b.banned("m", site(maxBansPerHolder), 1) {
		t.Fatalf("at the bound: %d bans, all-ban %d", len(b["m"].sites), b["m"].all)
	}
	b.ban("m", site(maxBansPerHolder), 1, 6000)
	if len(b["m"].sites) != maxBansPerHolder || !b.banned("m", site(maxBansPerHolder+1), 2) {
		t.Fatalf("past the bound: %d bans, all-ban %d", len(b["m"].sites), b["m"].all)
	}
	if b.banned("m", site(0), 6000) || b.banned("other", site(0), 2) {
		t.Fatal("bans did not expire, or reached another holder")
	}
	// Expired bans make room again.
	b.ban("m", site(maxBansPerHolder+2), 7000, 9000)
	if len(b["m"].sites) != 1 {
		t.Fatalf("expired bans kept: %d", len(b["m"].sites))
	}
}
