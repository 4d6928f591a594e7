package hosting_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

// The hosting trust boundary in one process (every request through the
// wire round trip): attribution of device-to-device requests, tenant
// authorization, provisioning and quotas. The same checks across member
// processes with mutual TLS: TestTenantsEtcd.

var (
	tenantA = hosting.Principal{Tenant: "tenant-a"}
	tenantB = hosting.Principal{Tenant: "tenant-b"}
)

func as(ctx context.Context, p hosting.Principal) context.Context {
	return hosting.WithPrincipal(ctx, p)
}

// splitRouter sends the units named in own to one placement and every
// other unit to another: an attacker's member whose devices reach the
// victim's cluster.
type splitRouter struct {
	own   map[string]bool
	mine  func() hosting.Placement
	other hosting.Placement
}

func (r splitRouter) Request(ctx context.Context, kind, identity string, req *hosting.Request) (*hosting.Reply, error) {
	if r.own[identity] {
		return r.mine().Request(ctx, kind, identity, req)
	}
	return r.other.Request(ctx, kind, identity, req)
}
func (r splitRouter) Member() string         { return "router" }
func (r splitRouter) Hosted() []hosting.Unit { return nil }
func (r splitRouter) Close() error           { return nil }

// evilMember is a member (its own root, named "evil") hosting its own
// device carol.1, whose transport reaches the victim placement.
func evilMember(t *testing.T, ctx context.Context, victim hosting.Placement, dev string) hosting.Client {
	t.Helper()
	var evil *hosting.Local
	r := splitRouter{own: map[string]bool{dev: true}, mine: func() hosting.Placement { return evil }, other: victim}
	evil = newLocal(t, t.TempDir(), hosting.WithMemberName("evil"), hosting.WithRouter(r))
	c := hosting.Client{P: evil}
	if _, err := c.Create(as(ctx, hosting.Principal{Tenant: "mallory"}), hosting.KindDevice, dev); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDeliveryAsAnotherMembersDeviceIsRefused: a member that hosts a
// device it calls carol.1 cannot deliver to bob as the carol.1 the victim
// cluster hosts (nor fetch bob's bundle as her): the victim places
// carol.1 on itself, not on the caller. Bob pins nothing, and the real
// carol's message is then delivered.
func TestDeliveryAsAnotherMembersDeviceIsRefused(t *testing.T) {
	ctx := testCtx(t)
	victim := newLocal(t, t.TempDir(), hosting.WithMemberName("m1"))
	bank := as(ctx, hosting.Principal{Tenant: "bank"})
	create(t, bank, victim, hosting.KindDevice, "bob.1", "carol.1")
	bob, carol := messages.DeviceAddress{User: "bob", Device: 1}, messages.DeviceAddress{User: "carol", Device: 1}

	evil := evilMember(t, ctx, victim, "carol.1")
	_, err := evil.Send(as(ctx, hosting.Principal{Tenant: "mallory"}), carol, bob, messages.LogicalMessageID{9}, []byte("please wire 100 EUR to mallory"))
	if !errors.Is(err, runtime.ErrNotHandedOff) {
		t.Fatalf("spoofed send as carol.1: %v, want ErrNotHandedOff (refused by bob's host)", err)
	}
	c := hosting.Client{P: victim}
	if _, err := c.Send(bank, carol, bob, messages.LogicalMessageID{1}, []byte("hi bob")); err != nil {
		t.Fatalf("the real carol: %v", err)
	}
	pend, err := c.Pending(bank, bob)
	if err != nil || len(pend) != 1 || string(pend[0].Body) != "hi bob" || pend[0].Peer != carol {
		t.Fatalf("bob's pending: %+v %v, want only the real carol's message", pend, err)
	}

	// The raw requests, as a member would send them: refused, typed.
	for _, op := range []hosting.Op{hosting.OpDeliver, hosting.OpBundle} {
		_, err := victim.Request(ctx, hosting.KindDevice, "bob.1", &hosting.Request{Op: op, Peer: &carol, Envelope: []byte{1}, Caller: "evil"})
		if !errors.Is(err, hosting.ErrForbidden) {
			t.Fatalf("%s as carol.1 from member evil: %v, want ErrForbidden", op, err)
		}
	}
}

// recorder is a Placement that keeps a copy of every envelope delivered
// through it.
type recorder struct {
	p    func() hosting.Placement
	mu   sync.Mutex
	envs [][]byte
}

func (r *recorder) Request(ctx context.Context, kind, identity string, req *hosting.Request) (*hosting.Reply, error) {
	if req != nil && req.Op == hosting.OpDeliver {
		r.mu.Lock()
		r.envs = append(r.envs, append([]byte(nil), req.Envelope...))
		r.mu.Unlock()
	}
	return r.p().Request(ctx, kind, identity, req)
}
func (r *recorder) Member() string         { return "recorder" }
func (r *recorder) Hosted() []hosting.Unit { return nil }
func (r *recorder) Close() error           { return nil }

// TestSpoofedDeliveriesDoNotDrainTheSendersBudget: deliveries under
// alice's address from a member that does not host her — altered copies
// of her real envelope, each a failed decrypt charged to the sender — are
// refused before bob's node sees them, so they cost alice's decrypt
// budget nothing: her genuine message right after a burst of them is
// delivered.
func TestSpoofedDeliveriesDoNotDrainTheSendersBudget(t *testing.T) {
	ctx := testCtx(t)
	var victim *hosting.Local
	rec := &recorder{p: func() hosting.Placement { return victim }}
	victim = newLocal(t, t.TempDir(), hosting.WithMemberName("m1"), hosting.WithRouter(rec))
	create(t, ctx, victim, hosting.KindDevice, "alice.1", "bob.1")
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 1}
	c := hosting.Client{P: victim}
	if _, err := c.Send(ctx, alice, bob, messages.LogicalMessageID{1}, []byte("first")); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	if len(rec.envs) == 0 {
		rec.mu.Unlock()
		t.Fatal("no envelope recorded")
	}
	real := rec.envs[len(rec.envs)-1]
	rec.mu.Unlock()
	refused := 0
	for i := 0; i < 100; i++ {
		env := append([]byte(nil), real...)
		env[len(env)-1-i%16] ^= 0x01 // a ciphertext that fails authentication
		_, err := victim.Request(ctx, hosting.KindDevice, "bob.1", &hosting.Request{Op: hosting.OpDeliver, Peer: &alice, Envelope: env, Caller: "evil"})
		if errors.Is(err, hosting.ErrForbidden) {
			refused++
		}
	}
	if _, err := c.Send(ctx, alice, bob, messages.LogicalMessageID{2}, []byte("second")); err != nil {
		t.Fatalf("alice's genuine message after 100 spoofed deliveries: %v", err)
	}
	pend, err := c.Pending(ctx, bob)
	if err != nil || len(pend) != 2 {
		t.Fatalf("bob's pending: %+v %v", pend, err)
	}
	if refused != 100 {
		t.Fatalf("%d of 100 spoofed deliveries refused as ErrForbidden", refused)
	}
}

