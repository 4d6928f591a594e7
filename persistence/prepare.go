package persistence

import (
	"math/bits"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// PreparedEvent is an event's pure storage work, done before the write
// transaction that appends it (SyncStore.PrepareEvents): its share of the
// range sums — the LtHash16 of its reconciliation key, summed with the
// other events of one preparation that share its table and site — and its
// bytes sealed at rest when the store seals. Neither depends on the
// store's state, so the apply path prepares events on its parallel
// verifiers and the store's single writer only uses the results: it adds
// one prepared sum for the whole group instead of expanding every key
// (PreparedSums).
//
// A store uses a preparation only for the bytes, id and sealer it was
// made for, and does the work itself otherwise: a stale or foreign
// preparation costs time, never a wrong record or sum.
type PreparedEvent struct {
	raw    []byte
	id     EventID
	hlc    messages.HLC
	group  *preparedGroup
	member int // this event's index in group.keys
	sealer Sealer
	sealed []byte
}

// preparedGroup is the prepared range-sum share of events of one (table,
// site): their keys and the sum of their expansions.
type preparedGroup struct {
	tk   TableKey
	site messages.SiteID
	keys []messages.ReconcileKey
	sum  lthash.Sum
}

// MaxPreparedEvents bounds the preparations of a process not released yet
// (at most a 2 KiB sum and the sealed bytes per event, far less when
// events share a table and site): past it PrepareEvents leaves events
// unprepared and the store does the work in its transaction, so however
// many events peers have in flight, preparing them holds bounded memory.
const MaxPreparedEvents = 1 << 14

// outstanding counts the preparations not released.
var outstanding atomic.Int64

// scratch holds one expansion while it is added to a group's sum.
var scratch = sync.Pool{New: func() any { return new(lthash.Element) }}

// PrepareEvents does the pure storage work of evs for a store sealing
// with sealer (nil: none) and records it in each event's Prepared; past
// MaxPreparedEvents it leaves the rest unprepared. A failed seal leaves
// the sealing to AppendEvent, which reports the error. Whoever holds an
// event releases its preparation (PreparedEvent.Release) once no
// transaction can append it any more.
func PrepareEvents(evs []*StoredEvent, sealer Sealer) {
	if sealer != nil && !reflect.TypeOf(sealer).Comparable() {
		sealer = nil // Sealed compares it; the store seals such events itself
	}
	// Within the budget: the first n events.
	n := len(evs)
	if over := outstanding.Add(int64(n)) - MaxPreparedEvents; over > 0 {
		outstanding.Add(-min(over, int64(n)))
		n = max(0, n-int(over))
	}
	if n == 0 {
		return
	}
	evs = evs[:n]
	// The groups (few: the events of one verified batch) and each event's,
	// then one allocation for the groups, one for their keys (each group's
	// a contiguous part) and one for the preparations: allocating them one
	// by one cost more than the hashing.
	var gkeys []groupKey
	gi := make([]int32, n)
	var sizes []int
	for i, ev := range evs {
		k := groupKey{TableKey{Schema: ev.Schema, Table: ev.Table}, ev.Site}
		j := slices.Index(gkeys, k)
		if j < 0 {
			j = len(gkeys)
			gkeys = append(gkeys, k)
			sizes = append(sizes, 0)
		}
		gi[i] = int32(j)
		sizes[j]++
	}
	groups := make([]preparedGroup, len(gkeys))
	keys := make([]messages.ReconcileKey, n)
	off := 0
	for j, k := range gkeys {
		groups[j] = preparedGroup{tk: k.tk, site: k.site, keys: keys[off : off : off+sizes[j]]}
		off += sizes[j]
	}
	ps := make([]PreparedEvent, n)
	x := scratch.Get().(*lthash.Element)
	defer scratch.Put(x)
	for i, ev := range evs {
		g := &groups[gi[i]]
		p := &ps[i]
		*p = PreparedEvent{raw: ev.Raw, id: ev.ID, hlc: ev.HLC, group: g, member: len(g.keys)}
		g.keys = append(g.keys, messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID))
		x.Expand(g.keys[p.member][:])
		g.sum.AddElement(x)
		if sealer != nil {
			// The identity as a slice of the preparation (already on the
			// heap), not of a copy of the id: passed to an interface, that
			// copy escaped, one allocation per event.
			if sealed, err := sealer.Seal(RecordEvent, p.id[:], ev.Raw); err == nil {
				p.sealer, p.sealed = sealer, sealed
			}
		}
		ev.Prepared = p
	}
}

