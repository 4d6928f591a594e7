package reconcile

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// memSource is a Source over maps (tests).
type memSource struct {
	horizons map[Group]messages.HLC
	keys     map[Group][]Key
	cache    map[Group]cachedSet
	sums     map[Group]cachedSum
	// loads counts Keys calls: a group whose sums agree loads nothing.
	loads int
}

var (
	sumMemoMu sync.Mutex
	sumMemo   = map[[messages.FingerprintSize]byte]cachedSum{}
)

type cachedSum struct {
	min   messages.HLC
	n     int
	count uint64
	sum   lthash.Sum
}

// Sum is computed from the keys, as a store's range sums would give it.
func (m *memSource) Sum(g Group, min messages.HLC) (uint64, lthash.Sum, error) {
	if c, ok := m.sums[g]; ok && c.min == min && c.n == len(m.keys[g]) {
		return c.count, c.sum, nil
	}
	var out []Key
	for _, k := range m.keys[g] {
		if k.HLC() >= min {
			out = append(out, k)
		}
	}
	set := NewSet(out)
	fp := Fingerprint(set.Keys())
	sumMemoMu.Lock()
	c, ok := sumMemo[fp]
	sumMemoMu.Unlock()
	if !ok {
		// Sets equal across sources and tests (the initiator's 100 000
		// keys of TestCostGrowsWithDifferences) are summed once: LtHash16
		// under the race detector costs tens of µs a key.
		c.count, c.sum = set.Sum()
		sumMemoMu.Lock()
		sumMemo[fp] = c
		sumMemoMu.Unlock()
	}
	n, sum := c.count, c.sum
	if m.sums == nil {
		m.sums = map[Group]cachedSum{}
	}
	m.sums[g] = cachedSum{min: min, n: len(m.keys[g]), count: n, sum: sum}
	return n, sum, nil
}

func newMem() *memSource {
	return &memSource{horizons: map[Group]messages.HLC{}, keys: map[Group][]Key{}}
}

func (m *memSource) Horizon(g Group) (messages.HLC, bool, error) {
	h, ok := m.horizons[g]
	return h, ok, nil
}

func (m *memSource) Keys(g Group, min messages.HLC) (View, error) {
	m.loads++
	// Cached while the group's keys are unchanged (a responder reloads
	// its set every round; sorting 100 000 keys each time dominates a
	// race-detector run).
	if c, ok := m.cache[g]; ok && c.min == min && c.n == len(m.keys[g]) {
		return c.set, nil
	}
	var out []Key
	for _, k := range m.keys[g] {
		if k.HLC() >= min {
			out = append(out, k)
		}
	}
	set := NewSet(out)
	// An index over the keys (as the runtime keeps): range sums in
	// O(log n). Built once per distinct set (LtHash16 under the race
	// detector costs tens of µs a key).
	fp := Fingerprint(set.Keys())
	indexMemoMu.Lock()
	x, ok := indexMemo[fp]
	indexMemoMu.Unlock()
	if !ok {
		x = NewIndex(set.Keys())
		indexMemoMu.Lock()
		indexMemo[fp] = x
		indexMemoMu.Unlock()
	}
	v := x.View(0)
	if m.cache == nil {
		m.cache = map[Group]cachedSet{}
	}
	m.cache[g] = cachedSet{min: min, n: len(m.keys[g]), set: v}
	return v, nil
}

var (
	indexMemoMu sync.Mutex
	indexMemo   = map[[messages.FingerprintSize]byte]*Index{}
)

type cachedSet struct {
	min messages.HLC
	n   int
	set View
}

// stats counts what crossed the wire in one reconciliation.
type stats struct{ rounds, bytes int }

// run reconciles a (initiator) with b (responder) through the wire
// encoding and returns what a found.
// tb is what run needs of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func run(t tb, a, b Source, groups []Group) ([]Found, stats) {
	t.Helper()
	return runVersion(t, messages.ReconcileRangeSumVersion, a, b, groups)
}

