package hosting

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/actortest"
)

var fenceMesh = []byte("hosting-fence-mesh")

// viewOf is an incarnation whose view holds the given member addresses.
func viewOf(self string, addrs ...string) *incarnation {
	inc := &incarnation{c: &Cluster{timeout: time.Second}, self: self, changed: make(chan struct{})}
	var ms []*cluster.Member
	for i, a := range addrs {
		var port int
		_, _ = fmt.Sscanf(a, "127.0.0.1:%d", &port)
		ms = append(ms, &cluster.Member{Id: fmt.Sprintf("m%d", i), Host: "127.0.0.1", Port: int32(port), Kinds: []string{KindDevice, KindGroup}})
	}
	inc.onTopology(ms)
	return inc
}

// TestActivationRefusedWhenTheViewPlacesTheUnitElsewhere: a member
// activates (and serves) a unit only if its own view places it there;
// otherwise the typed ErrNotOwner, which matches ErrUnavailable and is
// CodeUnavailable on the wire, so hosting.Client retries elsewhere. The
// refused activation opens nothing: no directory for the unit appears
// under Root.
func TestActivationRefusedWhenTheViewPlacesTheUnitElsewhere(t *testing.T) {
	a, b := "127.0.0.1:7001", "127.0.0.1:7002"
	inc := viewOf(a, a, b)
	var mine, theirs string
	for i := 0; mine == "" || theirs == ""; i++ {
		g := fmt.Sprintf("tenant%d", i)
		if inc.owner(KindGroup, g) == a {
			mine = g
		} else {
			theirs = g
		}
	}
	if err := inc.check(KindGroup, mine); err != nil {
		t.Fatalf("own unit %s refused: %v", mine, err)
	}
	err := inc.check(KindGroup, theirs)
	if !errors.Is(err, ErrNotOwner) || !errors.Is(err, ErrUnavailable) || codeOf(err) != CodeUnavailable {
		t.Fatalf("unit %s of %s: %v (code %d), want ErrNotOwner/ErrUnavailable/CodeUnavailable", theirs, b, err, codeOf(err))
	}

	root := t.TempDir()
	h := newHost(Config{Root: root, MeshID: fenceMesh, NoSync: true}, a, actortest.System(t), nil)
	t.Cleanup(func() { _ = h.close() })
	ctx := context.Background()
	if _, err := h.acquire(ctx, KindGroup, theirs, func() error { return inc.check(KindGroup, theirs) }); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("acquire of %s: %v, want ErrNotOwner", theirs, err)
	}
	if _, err := os.Stat(unitDir(root, KindGroup, theirs)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused activation created %s: %v", unitDir(root, KindGroup, theirs), err)
	}
	if len(h.hosted()) != 0 {
		t.Fatalf("hosted after a refused activation: %v", h.hosted())
	}
	mustProvision(t, root, KindGroup, mine)
	u, err := h.acquire(ctx, KindGroup, mine, func() error { return inc.check(KindGroup, mine) })
	if err != nil || u.epoch != 1 {
		t.Fatalf("acquire of %s: epoch %v, %v", mine, u, err)
	}

	// The view changes: b left. Every unit is a's now.
	inc.onTopology([]*cluster.Member{{Id: "m0", Host: "127.0.0.1", Port: 7001, Kinds: []string{KindGroup}}})
	if err := inc.check(KindGroup, theirs); err != nil {
		t.Fatalf("after b left, %s refused: %v", theirs, err)
	}
}

