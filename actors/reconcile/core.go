// Package reconcile finds which events two peers hold that the other
// lacks: range-based set reconciliation (Meyer, "Range-Based Set
// Reconciliation"; the Negentropy protocol) over the retained events of
// each table, ordered by (site, HLC, id).
//
// The core is pure: a Session (the initiator) and Respond (the responder,
// stateless) map (local set view, incoming message) to (outgoing message,
// keys the peer lacks, keys we lack). Running the effects — loading sets
// from the store, sending, fetching and applying events — is the runtime's
// job. Reconciliation never reads or moves a cursor or a watermark (SSP/1
// §14.1): what it finds goes to the apply chokepoint (§12) like any push.
//
// # Fingerprints
//
// A range's fingerprint is the first 16 bytes of SHA-256 over a domain
// tag, the item count and the items' keys in order. A hostile peer that
// can sign events (a holder of a trusted key) chooses event ids freely, so
// an additive hash of the ids (sum mod 2^256, as in Negentropy) would let
// it build, with Wagner's k-list algorithm, two different sets of its own
// events with equal sums and counts, hand one to each of two honest nodes
// and hide the difference from their reconciliation for good. Finding two
// different key sequences with equal fingerprints here is a collision of
// SHA-256 truncated to 128 bits: about 2^64 work, and the attacker must
// sign every candidate. The price is a pass over the range's keys (56
// bytes each, ~1 GB/s here).
//
// The first round of a group is the exception that makes agreement cheap
// (RangeSum, wire version 2): a fingerprint of the whole group computed
// from the count and the LtHash16 sum of its keys (crypto/lthash), which
// the stores keep per (table, site) in the transaction that changes the
// events. LtHash16 is additive too, but over 1 024 words of 16 bits, where
// Wagner's algorithm is out of reach (the lattice problem behind it is
// estimated at more than 200 bits); the fingerprint is SHA-256 over a
// domain tag, the count and the 2 048-byte sum, so a collision needs
// either a colliding LtHash16 pair or a 128-bit SHA-256 collision. Only
// when the sums differ are the keys loaded and split as above; see
// docs/reconciliation.md.
package reconcile

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// Key is one item: site | HLC | event id.
type Key = messages.ReconcileKey

// Group names a table being reconciled.
type Group struct{ Schema, Table string }

func (g Group) String() string { return g.Schema + "." + g.Table }

// Tuning of the splitting. Four sub-ranges per split cost about as many
// bytes per bit of the key space as two (four fingerprints per two
// levels) in half the round trips; sixteen would cost twice the bytes.
const (
	// Branch is how many sub-ranges a differing range is split into.
	Branch = 4
	// LeafMax is the largest range sent as a list of keys instead of a
	// fingerprint.
	LeafMax = 6
	// MaxRounds bounds the rounds of one session: a peer that never
	// agrees cannot keep the initiator busy forever.
	MaxRounds = 256
	// MaxFound bounds the keys one session collects in each direction;
	// a session that reaches it stops early (Truncated) and the next one
	// continues.
	MaxFound = 1 << 16
	// WorkPerKey and WorkBase bound the initiator's work in one session:
	// the keys it fingerprints, lists or compares may not exceed
	// WorkPerKey times the keys of the sets it loaded, plus WorkBase. An
	// honest session splits only the ranges that differ, so each level
	// of the split passes over the set at most once, and a session
	// reaches the leaves of MaxFound differences in ⌈log₄(MaxFound)⌉ + 2
	// levels: fewer than WorkPerKey passes. A responder that answers
	// every range with a fingerprint that never agrees would otherwise
	// make the initiator pass over its whole set every round for
	// MaxRounds rounds.
	WorkPerKey = 12
	WorkBase   = 1 << 16
	// SumFrom is the smallest range (in keys per signing site,
	// exclusive) that version 3 fingerprints from its range sum rather
	// than by hashing its keys: expanding a key for LtHash16 costs about
	// as much as SHA-256 over ExpandWeight keys, and a range sum expands
	// about half a leaf (LeafKeys/2) of keys per site at each end, so
	// hashing is cheaper below ExpandWeight·LeafKeys keys a site.
	SumFrom = ExpandWeight * LeafKeys
	// ExpandWeight is what one LtHash16 expansion is charged, in keys
	// hashed (measured: ~1.4 µs against ~20 ns).
	ExpandWeight = 64
)

