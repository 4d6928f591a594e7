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
	if _, err := provision(root, kind, identity, "test", 10, false); err != nil {
		t.Fatal(err)
	}
}