// TestFencedMemberRefusesAndServeGatesTheReply: once fenced, check
// refuses every unit with ErrFenced (matching ErrUnavailable), and serve
// reports a success only if the gate still allows it after the operation
// (a reply produced after the member fenced itself is CodeUnavailable,
// so it never counts as acknowledged by a fenced member).
func TestFencedMemberRefusesAndServeGatesTheReply(t *testing.T) {
	a := "127.0.0.1:7001"
	inc := viewOf(a, a)
	inc.fenced.Store(true)
	if err := inc.check(KindGroup, "g"); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("fenced check: %v", err)
	}

	root := t.TempDir()
	mustProvision(t, root, KindGroup, "g")
	h := newHost(Config{Root: root, MeshID: fenceMesh, NoSync: true}, a, actortest.System(t), nil)
	t.Cleanup(func() { _ = h.close() })
	ctx := context.Background()
	u, err := h.acquire(ctx, KindGroup, "g", nil)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	gate := func() error {
		calls++
		if calls > 1 { // fenced while the operation ran
			return fmt.Errorf("%w: test", ErrFenced)
		}
		return nil
	}
	rep := h.serve(ctx, u, &Request{Op: OpDigest}, gate)
	if rep.Code != CodeUnavailable || calls != 2 {
		t.Fatalf("reply after the gate closed: code %d (%s), gate calls %d", rep.Code, rep.Error, calls)
	}
	rep = h.serve(ctx, u, &Request{Op: OpDigest}, func() error { return nil })
	if rep.Code != CodeOK || rep.Epoch != 1 || rep.ActivatedAt == 0 || rep.ServedAt < rep.ActivatedAt || rep.MemberID == "" {
		t.Fatalf("reply: %+v", rep)
	}
}

// TestActivationEpochsIncreaseAcrossHosts: each activation of a unit
// persists the next epoch in its directory (whoever hosts it), and a
// damaged epoch file refuses the activation instead of restarting at 1.
func TestActivationEpochsIncreaseAcrossHosts(t *testing.T) {
	root := t.TempDir()
	ctx := context.Background()
	mustProvision(t, root, KindGroup, "g")
	for want := uint64(1); want <= 3; want++ {
		h := newHost(Config{Root: root, MeshID: fenceMesh, NoSync: true}, fmt.Sprintf("m%d", want), actortest.System(t), nil)
		u, err := h.acquire(ctx, KindGroup, "g", nil)
		if err != nil {
			t.Fatal(err)
		}
		rep := h.serve(ctx, u, &Request{Op: OpInfo}, nil)
		if rep.Epoch != want || u.epoch != want {
			t.Fatalf("activation %d: epoch %d (reply %d)", want, u.epoch, rep.Epoch)
		}
		if err := h.close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(unitDir(root, KindGroup, "g"), epochFile), []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHost(Config{Root: root, MeshID: fenceMesh, NoSync: true}, "m", actortest.System(t), nil)
	t.Cleanup(func() { _ = h.close() })
	if _, err := h.acquire(ctx, KindGroup, "g", nil); err == nil {
		t.Fatal("activation with a damaged epoch file succeeded")
	}
	if len(h.hosted()) != 0 {
		t.Fatalf("hosted after a failed activation: %v", h.hosted())
	}
}

// mustProvision creates a unit for a test tenant.
func mustProvision(t *testing.T, root, kind, identity string) {
	t.Helper()
	if _, err := provision(context.Background(), nil, root, kind, identity, "test", 10, false); err != nil {
		t.Fatal(err)
	}
}

// TestServingDecisionThroughAnOutage drives decideServing with a fake
// clock: the registration is valid until 2.7 s (the last renewal before
// the membership store became unreachable); the member serves until then,
// is suspended at 2.7 s (its units closed: effSuspend once, effRelease
// while it lasts), is not fenced while the provider has not lost the
// registration, and resumes under the same incarnation as soon as
// ValidUntil is in the future again (a renewal accepted at 20 s). A loss
// fences it, once, from either phase.
func TestServingDecisionThroughAnOutage(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	valid := t0.Add(2700 * time.Millisecond)
	var s servingState
	var eff servingEffect
	for d := time.Duration(0); d < 2700*time.Millisecond; d += 50 * time.Millisecond {
		if s, eff = decideServing(s, servingInput{now: t0.Add(d), validUntil: valid}); eff != effNoop || s.suspended {
			t.Fatalf("at %v (valid until 2.7 s): %+v %v, want serving", d, s, eff)
		}
	}
	if s, eff = decideServing(s, servingInput{now: valid, validUntil: valid}); eff != effSuspend || !s.suspended || s.fenced {
		t.Fatalf("at ValidUntil: %+v %v, want suspended (not fenced)", s, eff)
	}
	for d := 3 * time.Second; d < 20*time.Second; d += time.Second {
		if s, eff = decideServing(s, servingInput{now: t0.Add(d), validUntil: valid}); eff != effRelease || s.fenced {
			t.Fatalf("during the outage at %v: %+v %v, want still suspended", d, s, eff)
		}
	}
	renewed := t0.Add(22800 * time.Millisecond)
	if s, eff = decideServing(s, servingInput{now: t0.Add(20200 * time.Millisecond), validUntil: renewed}); eff != effResume || s.suspended {
		t.Fatalf("renewed: %+v %v, want resumed", s, eff)
	}
	if s, eff = decideServing(s, servingInput{now: t0.Add(20250 * time.Millisecond), validUntil: renewed}); eff != effNoop {
		t.Fatalf("after resuming: %+v %v", s, eff)
	}
	for _, start := range []servingState{{}, {suspended: true}} {
		f, eff := decideServing(start, servingInput{lost: true})
		if eff != effFence || !f.fenced {
			t.Fatalf("lost from %+v: %+v %v, want fenced", start, f, eff)
		}
		if f2, eff := decideServing(f, servingInput{now: t0, validUntil: renewed}); eff != effNoop || f2 != f {
			t.Fatalf("a fenced incarnation resumed: %+v %v", f2, eff)
		}
	}
	// A zero ValidUntil (the provider has no registration) suspends.
	if _, eff = decideServing(servingState{}, servingInput{now: t0}); eff != effSuspend {
		t.Fatalf("zero ValidUntil: %v, want effSuspend", eff)
	}
}

// TestServingNeverPastValidUntil: whatever the ticks and validity windows,
// a member in the serving phase after a step has now < ValidUntil, and
// check refuses a unit whenever the clock is at or past it.
func TestServingNeverPastValidUntil(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		t0 := time.Unix(1_000_000, 0)
		var s servingState
		now := t0
		for i, n := 0, rapid.IntRange(1, 50).Draw(t, "n"); i < n; i++ {
			now = now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(t, "dt")) * time.Millisecond)
			valid := now.Add(time.Duration(rapid.IntRange(-3000, 3000).Draw(t, "v")) * time.Millisecond)
			lost := rapid.IntRange(0, 20).Draw(t, "lost") == 0
			s, _ = decideServing(s, servingInput{now: now, validUntil: valid, lost: lost})
			if !s.fenced && !s.suspended && !now.Before(valid) {
				t.Fatalf("serving at %v with ValidUntil %v", now.Sub(t0), valid.Sub(t0))
			}
		}
	})
}