// groupKey names a prepared group.
type groupKey struct {
	tk   TableKey
	site messages.SiteID
}

// For reports whether p was prepared for ev (its very bytes, not only
// equal ones: a caller cannot change them in place unnoticed), and so is
// what a store uses when it appends ev.
func (p *PreparedEvent) For(ev *StoredEvent) bool {
	// The key's parts (site, HLC, id) and the sum's (table, site): what
	// the prepared share was computed from.
	return p != nil && p.group != nil && p.id == ev.ID && p.hlc == ev.HLC && len(p.raw) == len(ev.Raw) &&
		(len(p.raw) == 0 || &p.raw[0] == &ev.Raw[0]) &&
		p.group.site == ev.Site && p.group.tk.Schema == ev.Schema && p.group.tk.Table == ev.Table
}

// Sealed returns ev's bytes sealed by sealer as RecordEvent, prepared for
// ev, or nil (the store seals them itself).
func (p *PreparedEvent) Sealed(ev *StoredEvent, sealer Sealer) []byte {
	if sealer == nil || !p.For(ev) || p.sealer != sealer {
		return nil
	}
	return p.sealed
}

// Release ends the preparation (its memory is the garbage collector's
// once nothing refers to it); call it once no transaction can append the
// event any more. A second call does nothing; p is unusable after.
func (p *PreparedEvent) Release() {
	if p == nil || p.group == nil {
		return
	}
	*p = PreparedEvent{}
	outstanding.Add(-1)
}

// PreparedOutstanding returns how many preparations of this process are
// not released (for tests and diagnostics).
func PreparedOutstanding() int64 { return outstanding.Load() }

// PreparedSums is one write transaction's account of the appended events
// whose range-sum share was prepared: AppendEvent hands each event to
// Append, and before the transaction's sums are read or written the store
// calls Resolve, which gives each prepared group's share once — the
// prepared sum when every event of the group was appended, else that sum
// less the expansions of the members not appended, or the expansions of
// those appended, whichever is fewer. The zero value is ready; it belongs
// to one transaction.
type PreparedSums struct {
	appended map[*preparedGroup][]uint64 // a bit per member appended
}

// Append reports whether ev's key is accounted for by its prepared group
// (Resolve adds it); when false the store adds ev's key to its sum itself.
// It is called once per appended event (a store refuses a second append of
// one event: ErrDuplicate).
func (s *PreparedSums) Append(ev *StoredEvent) bool {
	p := ev.Prepared
	if !p.For(ev) {
		return false
	}
	if s.appended == nil {
		s.appended = map[*preparedGroup][]uint64{}
	}
	in := s.appended[p.group]
	if in == nil {
		in = make([]uint64, (len(p.group.keys)+63)/64) // one word for a verified batch
		s.appended[p.group] = in
	}
	in[p.member/64] |= 1 << (p.member % 64)
	return true
}

// Resolve calls add with the share of every group appended to since the
// last Resolve: the (table, site), the number of its events appended and
// the sum of their keys' expansions.
func (s *PreparedSums) Resolve(add func(tk TableKey, site messages.SiteID, count int64, sum *lthash.Sum)) {
	if len(s.appended) == 0 {
		return
	}
	x := scratch.Get().(*lthash.Element)
	defer scratch.Put(x)
	for g, in := range s.appended {
		n := 0
		for _, w := range in {
			n += bits.OnesCount64(w)
		}
		if n == len(g.keys) {
			add(g.tk, g.site, int64(n), &g.sum)
			continue
		}
		appended := func(m int) bool { return in[m/64]&(1<<(m%64)) != 0 }
		var sum lthash.Sum
		if 2*n >= len(g.keys) {
			sum = g.sum
			for m, k := range g.keys {
				if !appended(m) {
					x.Expand(k[:])
					sum.RemoveElement(x)
				}
			}
		} else {
			for m, k := range g.keys {
				if appended(m) {
					x.Expand(k[:])
					sum.AddElement(x)
				}
			}
		}
		add(g.tk, g.site, int64(n), &sum)
	}
	s.appended = nil // a copy of s (a store's copied state) shares no map
}