// runVersion is run with the initiator speaking version.
func runVersion(t tb, version int, a, b Source, groups []Group) ([]Found, stats) {
	t.Helper()
	var st stats
	s, msg, err := NewSessionVersion(a, groups, version)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	for msg != nil {
		raw, err := messages.EncodeReconcile(msg)
		if err != nil {
			t.Fatalf("encode request: %v", err)
		}
		st.rounds++
		st.bytes += len(raw)
		in, err := messages.DecodeReconcile(raw)
		if err != nil {
			t.Fatalf("decode request: %v", err)
		}
		ans, err := Respond(b, in)
		if err != nil {
			t.Fatalf("respond: %v", err)
		}
		raw, err = messages.EncodeReconcile(ans)
		if err != nil {
			t.Fatalf("encode answer: %v", err)
		}
		st.bytes += len(raw)
		if ans, err = messages.DecodeReconcile(raw); err != nil {
			t.Fatalf("decode answer: %v", err)
		}
		if msg, err = s.Step(ans); err != nil {
			t.Fatalf("step: %v", err)
		}
	}
	return s.Found(), st
}

func key(site byte, h messages.HLC, id uint64) Key {
	var s messages.SiteID
	s[0] = site
	var e messages.EventID
	for i := 0; i < 4; i++ {
		// Spread id bits over the id like a hash does.
		v := id*0x9e3779b97f4a7c15 + uint64(i)*0xbf58476d1ce4e5b9
		v ^= v >> 31
		for j := 0; j < 8; j++ {
			e[i*8+j] = byte(v >> (8 * j))
		}
	}
	return messages.NewReconcileKey(s, h, e)
}

func keyDiff(a, b []Key) []Key {
	sb := NewSet(slices.Clone(b))
	var out []Key
	for _, k := range NewSet(slices.Clone(a)).Keys() {
		if !sb.Has(k) {
			out = append(out, k)
		}
	}
	return out
}

func sorted(k []Key) []Key { return NewSet(slices.Clone(k)).Keys() }

// targetBytes is the byte target for the reconciliation's own bytes
// (events excluded): 64 bytes per difference per halving of n/d, plus a
// few KB (and 64 bytes of framing per round trip).
func targetBytes(n, d, rounds int) int {
	if d == 0 {
		return 512
	}
	l := int(math.Ceil(math.Log2(float64(max(n, 2)) / float64(d))))
	return 64*d*max(l, 1) + 4096 + 64*rounds
}

// byteBound is the bound asserted for any n and d: the target plus, per
// difference, its leaf exchange (a list of up to LeafMax keys and the
// reply), counted as LeafMax more halvings. Where differences are sparse
// and n/d large (TestCostGrowsWithDifferences) the target alone holds.
func byteBound(n, d, rounds int) int {
	return targetBytes(n, d, rounds) + 64*LeafMax*d
}

// roundBound: one split level per round trip, levels of Branch, plus the
// leaf exchange.
func roundBound(n int) int {
	return int(math.Ceil(math.Log(float64(max(n, 2))/LeafMax)/math.Log(Branch))) + 3
}