type fakeFencing struct{ until time.Time }

func (f *fakeFencing) Lost() <-chan struct{} { return make(chan struct{}) }
func (f *fakeFencing) ValidUntil() time.Time { return f.until }

// TestCheckRefusesPastValidUntilWithoutFencing: past ValidUntil a unit
// is refused (ErrFenced, an ErrUnavailable) but the incarnation is not
// fenced: once the registration is renewed the same incarnation serves
// again.
func TestCheckRefusesPastValidUntilWithoutFencing(t *testing.T) {
	a := "127.0.0.1:7001"
	inc := viewOf(a, a)
	f := &fakeFencing{until: time.Now().Add(-time.Millisecond)}
	inc.c.fencing = f
	if err := inc.check(KindGroup, "g"); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("past ValidUntil: %v, want ErrFenced", err)
	}
	time.Sleep(20 * time.Millisecond)
	if inc.fenced.Load() {
		t.Fatal("the incarnation fenced itself on a lapsed validity")
	}
	f.until = time.Now().Add(time.Minute)
	if err := inc.check(KindGroup, "g"); err != nil {
		t.Fatalf("renewed: %v", err)
	}
}

// TestRejoinDelayIsShort: after a failed start (the provider had
// reported itself ready) the next attempt follows within 2 s.
func TestRejoinDelayIsShort(t *testing.T) {
	prev := time.Duration(0)
	for a := 0; a < 20; a++ {
		d := rejoinDelay(a)
		if d <= 0 || d > 2*time.Second || d < prev {
			t.Fatalf("attempt %d: %v (previous %v)", a, d, prev)
		}
		prev = d
	}
}