// Limiter is implemented by a Source that bounds what a peer can make it
// do. Without it, bounds are not checked against a clock and work is
// not metered (tests).
type Limiter interface {
	// Ceiling is the highest bound the node accepts: its clock plus the
	// skew bound (SSP/1 §12). The node holds no event above it, so a
	// higher bound names nothing it could compare.
	Ceiling() messages.HLC
	// Charge is called before the node fingerprints, lists or compares
	// n keys for the peer; an error (the peer's budget is spent) ends
	// the request with that error.
	Charge(n int) error
}

// ceiling returns src's Ceiling, or the highest HLC without a Limiter.
func ceiling(src Source) messages.HLC {
	if l, ok := src.(Limiter); ok {
		return l.Ceiling()
	}
	return messages.HLC(^uint64(0))
}

// charge meters n keys of work for the peer: against src's Limiter and,
// on the initiator, against the session's budget (w).
func charge(src Source, w *work, n int) error {
	if w != nil {
		w.spent += n
		if w.spent > w.allowed {
			return fmt.Errorf("%w: %w: %d keys of work, budget %d", ErrProtocol, ErrOverBudget, w.spent, w.allowed)
		}
	}
	if l, ok := src.(Limiter); ok {
		return l.Charge(n)
	}
	return nil
}

// sumFrom is SumFrom; tests lower it (on both sides: it is part of the
// protocol) to reach range sums with small sets.
var sumFrom = SumFrom

// expandWeight is ExpandWeight; tests that lower sumFrom lower it too
// (the weight is only the node's own accounting).
var expandWeight = ExpandWeight

// work is an initiator session's work budget (WorkPerKey, WorkBase).
type work struct{ spent, allowed int }

func protocolErr(g Group, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrProtocol, g, fmt.Sprintf(format, args...))
}

// Set is a sorted view of one group's keys.
type Set struct{ keys []Key }

// NewSet returns the set of keys (sorted and deduplicated; keys is reused).
func NewSet(keys []Key) *Set {
	slices.SortFunc(keys, func(a, b Key) int { return bytes.Compare(a[:], b[:]) })
	keys = slices.Compact(keys)
	return &Set{keys: keys}
}

// Len returns the number of keys.
func (s *Set) Len() int { return len(s.keys) }

// Keys returns the keys in order (shared: do not modify).
func (s *Set) Keys() []Key { return s.keys }

// Has reports whether k is in the set.
func (s *Set) Has(k Key) bool {
	_, ok := slices.BinarySearchFunc(s.keys, k, func(a, b Key) int { return bytes.Compare(a[:], b[:]) })
	return ok
}

// span returns the keys in [lower, upper) (upper nil: +∞).
func (s *Set) span(lower, upper []byte) []Key {
	i := sort.Search(len(s.keys), func(i int) bool { return bytes.Compare(s.keys[i][:], lower) >= 0 })
	j := len(s.keys)
	if upper != nil {
		j = i + sort.Search(len(s.keys)-i, func(x int) bool { return bytes.Compare(s.keys[i+x][:], upper) >= 0 })
	}
	return s.keys[i:j]
}

var fpDomain = []byte("syncmesh/reconcile/fp/v1")

// Fingerprint returns the fingerprint of a sorted run of keys.
func Fingerprint(keys []Key) [messages.FingerprintSize]byte {
	h := sha256.New()
	h.Write(fpDomain)
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(keys)))])
	for i := range keys {
		h.Write(keys[i][:])
	}
	var out [messages.FingerprintSize]byte
	copy(out[:], h.Sum(nil))
	return out
}

var sumDomain = []byte("syncmesh/reconcile/sum/v1")

