package replicate

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// One copy from k peers (docs/protocol.md, "Joining from several peers").
//
// Cursors select what a sender offers (SSP/1 §14.1) and watermarks only
// let it skip what the origin itself vouched for (§14.2), so a node
// joining from k relays of the same history would receive it k times.
// A sender that is catching up therefore first probes: it describes the
// batch it is about to push, per origin site, and the receiver answers
// each site with a verdict:
//   - have: the events the receiver holds of that site in the range are
//     exactly the offered ones (count and digest of their (HLC, id) pairs,
//     read from its own store): the sender leaves them out;
//   - busy: another sender holds the site's lease: the sender pushes
//     nothing of the site yet and stops its push before the site's first
//     event, so its cursor stays before everything it did not deliver;
//   - send: the site is leased to this sender (a lease is granted to the
//     first sender that asks and renewed by its pushes that apply new
//     events of the site).
//
// A lease expires DefaultLeaseTTL after it was granted or last renewed by
// delivered events (a probe never renews it), and is released when its
// holder's push reaches its log's tail. A holder whose lease ended — lapsed
// or released — without delivering anything under it is banned from that
// site's lease for banPeriod: the ban is kept apart from the lease (a
// released or pruned lease takes no ban with it), bounded per holder and
// expiring, so a peer that takes leases and delivers nothing stalls a
// joiner's catch-up of a site for one TTL per ban period, not forever.
// A push that reaches its sender's tail is a live push, never a
// catch-up: it is never asked to probe, so an origin's own live writes
// never wait for a relay's lease. Nothing a peer says changes what is
// applied: verdicts only decide which sender pushes, every event still
// goes through the apply chokepoint, and "have" is the receiver's own
// reading of its store. A lying receiver only deprives itself.

// DefaultLeaseTTL is how long a site's lease lasts without delivery.
const DefaultLeaseTTL = 10 * time.Second

// maxLeases bounds the leases a receiver keeps (sites × one holder each).
// Past it a probe is answered "send" without a lease: more bytes, never a
// stall or a loss.
const maxLeases = 4096

// banPeriod is how long, in lease TTLs, a holder whose lease ended
// without delivery is refused that site's lease.
const banPeriod = 30

// maxBansPerHolder bounds one holder's bans; a holder past it is refused
// every lease until its bans expire.
const maxBansPerHolder = 64

type lease struct {
	holder string
	until  uint64 // wall clock, Unix ms
	// delivered: a push of the holder applied new events of the site
	// under this lease. A holder whose lease ended without delivering is
	// banned from the site's lease (leaseBans), so it cannot hold a site
	// by probing once per TTL or once per release.
	delivered bool
	// yielded: the lease was ended early because its holder's probe met
	// another holder's lease (decideProbe): giving way is no misconduct.
	yielded bool
}

// holderBans are one holder's bans: until when it is refused each site's
// lease, and until when every lease (its bans overflowed).
type holderBans struct {
	sites map[messages.SiteID]uint64
	all   uint64
}

// leaseBans are the receiver's bans by holder (configured sender names:
// bounded), each bounded by maxBansPerHolder and expiring.
type leaseBans map[string]*holderBans

// banned reports whether holder may not take site's lease at now.
func (b leaseBans) banned(holder string, site messages.SiteID, now uint64) bool {
	h := b[holder]
	return h != nil && (now < h.all || now < h.sites[site])
}

// ban refuses holder site's lease until until.
func (b leaseBans) ban(holder string, site messages.SiteID, now, until uint64) {
	h := b[holder]
	if h == nil {
		h = &holderBans{sites: map[messages.SiteID]uint64{}}
		b[holder] = h
	}
	if _, ok := h.sites[site]; !ok && len(h.sites) >= maxBansPerHolder {
		for s, u := range h.sites {
			if now >= u {
				delete(h.sites, s)
			}
		}
		if len(h.sites) >= maxBansPerHolder {
			// A holder banned on this many sites is refused them all.
			h.all = max(h.all, until)
			return
		}
	}
	h.sites[site] = max(h.sites[site], until)
}

// leaseState is the receiver's leases and bans (lease.go's decisions work
// on it under leaseTable's lock).
type leaseState struct {
	sites map[messages.SiteID]lease
	// done holds when each sender's push last reached its tail (by
	// configured sender name: bounded).
	done map[string]uint64
	bans leaseBans
}