// TestPropertyConvergesToSymmetricDifference: two random sets of one or
// several tables find exactly their symmetric difference, the bytes and
// rounds stay within O(d log n), and a second run after exchanging finds
// nothing.
func TestPropertyConvergesToSymmetricDifference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		groups := []Group{{"s", "a"}, {"s", "b"}}[:rapid.IntRange(1, 2).Draw(rt, "groups")]
		a, b := newMem(), newMem()
		totalN, totalD := 0, 0
		for _, g := range groups {
			a.horizons[g], b.horizons[g] = 0, 0
			n := rapid.IntRange(0, 1500).Draw(rt, "n")
			sites := rapid.IntRange(1, 4).Draw(rt, "sites")
			pOnlyA := rapid.Float64Range(0, 0.05).Draw(rt, "onlyA")
			pOnlyB := rapid.Float64Range(0, 0.05).Draw(rt, "onlyB")
			seed := rapid.Uint64().Draw(rt, "seed")
			for i := 0; i < n; i++ {
				r := (seed + uint64(i)) * 0x2545f4914f6cdd1d
				k := key(byte(r%uint64(sites)), messages.HLC(1000+i), seed^uint64(i))
				x := float64(r>>11) / float64(1<<53)
				switch {
				case x < pOnlyA:
					a.keys[g] = append(a.keys[g], k)
				case x < pOnlyA+pOnlyB:
					b.keys[g] = append(b.keys[g], k)
				default:
					a.keys[g] = append(a.keys[g], k)
					b.keys[g] = append(b.keys[g], k)
				}
			}
			totalN += n
			totalD += len(keyDiff(a.keys[g], b.keys[g])) + len(keyDiff(b.keys[g], a.keys[g]))
		}
		// Both versions; in version 3 ranges down to a few keys a site
		// are fingerprinted from range sums.
		version := rapid.SampledFrom([]int{messages.ReconcileSumVersion, messages.ReconcileRangeSumVersion}).Draw(rt, "version")
		defer func(s, w int) { sumFrom, expandWeight = s, w }(sumFrom, expandWeight)
		sumFrom = rapid.SampledFrom([]int{1, 7, 100, SumFrom}).Draw(rt, "sumFrom")
		if sumFrom < SumFrom {
			expandWeight = 1 // sums of small ranges: charged as their keys
		}
		found, st := runVersion(rt, version, a, b, slices.Clone(groups))
		got := map[Group]Found{}
		for _, f := range found {
			got[f.Group] = f
		}
		for _, g := range groups {
			f := got[g]
			if want := keyDiff(a.keys[g], b.keys[g]); !slices.Equal(sorted(f.Have), want) {
				rt.Fatalf("%s: have %d keys, want %d", g, len(f.Have), len(want))
			}
			if want := keyDiff(b.keys[g], a.keys[g]); !slices.Equal(sorted(f.Need), want) {
				rt.Fatalf("%s: need %d keys, want %d", g, len(f.Need), len(want))
			}
		}
		if st.bytes > byteBound(totalN, totalD, st.rounds) {
			rt.Fatalf("n=%d d=%d: %d bytes in %d rounds, bound %d", totalN, totalD, st.bytes, st.rounds, byteBound(totalN, totalD, st.rounds))
		}
		if st.rounds > roundBound(totalN)+len(groups) {
			rt.Fatalf("n=%d d=%d: %d rounds, bound %d", totalN, totalD, st.rounds, roundBound(totalN))
		}
		// Exchange what was found; a second run finds nothing in one round.
		for _, f := range found {
			a.keys[f.Group] = append(a.keys[f.Group], f.Need...)
			b.keys[f.Group] = append(b.keys[f.Group], f.Have...)
		}
		again, st2 := runVersion(rt, version, a, b, slices.Clone(groups))
		if len(again) != 0 {
			rt.Fatalf("second run found %d groups with differences", len(again))
		}
		if st2.rounds != 1 || st2.bytes > 100*len(groups)+64 {
			rt.Fatalf("agreeing sets cost %d rounds, %d bytes", st2.rounds, st2.bytes)
		}
	})
}

// TestAgreeingSetsCostOneRoundTrip: n = 100 000 identical keys, one round
// trip of a few hundred bytes.
func TestAgreeingSetsCostOneRoundTrip(t *testing.T) {
	a, b := newMem(), newMem()
	g := Group{"s", "t"}
	a.horizons[g], b.horizons[g] = 0, 0
	for i := 0; i < 100000; i++ {
		k := key(byte(i%3), messages.HLC(i), uint64(i))
		a.keys[g] = append(a.keys[g], k)
		b.keys[g] = append(b.keys[g], k)
	}
	found, st := run(t, a, b, []Group{g})
	if len(found) != 0 || st.rounds != 1 || st.bytes > 300 {
		t.Fatalf("found %v in %d rounds, %d bytes", found, st.rounds, st.bytes)
	}
	// Agreement is read from the sums alone: neither side lists its keys.
	if a.loads != 0 || b.loads != 0 {
		t.Fatalf("agreeing sets loaded their keys: initiator %d times, responder %d", a.loads, b.loads)
	}
	t.Logf("n=100000 d=0: %d round trip, %d bytes", st.rounds, st.bytes)
}

