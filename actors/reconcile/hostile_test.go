package reconcile

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// limited is a Source with a clock ceiling and a work meter (the
// runtime's Limiter), counting what it was charged.
type limited struct {
	*memSource
	ceil    messages.HLC
	charged int
}

func (l *limited) Ceiling() messages.HLC { return l.ceil }
func (l *limited) Charge(n int) error    { l.charged += n; return nil }

func hostileSet(n int) (*memSource, Group) {
	g := Group{"s", "t"}
	a := newMem()
	a.horizons[g] = 0
	for i := 0; i < n; i++ {
		a.keys[g] = append(a.keys[g], key(byte(1+i%3), messages.HLC(1000+i), uint64(i)))
	}
	return a, g
}

// TestHostileResponderRaisingTheBoundIsCutOff: a responder that raises the
// bound every round made the initiator reload its set every round (a
// full table pass per round, for up to MaxRounds rounds). The bound may be
// raised once per group per session; a second raise ends the session.
func TestHostileResponderRaisingTheBoundIsCutOff(t *testing.T) {
	a, g := hostileSet(1000)
	s, _, err := NewSession(&limited{memSource: a, ceil: 1 << 40}, []Group{g})
	if err != nil {
		t.Fatal(err)
	}
	for round := 1; ; round++ {
		ans := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: messages.HLC(round),
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}}
		_, err := s.Step(ans)
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrProtocol) || a.loads > 1 {
			t.Fatalf("after %d rounds and %d loads of the set: %v; want ErrProtocol at the second raise, one load", round, a.loads, err)
		}
		return
	}
}

// TestBoundAboveTheClockIsRefused: a bound above the node's clock plus
// the skew bound names nothing the node holds; neither side looks.
func TestBoundAboveTheClockIsRefused(t *testing.T) {
	a, g := hostileSet(100)
	src := &limited{memSource: a, ceil: 5000}
	// Responder.
	req := &messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: 5001,
		Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}}
	if _, err := Respond(src, req); !errors.Is(err, ErrProtocol) {
		t.Errorf("responder, bound above the ceiling: %v (loads %d), want ErrProtocol", err, a.loads)
	}
	// At the ceiling it is served.
	req.Groups[0].Bound = 5000
	if _, err := Respond(src, req); err != nil {
		t.Errorf("responder, bound at the ceiling: %v", err)
	}
	// Initiator.
	s, _, err := NewSession(src, []Group{g})
	if err != nil {
		t.Fatal(err)
	}
	ans := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: 5001,
		Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint}}}}}
	if _, err := s.Step(ans); !errors.Is(err, ErrProtocol) {
		t.Errorf("initiator, bound above the ceiling: %v, want ErrProtocol", err)
	}
}

// TestRandomFingerprintsCostBoundedWork: a responder answering every round
// with a fingerprint that never agrees made the initiator pass over its
// whole set each round, for MaxRounds rounds (19 MB and 3.8 s of CPU per
// session at 50 000 events). The session's work is bounded by WorkPerKey
// passes over the sets it loaded. Counted: rounds, each one pass over the
// set.
func TestRandomFingerprintsCostBoundedWork(t *testing.T) {
	a, g := hostileSet(5000)
	s, _, err := NewSessionVersion(a, []Group{g}, messages.ReconcileSumVersion)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rounds := 0
	for {
		var fp [messages.FingerprintSize]byte
		for i := range fp {
			fp[i] = byte(rng.Uint32())
		}
		ans := &messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t",
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: fp}}}}}
		rounds++
		if _, err = s.Step(ans); err != nil {
			break
		}
	}
	if limit := 12 + (1<<16)/5000 + 2; /* WorkPerKey passes, WorkBase, two rounds */ !errors.Is(err, ErrProtocol) || rounds > limit {
		t.Fatalf("%d rounds, each a pass over 5000 keys, ended with %v; want ErrProtocol within %d rounds", rounds, err, limit)
	}
}

// TestPeerNamedKeysOutsideTheirRangeAreRefused: keys a responder names in
// an id list or reply must lie in that range and at or above the bound;
// anything else is garbage to be fetched for nothing.
func TestPeerNamedKeysOutsideTheirRangeAreRefused(t *testing.T) {
	a, g := hostileSet(3)
	a.horizons[g] = 500
	for name, k := range map[string]Key{
		"below the bound":   key(1, 10, 99),
		"outside its range": key(9, 1000, 99),
	} {
		s, _, err := NewSession(a, []Group{g})
		if err != nil {
			t.Fatal(err)
		}
		ans := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t", Bound: 500, Ranges: []messages.ReconcileRange{
			{Mode: messages.RangeIDList, Upper: []byte{9}, Keys: []Key{k}},
			{Mode: messages.RangeSkip}}}}}
		if _, err := s.Step(ans); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol; %d groups found keys to fetch", name, err, len(s.Found()))
		}
	}
}

// TestRandomFingerprintsCostBoundedWorkWithRangeSums: in version 3 a
// fingerprint of a large range comes from range sums, so a responder
// answering every round with a fingerprint that never agrees costs each
// round a few leaves of expansions, not a pass over the set. The session
// still ends (at MaxRounds, or at the work budget), and the work it was
// charged stays within the budget of WorkPerKey passes.
func TestRandomFingerprintsCostBoundedWorkWithRangeSums(t *testing.T) {
	a, g := hostileSet(5000)
	src := &limited{memSource: a, ceil: 1 << 40}
	s, _, err := NewSession(src, []Group{g})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rounds := 0
	for {
		var fp [messages.FingerprintSize]byte
		for i := range fp {
			fp[i] = byte(rng.Uint32())
		}
		ans := &messages.Reconcile{SumRanges: true, Groups: []messages.ReconcileGroup{{Schema: "s", Table: "t",
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: fp}}}}}
		rounds++
		if _, err = s.Step(ans); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrTooManyRounds) {
		t.Fatalf("after %d rounds: %v, want ErrProtocol or ErrTooManyRounds", rounds, err)
	}
	if budget := WorkPerKey*5000 + WorkBase; src.charged > budget+ExpandWeight*3*2*LeafKeys {
		t.Fatalf("%d rounds charged %d keys of work, budget %d", rounds, src.charged, budget)
	}
	t.Logf("%d rounds, %d keys of work charged (%v)", rounds, src.charged, err)
}