// TestTenantCannotActOnAnotherTenantsUnits: tenant A cannot read, commit,
// discard, send as, create, delete or otherwise touch tenant B's units;
// each attempt is ErrForbidden and B's state is unchanged.
func TestTenantCannotActOnAnotherTenantsUnits(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir())
	ca, cb := as(ctx, tenantA), as(ctx, tenantB)
	create(t, cb, l, hosting.KindDevice, "b1.1", "b2.1")
	create(t, cb, l, hosting.KindGroup, "bgroup")
	create(t, ca, l, hosting.KindDevice, "a1.1")
	b1, b2, a1 := messages.DeviceAddress{User: "b1", Device: 1}, messages.DeviceAddress{User: "b2", Device: 1}, messages.DeviceAddress{User: "a1", Device: 1}
	c := hosting.Client{P: l}
	id := messages.LogicalMessageID{7}
	if _, err := c.Send(cb, b2, b1, id, []byte("b's secret")); err != nil {
		t.Fatal(err)
	}
	attempts := map[string]func() error{
		"read pending":      func() error { _, err := c.Pending(ca, b1); return err },
		"read pending sent": func() error { _, err := c.PendingSent(ca, b2); return err },
		"processed lookup":  func() error { _, _, err := c.Processed(ca, b1, b2, id); return err },
		"commit":            func() error { _, err := c.Commit(ca, b1, b2, id); return err },
		"discard":           func() error { _, err := c.Discard(ca, b1, b2, id, runtime.DiscardMalformed); return err },
		"send as":           func() error { _, err := c.Send(ca, b1, a1, messages.LogicalMessageID{8}, []byte("as b1")); return err },
		"create b's unit":   func() error { _, err := c.Create(ca, hosting.KindDevice, "b1.1"); return err },
		"delete b's unit":   func() error { return c.Delete(ca, hosting.KindDevice, "b1.1") },
		"b's group digest":  func() error { _, _, _, err := c.Digest(ca, "bgroup"); return err },
		"b's group trust":   func() error { return c.Trust(ca, "bgroup", writer(t).Key()) },
		"no principal":      func() error { _, err := c.Pending(context.Background(), b1); return err },
	}
	for name, f := range attempts {
		if err := f(); !errors.Is(err, hosting.ErrForbidden) {
			t.Errorf("tenant A: %s: %v, want ErrForbidden", name, err)
		}
	}
	pend, err := c.Pending(cb, b1)
	if err != nil || len(pend) != 1 || string(pend[0].Body) != "b's secret" {
		t.Fatalf("b1's pending after A's attempts: %+v %v", pend, err)
	}
	if _, ok, err := c.Processed(cb, b1, b2, id); err != nil || ok {
		t.Fatalf("b1 processed after A's attempts: %v %v", ok, err)
	}
	if sent, err := c.PendingSent(cb, b2); err != nil || len(sent) != 1 {
		t.Fatalf("b2 pending sent after A's attempts: %+v %v", sent, err)
	}
	if sent, err := c.PendingSent(cb, b1); err != nil || len(sent) != 0 {
		t.Fatalf("b1 sent something as A: %+v %v", sent, err)
	}
	// The owner still can.
	if res, err := c.Commit(cb, b1, b2, id); err != nil || res.Status != uint8(runtime.Committed) {
		t.Fatalf("B commits: %+v %v", res, err)
	}
}

