//go:build syncmesh_aeadtrace

package runtime

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
)

// TestNodeRestoreAndCloneSoak is the node-level restore-and-clone soak
// (make test runs the short version; make soak sets SOAK_RESTORE_ROUNDS):
// a (a node with real files, both planes) and b exchange messages both
// ways and a writes rows synced to b, while a is closed and its store
// copied at random moments, restored at random moments from a random
// earlier copy — node.db alone or the whole directory, marks included,
// opened without Config.Restored — and now and then a clone of a (a copy
// of its directory opened beside it, with its device address) runs for a
// few rounds, sending too, while b's envelopes to a's address reach the
// clone. Checked: no AES-GCM (key, nonce) pair is sealed twice (every
// seal recorded through ratchet.ObserveSeals), no HLC of a is held by b
// under two events, every row a wrote and synced is at b at the end, and
// without any ResetSession everything pending heals: every message still
// pending at either side is finalized by its receiver and acknowledged.
// The clone does not write on the sync plane: a clone of a site writing
// beside it shares its clock, which no mark can tell (docs/operations.md).
// atomicCount counts notices from the node's goroutines.
type atomicCount struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCount) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }

func (c *atomicCount) load() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

func TestNodeRestoreAndCloneSoak(t *testing.T) {
	rounds := 40
	if s := os.Getenv("SOAK_RESTORE_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SOAK_RESTORE_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d (SOAK_RESTORE_SEED), %d rounds", seed, rounds)

	var sealMu sync.Mutex
	seals := map[[44]byte]int{}
	reused := 0
	stop, err := ratchet.ObserveSeals(func(key [32]byte, nonce [12]byte) {
		var k [44]byte
		copy(k[:], key[:])
		copy(k[32:], nonce[:])
		sealMu.Lock()
		seals[k]++
		if seals[k] == 2 {
			reused++
		}
		sealMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	ctx := context.Background()
	net := NewNetwork(seed)
	dir := t.TempDir()
	aAddr, bAddr := DeviceAddress{User: "a", Device: 1}, DeviceAddress{User: "b", Device: 1}
	openAt := func(d, name string) *testNode {
		t.Helper()
		n, err := Open(ctx, Config{Dir: d, MeshID: testMesh, Name: name, NoSync: true, SyncInterval: -1, ReconcileInterval: -1,
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport(name, aAddr), Buffer: 64}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		return &testNode{Node: n, t: t, ctx: ctx}
	}
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1, Wall: time.Now,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("b", bAddr), Buffer: 64}})
	b.define(defT)
	net.Register("b", b.Node)
	net.RegisterDevice("b", b.Node)
	var a *testNode
	var site messages.SiteID
	link := func() {
		t.Helper()
		net.Register("a", a.Node)
		net.RegisterDevice("a", a.Node)
		if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
	}
	a = openAt(dir, "a")
	a.define(defT)
	trustNode(t, a.Node, b.Node)
	trustNode(t, b.Node, a.Node)
	site = a.Identity().Site
	if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(site)); err != nil {
		t.Fatal(err)
	}
	link()

	type msgKey struct {
		from DeviceAddress
		id   MessageID
	}
	finalized := map[msgKey]int{}
	// drain commits every message n has ready, waiting up to d for the first.
	drain := func(n *testNode, d time.Duration) int {
		got := 0
		timer := time.NewTimer(d)
		defer timer.Stop()
		for {
			select {
			case m := <-n.Messages():
				if _, err := n.CommitMessage(ctx, m); err != nil {
					t.Fatalf("commit at %s: %v", n.Name(), err)
				}
				finalized[msgKey{m.Sender, m.ID}]++
				got++
				timer.Reset(20 * time.Millisecond)
			case <-timer.C:
				return got
			}
		}
	}
	var copies []string
	written := map[int]bool{}
	restores, wholeDir, clones, sent := 0, 0, 0, 0
	var clone *testNode
	cloneLeft := 0
	closeA := func() {
		t.Helper()
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		net.Unregister("a")
	}
	// Sends a rolled-back store lost are reported: at each Open of a
	// node.db restored alone, RestoreStatus.DeliveryLostSends is exactly
	// the sends a accepted since the copy (its outbound sequence then and
	// now, none when the copy holds more); a whole directory restored carries delivery.sent with it and
	// hides them (docs/operations.md). ACKs of lost sends are
	// SentMessageLost notices.
	var lastSeq uint64
	seqAtCopy := map[string]uint64{}
	lostReported, lostExpected := uint64(0), uint64(0)
	var lostAcked atomicCount
	watchLost := func(n *testNode) {
		n.Subscribe(func(x messages.Notice) {
			if _, ok := x.(messages.SentMessageLost); ok {
				lostAcked.add()
			}
		})
	}
	watchLost(a)
	for r := 0; r < rounds; r++ {
		for i := 0; i < 1+rng.IntN(3); i++ {
			sm, err := a.Send(ctx, bAddr, []byte(fmt.Sprintf("a%d.%d", r, i)))
			if err != nil {
				t.Fatalf("round %d: a send: %v", r, err)
			}
			lastSeq = max(lastSeq, sm.Sequence)
			sent++
		}
		if clone != nil {
			if _, err := clone.Send(ctx, bAddr, []byte(fmt.Sprintf("clone%d", r))); err != nil {
				t.Fatalf("round %d: clone send: %v", r, err)
			}
			sent++
		}
		if _, err := b.Send(ctx, aAddr, []byte(fmt.Sprintf("b%d", r))); err != nil {
			t.Fatalf("round %d: b send: %v", r, err)
		}
		sent++
		drain(b, 200*time.Millisecond)
		drain(a, 100*time.Millisecond)
		if clone != nil {
			drain(clone, 50*time.Millisecond)
		}
		if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": r}, map[string]any{"a": r}); err != nil {
			t.Fatalf("round %d: write: %v", r, err)
		}
		written[r] = true
		a.syncNow("b")
		if clone != nil {
			if cloneLeft--; cloneLeft <= 0 {
				if err := clone.Close(); err != nil {
					t.Fatal(err)
				}
				clone = nil
				net.RegisterDevice("a", a.Node) // b's envelopes reach a again
			}
			continue
		}
		switch x := rng.IntN(100); {
		case x < 20:
			closeA()
			c := t.TempDir()
			copyDir(t, dir, c)
			copies = append(copies, c)
			seqAtCopy[c] = lastSeq
			a = openAt(dir, "a")
			watchLost(a)
			link()
		case x < 40 && len(copies) > 0:
			closeA()
			c := copies[rng.IntN(len(copies))]
			var want uint64
			if rng.IntN(2) == 0 {
				copyFile(t, filepath.Join(c, "node.db"), filepath.Join(dir, "node.db"))
				// A copy taken before a whole-directory restore rolled a
				// back can hold more sends than delivery.sent counts now:
				// nothing is counted lost, and the outbound sequence goes
				// on from the store's.
				if lastSeq > seqAtCopy[c] {
					want = lastSeq - seqAtCopy[c]
				}
				lastSeq = max(lastSeq, seqAtCopy[c])
			} else {
				copyDir(t, c, dir)
				wholeDir++
				lastSeq = seqAtCopy[c]
			}
			restores++
			a = openAt(dir, "a")
			watchLost(a)
			got := a.RestoreStatus().DeliveryLostSends
			if got != want {
				t.Fatalf("round %d: the restore reported %d lost sends, want %d", r, got, want)
			}
			lostExpected += want
			lostReported += got
			link()
			a.reconcile("b")
		case x < 50:
			closeA()
			c := t.TempDir()
			copyDir(t, dir, c)
			a = openAt(dir, "a")
			watchLost(a)
			link()
			clone = openAt(c, "aclone")
			net.RegisterDevice("aclone", clone.Node)
			cloneLeft = 1 + rng.IntN(3)
			clones++
		}
	}
	if clone != nil {
		if err := clone.Close(); err != nil {
			t.Fatal(err)
		}
		net.RegisterDevice("a", a.Node)
	}
	a.reconcile("b")
	a.syncNow("b")

	// Healing: no reset, only the retry schedule and the repairs.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		drain(b, 200*time.Millisecond)
		drain(a, 200*time.Millisecond)
		pa, err := a.PendingSentMessages(ctx, 0, 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		pb, err := b.PendingSentMessages(ctx, 0, 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		ia, _ := a.PendingReceivedMessageCount(ctx, nil)
		ib, _ := b.PendingReceivedMessageCount(ctx, nil)
		if len(pa.Messages) == 0 && len(pb.Messages) == 0 && ia == 0 && ib == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healed without a reset: a has %d pending sent, b %d; pending received a %d, b %d",
				len(pa.Messages), len(pb.Messages), ia, ib)
		}
		time.Sleep(100 * time.Millisecond)
	}

	sealMu.Lock()
	nSeals, nReused := len(seals), reused
	sealMu.Unlock()
	twice := 0
	for _, n := range finalized {
		if n > 1 {
			twice++
		}
	}
	hlcReused := 0
	for h, ids := range ownHLCs(t, b.Node, site) {
		if len(ids) != 1 {
			hlcReused++
			t.Errorf("b holds %d events of a at HLC %v", len(ids), h)
		}
	}
	lost := 0
	for id := range written {
		if _, ok := b.get(id); !ok {
			lost++
			t.Errorf("row %d that a wrote and synced is not at b", id)
		}
	}
	t.Logf("rounds %d: %d messages sent, %d finalized (%d more than once, allowed after a rollback), %d restores (%d whole directory), %d clones; %d (key, nonce) pairs sealed, %d reused; %d HLCs reused; %d acknowledged rows lost; %d sends lost by node.db restores, %d reported at Open, %d ACKs of lost sends reported; 0 manual resets",
		rounds, sent, len(finalized), twice, restores, wholeDir, clones, nSeals, nReused, hlcReused, lost, lostExpected, lostReported, lostAcked.load())
	if nReused != 0 {
		t.Fatalf("%d (key, nonce) pairs sealed twice", nReused)
	}
}