func newLeaseState() leaseState {
	return leaseState{sites: map[messages.SiteID]lease{}, done: map[string]uint64{}, bans: leaseBans{}}
}

// end removes site's lease, banning its holder for a ban period when it
// delivered nothing under it and did not merely give way.
func (st *leaseState) end(site messages.SiteID, l lease, now, ttl uint64) {
	delete(st.sites, site)
	if !l.delivered && !l.yielded {
		st.bans.ban(l.holder, site, now, now+banPeriod*ttl)
	}
}

// expire ends the leases that lapsed by now.
func (st *leaseState) expire(now, ttl uint64) {
	for s, l := range st.sites {
		if now >= l.until {
			st.end(s, l, now, ttl)
		}
	}
}

// leaseTable is the receiver's lease state behind its lock.
type leaseTable struct {
	mu sync.Mutex
	leaseState
}

// decideProbe answers a probe's ranges from what the receiver holds
// (have, read from its store) and the leases. It changes leases in place
// (the caller holds their lock). probe reports whether from should keep
// probing: some range was not simply leased to it.
//
// Leases are all or nothing per probe: when any range's site is leased to
// another live holder, every range not held already is "busy" and from's
// own live leases lapse. So a holder's last probe leased it its whole
// batch and it can deliver it: two senders can never each hold a site
// the other's push must wait for (a deadlock the simulation found).
// Otherwise the free or expired sites are leased to from.
func decideProbe(st *leaseState, from string, offer []messages.OfferRange, have []bool, now, ttl uint64) (verdicts []uint64, probe bool) {
	st.expire(now, ttl)
	leases := st.sites
	verdicts = make([]uint64, len(offer))
	busy := false
	for i, o := range offer {
		l, ok := leases[o.Site]
		busy = busy || (!have[i] && ok && now < l.until && l.holder != from)
	}
	if busy {
		for i := range offer {
			verdicts[i] = messages.VerdictBusy
			if have[i] {
				verdicts[i] = messages.VerdictHave
			}
		}
		for s, l := range leases {
			if l.holder == from && now < l.until {
				l.until, l.yielded = now, true
				leases[s] = l
			}
		}
		return verdicts, true
	}
	for i, o := range offer {
		if have[i] {
			verdicts[i], probe = messages.VerdictHave, true
			continue
		}
		l, ok := leases[o.Site]
		live := ok && now < l.until
		verdicts[i] = messages.VerdictSend
		switch {
		case live && l.holder == from:
			// A probe never renews a lease (only delivery does).
		case st.bans.banned(from, o.Site, now):
			// Its last lease of the site ended undelivered: "send"
			// without a lease.
		case ok || len(leases) < maxLeases:
			leases[o.Site] = lease{holder: from, until: now + ttl}
		}
	}
	return verdicts, probe
}

// decidePushLeases updates the leases after a push from from applied:
// the holder's lease of a site renews when the push applied new events of
// it, a site nobody holds is granted to a sender still catching up, and
// a push reaching its sender's tail releases its leases (it has nothing
// more to offer) and for a TTL its later-arriving earlier pushes (several
// are in flight while catching up) take no new lease. It reports whether
// the push carried events of a site another sender holds and did not
// reach its sender's tail (the sender should probe again): a live push is
// never held back by another sender's lease.
func decidePushLeases(st *leaseState, from string, outs []messages.Outcome, atTail bool, now, ttl uint64) (probe bool) {
	st.expire(now, ttl)
	leases, done := st.sites, st.done
	fresh := map[messages.SiteID]bool{}
	for _, o := range outs {
		if o.Site == (messages.SiteID{}) {
			continue // not authenticated
		}
		if !fresh[o.Site] {
			fresh[o.Site] = o.Kind == messages.Applied
		}
	}
	for site, applied := range fresh {
		l, ok := leases[site]
		live := ok && now < l.until
		switch {
		case live && l.holder != from:
			probe = probe || !atTail
		case !applied || atTail:
		case (!ok || l.holder != from) && now < done[from]+ttl:
		case (!ok || l.holder != from) && st.bans.banned(from, site, now):
		case ok || len(leases) < maxLeases:
			leases[site] = lease{holder: from, until: now + ttl, delivered: true}
		}
	}
	if atTail {
		done[from] = now
		for s, l := range leases {
			if l.holder == from {
				st.end(s, l, now, ttl)
			}
		}
	}
	return probe
}