// unitDirs counts the unit directories under root.
func unitDirs(t *testing.T, root string) int {
	t.Helper()
	n := 0
	for _, kind := range []string{hosting.KindDevice, hosting.KindGroup} {
		ents, err := os.ReadDir(filepath.Join(root, kind))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		n += len(ents)
	}
	return n
}

// TestUnitsExistOnlyWhenCreated: a send to an address nobody created, or
// a read of one, makes no unit (no directory, nothing open): the read is
// ErrNotProvisioned, the send stays pending at its sender.
func TestUnitsExistOnlyWhenCreated(t *testing.T) {
	ctx := testCtx(t)
	root := t.TempDir()
	l := newLocal(t, root)
	create(t, ctx, l, hosting.KindDevice, "alice.1")
	c := hosting.Client{P: l}
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	for i := 0; i < 20; i++ {
		ghost := messages.DeviceAddress{User: fmt.Sprintf("ghost%d", i), Device: 1}
		if _, err := c.Send(ctx, alice, ghost, messages.LogicalMessageID{byte(i)}, []byte("x")); !errors.Is(err, runtime.ErrNotHandedOff) {
			t.Fatalf("send to %s: %v, want ErrNotHandedOff", ghost, err)
		}
		if _, err := c.Pending(ctx, ghost); !errors.Is(err, hosting.ErrNotProvisioned) {
			t.Fatalf("pending of %s: %v, want ErrNotProvisioned", ghost, err)
		}
		if _, err := c.Info(ctx, hosting.KindGroup, fmt.Sprintf("nogroup%d", i)); !errors.Is(err, hosting.ErrNotProvisioned) {
			t.Fatalf("info of an unknown group: %v, want ErrNotProvisioned", err)
		}
	}
	if n := unitDirs(t, root); n != 1 {
		t.Fatalf("%d unit directories after sends and reads naming 40 unknown units, want 1 (alice)", n)
	}
	if h := l.Hosted(); len(h) != 1 {
		t.Fatalf("open units: %v, want alice only", h)
	}
}