// TestCostGrowsWithDifferences measures rounds and bytes for n = 100 000
// and d ∈ {1, 10, 1000} against the bound (counted, not timed).
func TestCostGrowsWithDifferences(t *testing.T) {
	const n = 100000
	for _, d := range []int{1, 10, 1000} {
		a, b := newMem(), newMem()
		g := Group{"s", "t"}
		a.horizons[g], b.horizons[g] = 0, 0
		for i := 0; i < n; i++ {
			k := key(byte(i%3), messages.HLC(i), uint64(i))
			a.keys[g] = append(a.keys[g], k)
			if i%(n/d) != 7 {
				b.keys[g] = append(b.keys[g], k)
			}
		}
		found, st := run(t, a, b, []Group{g})
		if len(found) != 1 || len(found[0].Have) != d || len(found[0].Need) != 0 {
			t.Fatalf("d=%d: found %+v", d, found)
		}
		if st.bytes > targetBytes(n, d, st.rounds) || st.rounds > roundBound(n) {
			t.Fatalf("d=%d: %d bytes in %d rounds; bounds %d bytes, %d rounds", d, st.bytes, st.rounds, targetBytes(n, d, st.rounds), roundBound(n))
		}
		t.Logf("n=%d d=%d: %d round trips, %d bytes (target %d; %.1f bytes per difference)", n, d, st.rounds, st.bytes, targetBytes(n, d, st.rounds), float64(st.bytes)/float64(d))
	}
}

// TestHorizonBoundIsTheHigherOfTheTwo: events below the higher horizon
// are not compared, whichever side holds it.
func TestHorizonBoundIsTheHigherOfTheTwo(t *testing.T) {
	g := Group{"s", "t"}
	for _, aHigher := range []bool{true, false} {
		a, b := newMem(), newMem()
		a.horizons[g], b.horizons[g] = 0, 500
		if aHigher {
			a.horizons[g], b.horizons[g] = 500, 0
		}
		for i := 0; i < 1000; i++ {
			k := key(1, messages.HLC(i), uint64(i))
			// Below 500 the sets differ wildly; above it they differ by one key.
			if i < 500 && i%2 == 0 {
				a.keys[g] = append(a.keys[g], k)
				continue
			}
			if i == 777 {
				b.keys[g] = append(b.keys[g], k)
				continue
			}
			a.keys[g] = append(a.keys[g], k)
			b.keys[g] = append(b.keys[g], k)
		}
		found, _ := run(t, a, b, []Group{g})
		if len(found) != 1 || len(found[0].Have) != 0 || len(found[0].Need) != 1 || found[0].Need[0].HLC() != 777 {
			t.Fatalf("a higher %v: found %+v", aHigher, found)
		}
	}
}

// TestGroupsOnlyOneSideSyncsAreNotReconciled: the responder leaves out
// groups it does not reconcile, and never enumerates them.
func TestGroupsOnlyOneSideSyncsAreNotReconciled(t *testing.T) {
	shared, private := Group{"s", "shared"}, Group{"s", "private"}
	a, b := newMem(), newMem()
	a.horizons[shared], b.horizons[shared] = 0, 0
	a.horizons[private] = 0
	b.keys[private] = []Key{key(1, 1, 1)} // b holds it but does not sync it
	a.keys[private] = []Key{key(1, 2, 2)}
	a.keys[shared] = []Key{key(1, 3, 3)}
	found, _ := run(t, a, b, []Group{shared, private})
	if len(found) != 1 || found[0].Group != shared || len(found[0].Have) != 1 {
		t.Fatalf("found %+v", found)
	}
}

// TestHostileAnswersFailTheSession: answers the protocol does not allow
// are ErrProtocol, not a panic or a silent acceptance.
func TestHostileAnswersFailTheSession(t *testing.T) {
	g := Group{"s", "t"}
	a := newMem()
	a.horizons[g] = 0
	for i := 0; i < 5; i++ {
		a.keys[g] = append(a.keys[g], key(1, messages.HLC(i), uint64(i)))
	}
	cases := map[string]*messages.Reconcile{
		"unknown group": {SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "other", Ranges: []messages.ReconcileRange{{Mode: messages.RangeSkip}}}}},
		"bitmap too short": {SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{
			{Mode: messages.RangeIDReply, Need: []byte{}}}}}},
		"bitmap bits past the list": {SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{
			{Mode: messages.RangeIDReply, Need: []byte{0xff}}}}}},
		"bound lowered": {SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: 0, Ranges: []messages.ReconcileRange{{Mode: messages.RangeSkip}}}}},
	}
	a.horizons[g] = 0
	for name, ans := range cases {
		if name == "bound lowered" {
			a.horizons[g] = 3
		} else {
			a.horizons[g] = 0
		}
		s, _, err := NewSession(a, []Group{g})
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(name, "bitmap") {
			// A reply answers an id list: have the session send one
			// (its 5 keys, for a fingerprint that differs).
			next, err := s.Step(&messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t",
				Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}})
			if err != nil || len(next.Groups) != 1 || next.Groups[0].Ranges[0].Mode != messages.RangeIDList {
				t.Fatalf("%s: no id list sent: %+v, %v", name, next, err)
			}
		}
		if _, err := s.Step(ans); !errors.Is(err, ErrProtocol) || (strings.HasPrefix(name, "bitmap") && !strings.Contains(err.Error(), "bitmap")) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	// A reply to a range the session never listed, and an answer in
	// another version than the session's.
	for name, ans := range map[string]*messages.Reconcile{
		"reply to no list": {SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{
			{Mode: messages.RangeIDReply, Need: []byte{0}}}}}},
		"version 2 answer": {Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}},
	} {
		s, _, err := NewSession(a, []Group{g})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Step(ans); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	// An id reply sent to the responder.
	a.horizons[g] = 0
	_, err := Respond(a, &messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{{Mode: messages.RangeIDReply}}}}})
	if !errors.Is(err, ErrProtocol) {
		t.Errorf("id reply to responder: %v", err)
	}
}