// SumFingerprint returns the fingerprint of a whole group from its range
// sum: the number of keys and their LtHash16.
func SumFingerprint(count uint64, sum *lthash.Sum) [messages.FingerprintSize]byte {
	var b [len("syncmesh/reconcile/sum/v1") + binary.MaxVarintLen64 + lthash.Size]byte
	buf := append(b[:0], sumDomain...)
	buf = binary.AppendUvarint(buf, count)
	buf = sum.AppendBinary(buf)
	d := sha256.Sum256(buf)
	var out [messages.FingerprintSize]byte
	copy(out[:], d[:])
	return out
}

// View is one group's keys from a bound up, in key order: what a round
// compares. A Set is one (a sorted slice); an Index gives one whose range
// sums cost O(sites · log n) instead of a pass over the range. A view
// may change between two calls (the runtime's index catches up for
// another session): what must agree is read in one call, or a change is
// tolerated (split's cuts), at the price of a round.
type View interface {
	// Len returns the number of keys.
	Len() int
	// Count returns the number of keys in [lower, upper) (upper nil: +∞).
	Count(lower, upper []byte) int
	// Sites returns the number of signing sites of the keys in [lower,
	// upper).
	Sites(lower, upper []byte) int
	// List returns the keys in [lower, upper), in a slice the caller owns.
	List(lower, upper []byte) []Key
	// At returns the i-th key (from 0) in [lower, upper).
	At(lower, upper []byte, i int) Key
	// RangeSum returns the count and LtHash16 of the keys in [lower,
	// upper), and its cost in keys expanded (or runs visited).
	RangeSum(lower, upper []byte) (count uint64, sum lthash.Sum, cost int)
	// Has reports whether k is one of the keys.
	Has(k Key) bool
}

// Count returns the number of keys in [lower, upper).
func (s *Set) Count(lower, upper []byte) int { return len(s.span(lower, upper)) }

// List returns the keys in [lower, upper) (a copy).
func (s *Set) List(lower, upper []byte) []Key { return slices.Clone(s.span(lower, upper)) }

// Sites returns the number of sites of the keys in [lower, upper).
func (s *Set) Sites(lower, upper []byte) int {
	keys := s.span(lower, upper)
	n := 0
	for i := range keys {
		if i == 0 || !bytes.Equal(keys[i][:16], keys[i-1][:16]) {
			n++
		}
	}
	return n
}

// At returns the i-th key in [lower, upper).
func (s *Set) At(lower, upper []byte, i int) Key { return s.span(lower, upper)[i] }

// RangeSum returns the count and LtHash16 of the keys in [lower, upper):
// a pass over them.
func (s *Set) RangeSum(lower, upper []byte) (uint64, lthash.Sum, int) {
	keys := s.span(lower, upper)
	var sum lthash.Sum
	for i := range keys {
		sum.Add(keys[i][:])
	}
	return uint64(len(keys)), sum, len(keys)
}

// Sum returns the count and LtHash16 of the set's keys (what a Source
// whose store keeps no range sums computes).
func (s *Set) Sum() (uint64, lthash.Sum) {
	var sum lthash.Sum
	for i := range s.keys {
		sum.Add(s.keys[i][:])
	}
	return uint64(len(s.keys)), sum
}

// cut returns separator(prev, next) if it is a bound strictly inside
// (lo, upper) (upper nil: +∞); ok is false when prev and next, read by
// two calls of a view that changed between them, do not give one (equal,
// out of order, or outside the range).
func cut(prev, next Key, lo, upper []byte) (u []byte, ok bool) {
	if bytes.Compare(prev[:], next[:]) >= 0 {
		return nil, false
	}
	u = separator(prev, next)
	if bytes.Compare(u, lo) <= 0 || (upper != nil && bytes.Compare(u, upper) >= 0) {
		return nil, false
	}
	return u, true
}

// separator returns the shortest prefix p of next with prev < p ≤ next
// (prev < next).
func separator(prev, next Key) []byte {
	i := 0
	for i < len(prev) && prev[i] == next[i] {
		i++
	}
	return bytes.Clone(next[:i+1])
}