// dirBytes sums the disk space (allocated blocks) of the files under
// root: bbolt files are sparse, their apparent size is not what they use.
func dirBytes(t *testing.T, root string) int64 {
	t.Helper()
	var n int64
	err := filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func heap() uint64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestCreateFloodStaysWithinQuotaAndDeleteReclaims: a tenant creating
// units past its quota gets ErrQuota (nothing made), another tenant is
// not affected, and deleting the units returns their disk and memory
// (measured and printed).
func TestCreateFloodStaysWithinQuotaAndDeleteReclaims(t *testing.T) {
	const quota = 20
	ctx := testCtx(t)
	root := t.TempDir()
	l, err := hosting.NewLocal(hosting.Config{Root: root, MeshID: testMesh, NoSync: true, TenantQuota: quota}, nil, hosting.WithWireRoundTrip())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	c := hosting.Client{P: l}
	create(t, as(ctx, tenantB), l, hosting.KindDevice, "bee.1")
	disk0, heap0 := dirBytes(t, root), heap()
	ca := as(ctx, tenantA)
	made, over := 0, 0
	for i := 0; i < quota+10; i++ {
		_, err := c.Create(ca, hosting.KindDevice, fmt.Sprintf("flood%03d.1", i))
		switch {
		case err == nil:
			made++
		case errors.Is(err, hosting.ErrQuota):
			over++
		default:
			t.Fatal(err)
		}
	}
	if made != quota || over != 10 {
		t.Fatalf("flood: %d created, %d over quota; want %d and 10", made, over, quota)
	}
	if n := unitDirs(t, root); n != quota+1 {
		t.Fatalf("%d unit directories, want %d", n, quota+1)
	}
	if _, err := c.Create(as(ctx, tenantB), hosting.KindDevice, "bee.2"); err != nil {
		t.Fatalf("tenant B past A's flood: %v", err)
	}
	disk1, heap1 := dirBytes(t, root), heap()
	for i := 0; i < quota; i++ {
		if err := c.Delete(ca, hosting.KindDevice, fmt.Sprintf("flood%03d.1", i)); err != nil {
			t.Fatal(err)
		}
	}
	disk2, heap2 := dirBytes(t, root), heap()
	t.Logf("flood of %d units (quota %d): disk %d → %d → %d bytes after delete; heap %d → %d → %d KiB after delete",
		quota+10, quota, disk0, disk1, disk2, heap0>>10, heap1>>10, heap2>>10)
	fmt.Printf("hosting flood: %d units, disk +%d KiB, heap +%d KiB; after delete disk %+d KiB, heap %+d KiB vs before\n",
		quota, (disk1-disk0)>>10, int64(heap1-heap0)>>10, (disk2-disk0)>>10, (int64(heap2)-int64(heap0))>>10)
	if n := unitDirs(t, root); n != 2 {
		t.Fatalf("%d unit directories after deleting the flood, want 2 (B's)", n)
	}
	if len(l.Hosted()) != 2 {
		t.Fatalf("open after delete: %v", l.Hosted())
	}
	// B's unit was created after the flood's: its files stay, and the
	// flood's are gone (the quota markers are a few empty files).
	if disk2 > disk0+(disk1-disk0)/quota*2 {
		t.Fatalf("disk after delete %d bytes, before the flood %d (flood %d)", disk2, disk0, disk1)
	}
	// The quota is free again.
	if _, err := c.Create(ca, hosting.KindDevice, "again.1"); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
	if _, err := c.Pending(ca, messages.DeviceAddress{User: "flood000", Device: 1}); !errors.Is(err, hosting.ErrNotProvisioned) {
		t.Fatalf("a deleted unit: %v, want ErrNotProvisioned", err)
	}
}

// TestClientDiscardPruneProcessed: a hosted application discards a
// message it cannot apply (the sender gets its ACK), finds it processed
// as discarded, and prunes processed records.
func TestClientDiscardPruneProcessed(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir())
	create(t, ctx, l, hosting.KindDevice, "alice.1", "bob.1")
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 1}
	c := hosting.Client{P: l}
	id := messages.LogicalMessageID{3}
	if _, err := c.Send(ctx, alice, bob, id, []byte("{malformed")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Discard(ctx, bob, alice, id, runtime.DiscardMalformed)
	if err != nil || !res.AckSent {
		t.Fatalf("discard: %+v %v", res, err)
	}
	if pend, err := c.Pending(ctx, bob); err != nil || len(pend) != 0 {
		t.Fatalf("pending after discard: %+v %v", pend, err)
	}
	p, ok, err := c.Processed(ctx, bob, alice, id)
	if err != nil || !ok || p.Status != uint8(persistence.FinalizationDiscarded) {
		t.Fatalf("processed: %+v %v %v", p, ok, err)
	}
	if sent, err := c.PendingSent(ctx, alice); err != nil || len(sent) != 0 {
		t.Fatalf("alice still waits for the ACK: %+v %v", sent, err)
	}
	if _, err := c.Discard(ctx, bob, alice, messages.LogicalMessageID{4}, 200); !errors.Is(err, hosting.ErrBadRequest) {
		t.Fatalf("discard with an undefined reason: %v, want ErrBadRequest", err)
	}
	if _, err := c.Prune(ctx, bob, 0); !errors.Is(err, hosting.ErrBadRequest) {
		t.Fatalf("prune without a retention: %v", err)
	}
	time.Sleep(5 * time.Millisecond)
	n, err := c.Prune(ctx, bob, time.Millisecond)
	if err != nil || n != 1 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if _, ok, err := c.Processed(ctx, bob, alice, id); err != nil || ok {
		t.Fatalf("processed after prune: %v %v", ok, err)
	}
}