// TestEndlessPeerIsCutOff: a responder that never agrees ends the
// session with ErrTooManyRounds.
func TestEndlessPeerIsCutOff(t *testing.T) {
	g := Group{"s", "t"}
	a := newMem()
	a.horizons[g] = 0
	for i := 0; i < 100; i++ {
		a.keys[g] = append(a.keys[g], key(1, messages.HLC(i), uint64(i)))
	}
	s, _, err := NewSession(a, []Group{g})
	if err != nil {
		t.Fatal(err)
	}
	hostile := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}}
	for i := 0; ; i++ {
		_, err := s.Step(hostile)
		if errors.Is(err, ErrTooManyRounds) {
			break
		}
		if err != nil || i > MaxRounds {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}

func TestSeparatorIsShortestBetween(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		a := key(byte(rapid.IntRange(0, 2).Draw(rt, "sa")), messages.HLC(rapid.Uint64().Draw(rt, "ha")), rapid.Uint64().Draw(rt, "ia"))
		b := key(byte(rapid.IntRange(0, 2).Draw(rt, "sb")), messages.HLC(rapid.Uint64().Draw(rt, "hb")), rapid.Uint64().Draw(rt, "ib"))
		c := bytes.Compare(a[:], b[:])
		if c == 0 {
			return
		}
		if c > 0 {
			a, b = b, a
		}
		p := separator(a, b)
		if bytes.Compare(a[:], p) >= 0 || bytes.Compare(p, b[:]) > 0 || !bytes.HasPrefix(b[:], p) {
			rt.Fatalf("separator %x between %x and %x", p, a, b)
		}
		if len(p) > 1 && bytes.Compare(a[:], p[:len(p)-1]) < 0 {
			rt.Fatalf("separator %x is not the shortest", p)
		}
	})
}

// TestManyDifferencesSpanRounds: more differences than one message can
// carry are found over several rounds (the rest of a range goes back as
// one fingerprint), and every message stays within the wire limits.
func TestManyDifferencesSpanRounds(t *testing.T) {
	a, b := newMem(), newMem()
	g := Group{"s", "t"}
	a.horizons[g], b.horizons[g] = 0, 0
	const n = 40000
	wantHave, wantNeed := 0, 0
	for i := 0; i < n; i++ {
		k := key(byte(i%2), messages.HLC(i), uint64(i))
		switch i % 5 {
		case 0:
			a.keys[g] = append(a.keys[g], k)
			wantHave++
		case 1:
			b.keys[g] = append(b.keys[g], k)
			wantNeed++
		default:
			a.keys[g] = append(a.keys[g], k)
			b.keys[g] = append(b.keys[g], k)
		}
	}
	found, st := run(t, a, b, []Group{g})
	if len(found) != 1 || len(found[0].Have) != wantHave || len(found[0].Need) != wantNeed {
		t.Fatalf("found %d/%d, want %d/%d", len(found[0].Have), len(found[0].Need), wantHave, wantNeed)
	}
	t.Logf("n=%d d=%d: %d round trips, %d bytes", n, wantHave+wantNeed, st.rounds, st.bytes)
}