// Source is the local side of a reconciliation: which groups the node
// syncs, their horizons and their keys.
type Source interface {
	// Horizon reports whether the node reconciles g and g's eviction
	// horizon (events below it are not part of the set).
	Horizon(g Group) (h messages.HLC, ok bool, err error)
	// Keys returns the keys of g's retained events with an HLC at or
	// above min.
	Keys(g Group, min messages.HLC) (View, error)
	// Sum returns the count and LtHash16 of the same keys: what Keys
	// would return, without listing them.
	Sum(g Group, min messages.HLC) (count uint64, sum lthash.Sum, err error)
}

// lazySet loads a group's keys the first time a range needs them: a
// group whose sums agree never loads them.
type lazySet struct {
	src Source
	g   Group
	min messages.HLC
	set View
	w   *work // the initiator's session budget (nil on the responder)
	// sums: version 3, every fingerprint is a range sum's.
	sums bool
	// sent and prev are the id lists the initiator sent this round and
	// the last (by upper bound): an id reply's bitmap refers to the list
	// it answers, whatever changed in the set since.
	sent, prev map[string][]Key
}

func (l *lazySet) get() (View, error) {
	if l.set == nil {
		set, err := l.src.Keys(l.g, l.min)
		if err != nil {
			return nil, err
		}
		l.set = set
		if l.w != nil {
			l.w.allowed += WorkPerKey * set.Len()
		}
	}
	return l.set, nil
}

// fingerprint returns the fingerprint of the keys in [lower, upper). In
// version 3 a range of more than SumFrom keys per site is fingerprinted
// from its range sum (SumFingerprint; the cost, a few leaves' expansions
// per site, is charged after, weighted by ExpandWeight); a smaller one,
// and every range in version 2, by a pass over its keys (Fingerprint),
// charged before. Each side chooses by its own keys of the range, so
// equal sets choose alike, and different sets differ whichever each
// chooses (the two fingerprints have different domains).
//
// sub says the keys were charged already (a sub-range of a range whose
// keys were hashed and charged): hashing them is a second pass, within
// WorkPerKey's margin. hashed reports whether the keys were hashed.
func (l *lazySet) fingerprint(v View, lower, upper []byte, sub bool) (fp [messages.FingerprintSize]byte, hashed bool, err error) {
	if l.sums && v.Count(lower, upper) > sumFrom*v.Sites(lower, upper) {
		n, sum, cost := v.RangeSum(lower, upper)
		if err := charge(l.src, l.w, expandWeight*cost); err != nil {
			return fp, false, err
		}
		return SumFingerprint(n, &sum), false, nil
	}
	if !sub {
		if err := charge(l.src, l.w, v.Count(lower, upper)); err != nil {
			return fp, false, err
		}
	}
	return Fingerprint(v.List(lower, upper)), true, nil
}

// sumFingerprint is the fingerprint of the whole group from src's sum.
func (l *lazySet) sumFingerprint() ([messages.FingerprintSize]byte, error) {
	n, sum, err := l.src.Sum(l.g, l.min)
	if err != nil {
		return [messages.FingerprintSize]byte{}, err
	}
	return SumFingerprint(n, &sum), nil
}

// Found is what one group's reconciliation found.
type Found struct {
	Group Group
	// Have are keys we hold and the peer lacks.
	Have []Key
	// Need are keys the peer holds and we lack.
	Need []Key
}

// builder accumulates one group's outgoing ranges, merging skips.
type builder struct {
	ranges []messages.ReconcileRange
	keys   int
}

func (b *builder) add(r messages.ReconcileRange) {
	if r.Mode == messages.RangeSkip && len(b.ranges) > 0 && b.ranges[len(b.ranges)-1].Mode == messages.RangeSkip {
		b.ranges[len(b.ranges)-1].Upper = r.Upper
		return
	}
	b.keys += len(r.Keys)
	b.ranges = append(b.ranges, r)
}

// done reports whether the group needs no further round.
func (b *builder) done() bool {
	return len(b.ranges) == 0 || (len(b.ranges) == 1 && b.ranges[0].Mode == messages.RangeSkip)
}