// TestClientChangeFeed: a hosted application follows a group's row
// changes through the Client (a long poll per call), resuming after the
// last sequence it got; another tenant cannot read the feed.
func TestClientChangeFeed(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir())
	c := hosting.Client{P: l}
	w := writer(t)
	create(t, ctx, l, hosting.KindGroup, "feed")
	if err := c.Trust(ctx, "feed", w.Key()); err != nil {
		t.Fatal(err)
	}
	if err := c.DefineTable(ctx, "feed", scenario.Table); err != nil {
		t.Fatal(err)
	}
	evs, err := w.Events("feed", 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Apply(ctx, "feed", evs); err != nil {
		t.Fatal(err)
	}
	chs, next, err := c.Changes(ctx, "feed", "app", "notes", 0, 3, time.Second)
	if err != nil || len(chs) != 3 || next != chs[2].Seq {
		t.Fatalf("first page: %d changes, next %d, %v", len(chs), next, err)
	}
	rest, next, err := c.Changes(ctx, "feed", "app", "notes", next, 0, time.Second)
	if err != nil || len(rest) != 2 {
		t.Fatalf("second page: %d changes, %v", len(rest), err)
	}
	var text string
	if err := rest[1].Cells["text"].Decode(&text); err != nil || text != "feed note 4" || !rest[1].Exists {
		t.Fatalf("last change: %+v %q %v", rest[1], text, err)
	}
	// Caught up: a short poll returns nothing and the same cursor.
	if none, n2, err := c.Changes(ctx, "feed", "app", "notes", next, 0, 30*time.Millisecond); err != nil || len(none) != 0 || n2 != next {
		t.Fatalf("caught up: %d changes, next %d→%d, %v", len(none), next, n2, err)
	}
	// A long poll returns the change applied while it waits.
	more, err := w.Sign("feed", 1)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _, _ = c.Apply(ctx, "feed", more)
	}()
	got, _, err := c.Changes(ctx, "feed", "app", "notes", next, 0, 20*time.Second)
	if err != nil || len(got) != 1 {
		t.Fatalf("long poll: %d changes, %v", len(got), err)
	}
	if _, _, err := c.Changes(as(ctx, tenantB), "feed", "app", "notes", 0, 0, 0); !errors.Is(err, hosting.ErrForbidden) {
		t.Fatalf("another tenant's feed: %v, want ErrForbidden", err)
	}
}

// TestIdleUnitsPassivate: a Local with an idle timeout closes the units
// that served nothing for that long; their state stays in the root and
// the next request opens them again.
func TestIdleUnitsPassivate(t *testing.T) {
	ctx := testCtx(t)
	l := newLocal(t, t.TempDir(), hosting.WithIdleTimeout(200*time.Millisecond))
	create(t, ctx, l, hosting.KindDevice, "alice.1", "bob.1")
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 1}
	c := hosting.Client{P: l}
	if _, err := c.Send(ctx, alice, bob, messages.LogicalMessageID{1}, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(l.Hosted()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still open after 30 s idle: %v", l.Hosted())
		}
		time.Sleep(50 * time.Millisecond)
	}
	pend, err := c.Pending(ctx, bob)
	if err != nil || len(pend) != 1 || string(pend[0].Body) != "kept" {
		t.Fatalf("bob after passivation: %+v %v", pend, err)
	}
}