// handleProbe answers a probe from a configured sender: it reads what it
// holds of each range (bounded by the ranges' counts: at most one push's
// worth of index keys) and decides the verdicts. Nothing is written.
func (s *Service) handleProbe(ctx context.Context, push *messages.SyncPush) (*messages.PushResult, error) {
	have := make([]bool, len(push.Offer))
	err := s.deps.Store.View(ctx, func(tx persistence.SyncReader) error {
		held, err := tx.HeldGroups()
		if err != nil {
			return err
		}
		for i, o := range push.Offer {
			// A held event is in the log but not applied: never "have"
			// (the sender's progress would count it applied).
			if slices.ContainsFunc(held, func(g persistence.GroupKey) bool { return g.Site == o.Site }) {
				continue
			}
			if have[i], err = holdsExactly(tx, o); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.leases.mu.Lock()
	verdicts, probe := decideProbe(&s.leases.leaseState, push.From, push.Offer, have, s.deps.WallMS(), s.leaseTTLms())
	s.leases.mu.Unlock()
	s.deps.Metrics.probed(verdicts)
	return &messages.PushResult{V: messages.SyncVersion, Verdicts: verdicts, Probe: probe}, nil
}

// pushLeases runs decidePushLeases for an applied push and sets the
// result's Probe.
func (s *Service) pushLeases(push *messages.SyncPush, outs []messages.Outcome, res *messages.PushResult) {
	s.leases.mu.Lock()
	probe := decidePushLeases(&s.leases.leaseState, push.From, outs, push.Through == push.Tail, s.deps.WallMS(), s.leaseTTLms())
	s.leases.mu.Unlock()
	if probe && res != nil {
		res.Probe = true
	}
}

func (s *Service) leaseTTLms() uint64 { return uint64(s.cfg.LeaseTTL / time.Millisecond) }

// holdsExactly reports whether the events tx holds of o.Site in [From,
// To] are exactly o's: as many, with the same digest.
func holdsExactly(tx persistence.SyncReader, o messages.OfferRange) (bool, error) {
	d := newOfferDigest()
	var n uint64
	err := tx.SiteEventIDs(o.Site, o.From, o.To, func(h messages.HLC, id persistence.EventID) (bool, error) {
		n++
		if n > o.Count {
			return false, nil
		}
		d.add(h, id)
		return true, nil
	})
	return err == nil && n == o.Count && bytes.Equal(d.sum(), o.Digest), err
}

// offerDigest hashes (HLC, id) pairs in (HLC, id) order.
type offerDigest struct{ h *blake3.Hasher }

func newOfferDigest() offerDigest { return offerDigest{blake3.New()} }

func (d offerDigest) add(h messages.HLC, id persistence.EventID) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(h))
	_, _ = d.h.Write(b[:])
	_, _ = d.h.Write(id[:])
}

func (d offerDigest) sum() []byte { return d.h.Sum(nil)[:messages.OfferDigestSize] }

// offered is one event of a batch as the offer describes it.
type offered struct {
	seq  uint64
	site messages.SiteID
	hlc  messages.HLC
	id   persistence.EventID
}

// offerOf describes the events per origin site, sorted by site; nil when
// there are none or more sites than a probe may name.
func offerOf(evs []offered) []messages.OfferRange {
	if len(evs) == 0 {
		return nil
	}
	byKey := slices.Clone(evs)
	slices.SortFunc(byKey, func(a, b offered) int {
		return cmp.Or(bytes.Compare(a.site[:], b.site[:]), cmp.Compare(a.hlc, b.hlc), bytes.Compare(a.id[:], b.id[:]))
	})
	var out []messages.OfferRange
	for i := 0; i < len(byKey); {
		j := i
		d := newOfferDigest()
		for ; j < len(byKey) && byKey[j].site == byKey[i].site; j++ {
			d.add(byKey[j].hlc, byKey[j].id)
		}
		if len(out) == messages.MaxOfferRanges {
			return nil
		}
		out = append(out, messages.OfferRange{Site: byKey[i].site, From: byKey[i].hlc, To: byKey[j-1].hlc, Count: uint64(j - i), Digest: d.sum()})
		i = j
	}
	return out
}