// split describes the keys in [lower, upper) as one id list or Branch
// fingerprinted sub-ranges of equal counts, with the shortest separating
// prefixes as bounds. Only the keys at the cuts are read, and each
// sub-range's fingerprint (version 3) is a range sum.
//
// charged says the range's keys were charged as a pass already.
func split(b *builder, ls *lazySet, v View, lower, upper []byte, charged bool) error {
	n := v.Count(lower, upper)
	if n <= LeafMax {
		items := v.List(lower, upper)
		if err := charge(ls.src, ls.w, len(items)); err != nil {
			return err
		}
		b.add(messages.ReconcileRange{Mode: messages.RangeIDList, Upper: upper, Keys: items})
		return nil
	}
	lo := lower
	for c := 0; c < Branch; c++ {
		hi := (c + 1) * n / Branch
		u := upper
		if c < Branch-1 {
			var ok bool
			if u, ok = cut(v.At(lower, upper, hi-1), v.At(lower, upper, hi), lo, upper); !ok {
				// The view changed between the calls (the runtime's index
				// catches up between them for another session): keys that
				// no longer separate give no cut, and this sub-range runs
				// on into the next. What changed costs a round, as any
				// change during a session does.
				continue
			}
		}
		fp, _, err := ls.fingerprint(v, lo, u, charged)
		if err != nil {
			return err
		}
		b.add(messages.ReconcileRange{Mode: messages.RangeFingerprint, Upper: u, FP: fp})
		lo = u
	}
	return nil
}

// budget is what is left of one outgoing message's limits.
type budget struct{ ranges, keys int }

// newBudget keeps one range per group in reserve: a group reached after
// the room ran out still gets its one fingerprint of the rest.
func newBudget() budget {
	return budget{ranges: messages.MaxReconcileRanges - messages.MaxReconcileGroups, keys: messages.MaxReconcileKeys}
}

// room reports whether one more range's answer surely fits.
func (bu *budget) room() bool { return bu.ranges > Branch+1 && bu.keys > 2*LeafMax }

// process answers one group's ranges. initiator says which side we are:
// only the initiator collects what it finds (the responder is stateless).
func process(g Group, ls *lazySet, in []messages.ReconcileRange, initiator bool, bu *budget, f *Found) ([]messages.ReconcileRange, error) {
	var b builder
	var lower []byte
	for i, r := range in {
		differs := false // a range sum that is not ours: split it
		if r.Mode == messages.RangeSum {
			// The whole group (the wire allows a sum only as the only range).
			fp, err := ls.sumFingerprint()
			if err != nil {
				return nil, err
			}
			if fp == r.FP {
				return nil, nil
			}
			r.Mode, differs = messages.RangeFingerprint, true
		}
		var v View
		if r.Mode != messages.RangeSkip || !bu.room() {
			var err error
			if v, err = ls.get(); err != nil {
				return nil, err
			}
		}
		if !bu.room() {
			// Out of room: describe the rest by one fingerprint; the
			// peer splits it again next round, so progress continues.
			// Charged as the range reached (the rest is one more pass
			// at most per round, within WorkPerKey's margin).
			if n := v.Count(lower, r.Upper); n > 0 {
				if err := charge(ls.src, ls.w, n); err != nil {
					return nil, err
				}
			}
			saved := ls.w
			ls.w = nil
			fp, _, err := ls.fingerprint(v, lower, nil, true)
			ls.w = saved
			if err != nil {
				return nil, err
			}
			b.add(messages.ReconcileRange{Mode: messages.RangeFingerprint, FP: fp})
			break
		}
		mark := len(b.ranges)
		if err := inRange(g, r.Keys, lower, r.Upper, ls.min); err != nil {
			return nil, err
		}
		switch r.Mode {
		case messages.RangeSkip:
			b.add(messages.ReconcileRange{Mode: messages.RangeSkip, Upper: r.Upper})
		case messages.RangeFingerprint:
			same, charged := false, false
			if !differs {
				fp, hashed, err := ls.fingerprint(v, lower, r.Upper, false)
				if err != nil {
					return nil, err
				}
				same, charged = fp == r.FP, hashed
			} else if !ls.sums {
				// The whole group differs: its keys are split (hashed)
				// as a pass.
				if err := charge(ls.src, ls.w, v.Count(lower, r.Upper)); err != nil {
					return nil, err
				}
				charged = true
			}
			if same {
				b.add(messages.ReconcileRange{Mode: messages.RangeSkip, Upper: r.Upper})
			} else if err := split(&b, ls, v, lower, r.Upper, charged); err != nil {
				return nil, err
			}
		case messages.RangeIDList:
			n := v.Count(lower, r.Upper)
			switch {
			case !initiator && n > LeafMax:
				// We hold too many to list: narrow down instead.
				if err := split(&b, ls, v, lower, r.Upper, false); err != nil {
					return nil, err
				}
			default:
				if err := charge(ls.src, ls.w, n); err != nil {
					return nil, err
				}
				items := v.List(lower, r.Upper)
				if initiator {
					diff(items, r.Keys, f)
					b.add(messages.ReconcileRange{Mode: messages.RangeSkip, Upper: r.Upper})
				} else {
					b.add(reply(items, r.Keys, r.Upper))
				}
			}
		case messages.RangeIDReply:
			if !initiator {
				return nil, protocolErr(g, "id reply sent to the responder")
			}
			// The reply answers the id list we sent for this range.
			items, ok := ls.prev[string(r.Upper)]
			if !ok {
				return nil, protocolErr(g, "id reply to a range we did not list")
			}
			delete(ls.prev, string(r.Upper))
			if err := charge(ls.src, ls.w, len(items)); err != nil {
				return nil, err
			}
			if len(r.Need) != (len(items)+7)/8 {
				return nil, protocolErr(g, "need bitmap of %d bytes for %d keys", len(r.Need), len(items))
			}
			for x, k := range items {
				if r.Need[x/8]&(1<<(x%8)) != 0 {
					f.Have = append(f.Have, k)
				}
			}
			if pad := len(items) % 8; pad != 0 && r.Need[len(r.Need)-1]>>pad != 0 {
				return nil, protocolErr(g, "need bitmap sets bits past its %d keys", len(items))
			}
			for _, k := range r.Keys {
				if !v.Has(k) {
					f.Need = append(f.Need, k)
				}
			}
			b.add(messages.ReconcileRange{Mode: messages.RangeSkip, Upper: r.Upper})
		default:
			return nil, protocolErr(g, "range mode %d", r.Mode)
		}
		for _, o := range b.ranges[mark:] {
			bu.ranges--
			bu.keys -= len(o.Keys)
		}
		lower = r.Upper
		if i == len(in)-1 && r.Upper != nil {
			return nil, protocolErr(g, "ranges do not reach the end")
		}
	}
	if b.done() {
		return nil, nil
	}
	// The last range is unbounded (+∞), as the wire requires.
	b.ranges[len(b.ranges)-1].Upper = nil
	if initiator {
		// Remember the lists sent, for the replies to them.
		ls.sent = map[string][]Key{}
		for _, o := range b.ranges {
			if o.Mode == messages.RangeIDList {
				ls.sent[string(o.Upper)] = o.Keys
			}
		}
	}
	return b.ranges, nil
}

// inRange checks that keys a peer names lie in the range they are listed
// for and at or above the group's bound: a key outside it names nothing
// the two sides compare, and fetching it would be work for nothing.
func inRange(g Group, keys []Key, lower, upper []byte, min messages.HLC) error {
	for i := range keys {
		k := keys[i][:]
		if bytes.Compare(k, lower) < 0 || (upper != nil && bytes.Compare(k, upper) >= 0) {
			return protocolErr(g, "key %x outside its range", k)
		}
		if keys[i].HLC() < min {
			return protocolErr(g, "key %x below the bound %v", k, min)
		}
	}
	return nil
}

// diff records, from the peer's full list of a range, what each side lacks.
func diff(items, theirs []Key, f *Found) {
	i, j := 0, 0
	for i < len(items) || j < len(theirs) {
		switch {
		case j == len(theirs) || (i < len(items) && bytes.Compare(items[i][:], theirs[j][:]) < 0):
			f.Have = append(f.Have, items[i])
			i++
		case i == len(items) || bytes.Compare(items[i][:], theirs[j][:]) > 0:
			f.Need = append(f.Need, theirs[j])
			j++
		default:
			i, j = i+1, j+1
		}
	}
}

// reply answers a peer's id list: our keys it lacks and a bitmap of its
// keys we lack.
func reply(items, theirs []Key, upper []byte) messages.ReconcileRange {
	r := messages.ReconcileRange{Mode: messages.RangeIDReply, Upper: upper, Need: make([]byte, (len(theirs)+7)/8)}
	var f Found
	diff(items, theirs, &f)
	r.Keys = f.Have
	mine := &Set{keys: items}
	for x, k := range theirs {
		if !mine.Has(k) {
			r.Need[x/8] |= 1 << (x % 8)
		}
	}
	return r
}

// initial describes a whole set as the first round does.
func initial(ls *lazySet) ([]messages.ReconcileRange, error) {
	// Always the sum's fingerprint, even for a small set: agreement, the
	// common case, then costs one range and no pass over the keys; a
	// responder that differs and holds few keys answers with its list in
	// the same round trip.
	fp, err := ls.sumFingerprint()
	if err != nil {
		return nil, err
	}
	return []messages.ReconcileRange{{Mode: messages.RangeSum, FP: fp}}, nil
}

// bound returns the HLC bound both sides use for g: the higher of the
// peer's and our horizon (SSP/1 §13.5: history below either horizon is
// not comparable).
func bound(peer, own messages.HLC) messages.HLC { return max(peer, own) }

// Respond is the responder's side of one round: stateless, it answers a
// peer's message from the local sets. Groups the node does not reconcile
// are left out of the answer (the initiator takes that as finished), so a
// peer cannot make the node enumerate anything outside them.
func Respond(src Source, in *messages.Reconcile) (*messages.Reconcile, error) {
	// Answered in the version asked in: a version-2 initiator compares
	// SHA-256 fingerprints of the keys.
	out := &messages.Reconcile{SumRanges: in.SumRanges}
	bu := newBudget()
	for _, ig := range in.Groups {
		g := Group{ig.Schema, ig.Table}
		h, ok, err := src.Horizon(g)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if ig.Bound > ceiling(src) {
			// Above the clock plus the skew bound: the node holds
			// nothing there, and a fresh bound per request must not
			// make it look.
			return nil, protocolErr(g, "bound %v above the node's clock and skew bound", ig.Bound)
		}
		b := bound(ig.Bound, h)
		ls := &lazySet{src: src, g: g, min: b, sums: in.SumRanges}
		var ranges []messages.ReconcileRange
		if b != ig.Bound {
			// Our horizon is higher: restart the group at it.
			if ranges, err = initial(ls); err != nil {
				return nil, err
			}
			bu.ranges -= len(ranges)
		} else if ranges, err = process(g, ls, ig.Ranges, false, &bu, nil); err != nil {
			return nil, err
		}
		if len(ranges) > 0 {
			out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: b, Ranges: ranges})
		}
	}
	return out, nil
}

type groupState struct {
	bound  messages.HLC
	set    *lazySet
	found  Found
	done   bool
	raised bool // the peer raised the bound once: a second raise is refused
}

// Session is the initiator's side of one reconciliation. It keeps a
// snapshot of each group's set for the whole session, so an id reply's
// bitmap refers to the list it answers.
type Session struct {
	sums      bool // version 3: fingerprints from range sums
	work      work
	src       Source
	groups    map[Group]*groupState
	order     []Group
	rounds    int
	truncated bool
}

// NewSession starts a reconciliation of groups (deduplicated; groups the
// source does not reconcile are skipped) and returns its first message.
// It speaks version 3 (fingerprints from range sums); NewSessionVersion
// chooses.
func NewSession(src Source, groups []Group) (*Session, *messages.Reconcile, error) {
	return NewSessionVersion(src, groups, messages.ReconcileRangeSumVersion)
}

// NewSessionVersion is NewSession speaking version (ReconcileSumVersion:
// SHA-256 fingerprints of the keys below the first round, for a peer that
// does not speak ReconcileRangeSumVersion).
func NewSessionVersion(src Source, groups []Group, version int) (*Session, *messages.Reconcile, error) {
	sums := version >= messages.ReconcileRangeSumVersion
	s := &Session{src: src, sums: sums, groups: map[Group]*groupState{}, work: work{allowed: WorkBase}}
	slices.SortFunc(groups, func(a, b Group) int {
		if a.Schema != b.Schema {
			return cmpString(a.Schema, b.Schema)
		}
		return cmpString(a.Table, b.Table)
	})
	groups = slices.Compact(groups)
	out := &messages.Reconcile{SumRanges: sums}
	for _, g := range groups {
		h, ok, err := src.Horizon(g)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue
		}
		ls := &lazySet{src: src, g: g, min: h, w: &s.work, sums: sums}
		ranges, err := initial(ls)
		if err != nil {
			return nil, nil, err
		}
		s.groups[g] = &groupState{bound: h, set: ls, found: Found{Group: g}}
		s.order = append(s.order, g)
		out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: h, Ranges: ranges})
		if len(out.Groups) == messages.MaxReconcileGroups {
			break // the rest wait for the next session
		}
	}
	if len(out.Groups) == 0 {
		return s, nil, nil
	}
	s.rounds = 1
	return s, out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Step takes the responder's answer and returns the next message, or nil
// when the session is finished. Groups absent from in are finished.
func (s *Session) Step(in *messages.Reconcile) (*messages.Reconcile, error) {
	if s.rounds >= MaxRounds {
		return nil, ErrTooManyRounds
	}
	if in.SumRanges != s.sums && len(in.Groups) > 0 {
		return nil, fmt.Errorf("%w: answer in another version than the question", ErrProtocol)
	}
	out := &messages.Reconcile{SumRanges: s.sums}
	bu := newBudget()
	seen := map[Group]bool{}
	for _, ig := range in.Groups {
		g := Group{ig.Schema, ig.Table}
		st, ok := s.groups[g]
		if !ok || st.done {
			return nil, protocolErr(g, "answer for a group not under reconciliation")
		}
		seen[g] = true
		if ig.Bound < st.bound {
			return nil, protocolErr(g, "bound %v below the agreed %v", ig.Bound, st.bound)
		}
		if ig.Bound > st.bound {
			// The peer's horizon is higher: restart from it, once. An
			// honest responder raises the bound only to its horizon,
			// in its first answer; a bound raised again would make
			// the initiator reload its set every round, and a bound
			// above the clock and skew bound names nothing it holds.
			switch {
			case st.raised:
				return nil, protocolErr(g, "bound raised again, to %v", ig.Bound)
			case ig.Bound > ceiling(s.src):
				return nil, protocolErr(g, "bound %v above the node's clock and skew bound", ig.Bound)
			}
			st.raised = true
			st.bound, st.set, st.found = ig.Bound, &lazySet{src: s.src, g: g, min: ig.Bound, w: &s.work, sums: s.sums}, Found{Group: g}
		}
		st.set.prev, st.set.sent = st.set.sent, nil
		ranges, err := process(g, st.set, ig.Ranges, true, &bu, &st.found)
		if err != nil {
			return nil, err
		}
		if len(st.found.Have) > MaxFound || len(st.found.Need) > MaxFound {
			s.truncated = true
			ranges = nil
		}
		if len(ranges) == 0 {
			st.done = true
			continue
		}
		out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: st.bound, Ranges: ranges})
	}
	for g, st := range s.groups {
		if !seen[g] {
			st.done = true // the peer has nothing more (or does not sync it)
		}
	}
	if len(out.Groups) == 0 {
		return nil, nil
	}
	s.rounds++
	return out, nil
}

// Rounds returns the messages the initiator has sent.
func (s *Session) Rounds() int { return s.rounds }

// Truncated reports whether a group stopped at MaxFound.
func (s *Session) Truncated() bool { return s.truncated }

// Found returns what each group's reconciliation found, in group order.
func (s *Session) Found() []Found {
	out := make([]Found, 0, len(s.order))
	for _, g := range s.order {
		f := s.groups[g].found
		if len(f.Have) > 0 || len(f.Need) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// Bound returns the lower HLC bound the session settled for g (the
// higher of the two horizons): events below it were not compared.
func (s *Session) Bound(g Group) (messages.HLC, bool) {
	st, ok := s.groups[g]
	if !ok {
		return 0, false
	}
	return st.bound, true
}
