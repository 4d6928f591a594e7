package session_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var bg = context.Background()

type sent struct {
	env []byte
	pt  string
}

// exchange sends n messages each way in rounds, delivering each round in
// a random order and holding a few envelopes back to a later round (old
// chains), and checks that every message decrypts exactly once and every
// replay is refused.
func exchange(t *testing.T, a, b *node, n, round int, rng *rand.Rand, tag string) {
	t.Helper()
	var heldAB, heldBA []sent
	decrypted := map[string]int{}
	deliver := func(to *node, from messages.DeviceAddress, batch []sent) {
		for _, s := range batch {
			mustDecrypt(t, to, from, s.env, s.pt)
			decrypted[s.pt]++
		}
	}
	for start := 0; start < n; start += round {
		var ab, ba []sent
		for i := start; i < start+round && i < n; i++ {
			pt := fmt.Sprintf("%s a→b %d", tag, i)
			ab = append(ab, sent{mustEncrypt(t, a, b.addr, pt), pt})
		}
		rng.Shuffle(len(ab), func(i, j int) { ab[i], ab[j] = ab[j], ab[i] })
		// Hold back a few for the next round.
		k := len(ab) / 10
		deliver(b, a.addr, append(heldAB, ab[k:]...))
		heldAB = ab[:k]

		for i := start; i < start+round && i < n; i++ {
			pt := fmt.Sprintf("%s b→a %d", tag, i)
			ba = append(ba, sent{mustEncrypt(t, b, a.addr, pt), pt})
		}
		rng.Shuffle(len(ba), func(i, j int) { ba[i], ba[j] = ba[j], ba[i] })
		k = len(ba) / 10
		deliver(a, b.addr, append(heldBA, ba[k:]...))
		heldBA = ba[:k]

		// Replays of a sample of this round are refused.
		for _, s := range ab[k : k+3] {
			if _, err := b.m.Decrypt(bg, a.addr, s.env); !errors.Is(err, ratchet.ErrReplay) {
				t.Fatalf("replay a→b: %v, want ErrReplay", err)
			}
		}
		for _, s := range ba[k : k+3] {
			if _, err := a.m.Decrypt(bg, b.addr, s.env); !errors.Is(err, ratchet.ErrReplay) {
				t.Fatalf("replay b→a: %v, want ErrReplay", err)
			}
		}
	}
	deliver(b, a.addr, heldAB)
	deliver(a, b.addr, heldBA)
	if len(decrypted) != 2*n {
		t.Fatalf("%d distinct messages decrypted, want %d", len(decrypted), 2*n)
	}
	for pt, c := range decrypted {
		if c != 1 {
			t.Fatalf("%q decrypted %d times", pt, c)
		}
	}
}

func TestThousandMessagesEachWayReorderedReplaysRefused(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	// First contact: alice initiates, bob answers.
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "hello"), "hello")
	mustDecrypt(t, a, b.addr, mustEncrypt(t, b, a.addr, "hi"), "hi")
	exchange(t, a, b, 1000, 100, rand.New(rand.NewPCG(1, 2)), "x")
}

func TestBitFlippedEnvelopeRefusedStateUnchanged(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "hello"), "hello")
	mustDecrypt(t, a, b.addr, mustEncrypt(t, b, a.addr, "hi"), "hi")
	env := mustEncrypt(t, a, b.addr, "secret")
	before := storedSession(t, b.store, a.addr)
	for _, bit := range []int{len(env)*8 - 1, len(env) * 4, 40, 8} {
		bad := bytes.Clone(env)
		bad[bit/8] ^= 1 << (bit % 8)
		if _, err := b.m.Decrypt(bg, a.addr, bad); err == nil {
			t.Fatalf("bit %d flipped: accepted", bit)
		}
		if after := storedSession(t, b.store, a.addr); !bytes.Equal(before, after) {
			t.Fatalf("bit %d flipped: stored session changed", bit)
		}
	}
	// Garbage never panics and never changes state.
	for _, junk := range [][]byte{nil, {}, {0x80}, bytes.Repeat([]byte{0xff}, 100), env[:len(env)/2]} {
		if _, err := b.m.Decrypt(bg, a.addr, junk); err == nil {
			t.Fatalf("junk %x accepted", junk)
		}
	}
	if after := storedSession(t, b.store, a.addr); !bytes.Equal(before, after) {
		t.Fatal("junk changed the stored session")
	}
	mustDecrypt(t, b, a.addr, env, "secret")
}

// TestIdentityChangeRefusedThenAccepted: the first identity seen is pinned;
// another one is refused (typed error, state unchanged) on receive and on
// send until the application accepts it.
func TestIdentityChangeRefusedThenAccepted(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "hello"), "hello")
	mustDecrypt(t, a, b.addr, mustEncrypt(t, b, a.addr, "hi"), "hi")
	oldBob := b.m.Identity()

	// Bob reinstalls: same address, new identity and store.
	b2 := ms.add(bobAddr, nil, nil)
	if b2.m.Identity() == oldBob {
		t.Fatal("reinstalled bob has the old identity")
	}
	// Receive path: bob2 initiates to alice.
	env := mustEncrypt(t, b2, a.addr, "new phone")
	before := storedSession(t, a.store, b.addr)
	_, err := a.m.Decrypt(bg, b.addr, env)
	var ic *session.IdentityChangedError
	if !errors.As(err, &ic) || ic.Pinned != oldBob || ic.Seen != b2.m.Identity() || ic.Peer != bobAddr {
		t.Fatalf("Decrypt from changed identity: %v", err)
	}
	var ric *ratchet.IdentityChangedError
	if !errors.As(err, &ric) {
		t.Fatalf("error does not unwrap to the ratchet's: %v", err)
	}
	if _, err := a.m.Receive(bg, b.addr, env); !errors.As(err, &ic) {
		t.Fatalf("Receive from changed identity: %v", err)
	}
	if !bytes.Equal(before, storedSession(t, a.store, b.addr)) {
		t.Fatal("refused identity changed alice's stored session")
	}
	// The old session still works while the change is refused.
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "still old"), "still old")

	// Send path: alice starts over with bob (e.g. his old session is
	// gone): the fetched bundle carries the new identity and is refused.
	if err := a.m.ResetSession(bg, b.addr); err != nil {
		t.Fatal(err)
	}
	if _, err := a.m.Encrypt(bg, b.addr, []byte("x")); !errors.As(err, &ic) || ic.Seen != b2.m.Identity() {
		t.Fatalf("Encrypt to changed identity: %v", err)
	}
	if s := storedSession(t, a.store, b.addr); s != nil {
		t.Fatal("refused bundle stored a session")
	}

	// The application accepts the new identity.
	if err := a.m.AcceptIdentity(bg, b.addr, b2.m.Identity()); err != nil {
		t.Fatal(err)
	}
	mustDecrypt(t, a, b.addr, env, "new phone")
	mustDecrypt(t, b2, a.addr, mustEncrypt(t, a, b.addr, "welcome back"), "welcome back")
	mustDecrypt(t, a, b.addr, mustEncrypt(t, b2, a.addr, "thanks"), "thanks")
}

// fixedBundle is a transport that always hands out the same bundle.
type fixedBundle struct {
	session.Transport
	bundle *messages.PrekeyBundle
}

func (f fixedBundle) FetchBundle(context.Context, messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	return f.bundle, nil
}

// TestOneTimePrekeyReuseRefused: a bundle's one-time prekey completes one
// initiation only (PQXDH §3.4); a second initiator using the same bundle
// is refused, end to end.
func TestOneTimePrekeyReuseRefused(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, nil, nil)
	bundle, err := b.m.Bundle(bg)
	if err != nil {
		t.Fatal(err)
	}
	if bundle.OneTimePrekey == nil {
		t.Fatal("bundle without a one-time prekey")
	}
	a := ms.add(aliceAddr, nil, func(c *session.Config) { c.Transport = fixedBundle{c.Transport, bundle} })
	c := ms.add(carolAddr, nil, func(c *session.Config) { c.Transport = fixedBundle{c.Transport, bundle} })
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "first"), "first")
	before := storedPrekeys(t, b.store)
	env := mustEncrypt(t, c, b.addr, "second")
	if _, err := b.m.Decrypt(bg, c.addr, env); !errors.Is(err, ratchet.ErrUnknownPrekey) {
		t.Fatalf("reused one-time prekey: %v, want ErrUnknownPrekey", err)
	}
	if !bytes.Equal(before, storedPrekeys(t, b.store)) || storedSession(t, b.store, c.addr) != nil {
		t.Fatal("refused initiation changed bob's state")
	}
	ps, err := ratchet.UnmarshalPrekeyStore(storedPrekeys(t, b.store))
	if err != nil {
		t.Fatal(err)
	}
	if ps.HasOneTime(bundle.OneTimePrekey.ID) {
		t.Fatal("consumed one-time prekey still held")
	}
}

// TestConcurrentInitiationsMergePrekeys: two initiations from two peers
// are decrypted concurrently, by two peer actors, against the same stored
// prekey store; both commits keep both consumptions (no lost update: the
// committer applies each consumption to the stored store).
func TestConcurrentInitiationsMergePrekeys(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, nil, nil)
	a := ms.add(aliceAddr, nil, nil)
	c := ms.add(carolAddr, nil, nil)
	envA := mustEncrypt(t, a, b.addr, "from a")
	envC := mustEncrypt(t, c, b.addr, "from c")
	var wg sync.WaitGroup
	pts := make([][]byte, 2)
	errs := make([]error, 2)
	for i, in := range []struct {
		from messages.DeviceAddress
		env  []byte
	}{{a.addr, envA}, {c.addr, envC}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pts[i], errs[i] = b.m.Decrypt(bg, in.from, in.env)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || string(pts[0]) != "from a" || string(pts[1]) != "from c" {
		t.Fatalf("concurrent initiations: %q %q, %v %v", pts[0], pts[1], errs[0], errs[1])
	}
	ps, err := ratchet.UnmarshalPrekeyStore(storedPrekeys(t, b.store))
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range [][]byte{envA, envC} {
		e, err := messages.DecodeEnvelope(env)
		if err != nil {
			t.Fatal(err)
		}
		if id := e.Initiation.OneTimePrekeyID; id == nil || ps.HasOneTime(*id) {
			t.Fatalf("one-time prekey %v not consumed", id)
		}
	}
	mustDecrypt(t, a, b.addr, mustEncrypt(t, b, a.addr, "to a"), "to a")
	mustDecrypt(t, c, b.addr, mustEncrypt(t, b, c.addr, "to c"), "to c")
}

// TestPrekeyRotationSchedule: with the injected clock, the signed prekey
// rotates after 7 days; an initiation from an old bundle still completes
func TestRestartOnBoltContinuesBothWays(t *testing.T) {
	dir := t.TempDir()
	var key sealed.Key
	for i := range key {
		key[i] = byte(7 * i)
	}
	open := func(name string) *bolt.DB {
		s, err := sealed.New(key)
		if err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(filepath.Join(dir, name), bolt.Options{Sealer: s, NoSync: false})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	rng := rand.New(rand.NewPCG(3, 4))
	dbA, dbB := open("a.db"), open("b.db")
	ms := newMesh(t)
	a := ms.add(aliceAddr, dbA.Delivery(), nil)
	b := ms.add(bobAddr, dbB.Delivery(), nil)
	idA, idB := a.m.Identity(), b.m.Identity()
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "hello"), "hello")
	exchange(t, a, b, 40, 20, rng, "before")
	inflight := mustEncrypt(t, a, b.addr, "in flight across the restart")

	// Close everything.
	for _, n := range []*node{a, b} {
		if err := n.m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := n.store.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := dbA.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dbB.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen, on a new actor system and network.
	dbA, dbB = open("a.db"), open("b.db")
	defer dbA.Close()
	defer dbB.Close()
	ms2 := newMesh(t)
	a = ms2.add(aliceAddr, dbA.Delivery(), nil)
	b = ms2.add(bobAddr, dbB.Delivery(), nil)
	if a.m.Identity() != idA || b.m.Identity() != idB {
		t.Fatal("identities changed across the restart")
	}
	mustDecrypt(t, b, a.addr, inflight, "in flight across the restart")
	exchange(t, a, b, 40, 20, rng, "after")
}

func TestPassivationStopsIdleActorAndResumesFromStore(t *testing.T) {
	ms := newMesh(t)
	short := func(c *session.Config) { c.IdleTimeout = 50 * time.Millisecond }
	a := ms.add(aliceAddr, nil, short)
	b := ms.add(bobAddr, nil, short)
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "hello"), "hello")
	// At most one actor each (the 50 ms idle timeout may already have
	// passivated one on a loaded machine: no timing assumption here).
	if a.m.LiveSessions() > 1 || b.m.LiveSessions() > 1 {
		t.Fatalf("live sessions: %d %d", a.m.LiveSessions(), b.m.LiveSessions())
	}
	waitIdle := func(n *node) {
		deadline := time.Now().Add(5 * time.Second)
		for n.m.LiveSessions() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: session actor never passivated", n.addr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitIdle(a)
	waitIdle(b)
	// Resumes from the store on demand, both ways, and rejects a replay.
	env := mustEncrypt(t, b, a.addr, "after idle")
	mustDecrypt(t, a, b.addr, env, "after idle")
	if _, err := a.m.Decrypt(bg, b.addr, env); !errors.Is(err, ratchet.ErrReplay) {
		t.Fatalf("replay after passivation: %v", err)
	}
	waitIdle(a)
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "again"), "again")
}

func TestConcurrentEncryptToOnePeer(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	envs := make(chan sent, workers*each)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				pt := fmt.Sprintf("w%d-%d", w, i)
				env, err := a.m.Encrypt(bg, b.addr, []byte(pt))
				if err != nil {
					errs <- err
					return
				}
				envs <- sent{env, pt}
			}
		}()
	}
	wg.Wait()
	close(envs)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var all []sent
	for s := range envs {
		if seen[string(s.env)] {
			t.Fatal("two identical envelopes")
		}
		seen[string(s.env)] = true
		all = append(all, s)
	}
	rand.New(rand.NewPCG(5, 6)).Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	// Decrypt concurrently too.
	var dwg sync.WaitGroup
	derrs := make(chan error, len(all))
	for _, s := range all {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			pt, err := b.m.Decrypt(bg, a.addr, s.env)
			if err == nil && string(pt) != s.pt {
				err = fmt.Errorf("got %q want %q", pt, s.pt)
			}
			derrs <- err
		}()
	}
	dwg.Wait()
	close(derrs)
	for err := range derrs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestPrekeyRotationSchedule: with the injected clock, the signed prekey
// rotates after 7 days; an initiation from an old bundle still completes
// within the 30-day grace and is refused after it.
func TestPrekeyRotationSchedule(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, nil, nil)
	old, err := b.m.Bundle(bg)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := b.m.RefreshPrekeys(bg); err != nil || changed {
		t.Fatalf("early refresh: %v %v", changed, err)
	}
	ms.clock.Advance(7*24*time.Hour + time.Second)
	if changed, err := b.m.RefreshPrekeys(bg); err != nil || !changed {
		t.Fatalf("refresh after 7 days: %v %v", changed, err)
	}
	fresh, err := b.m.Bundle(bg)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.SignedPrekey.ID == old.SignedPrekey.ID {
		t.Fatal("signed prekey did not rotate")
	}
	// Within the grace period the old bundle still works.
	a := ms.add(aliceAddr, nil, func(c *session.Config) { c.Transport = fixedBundle{c.Transport, old} })
	mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, "old bundle"), "old bundle")
	// After it, refused.
	ms.clock.Advance(31 * 24 * time.Hour)
	if _, err := b.m.RefreshPrekeys(bg); err != nil {
		t.Fatal(err)
	}
	old.OneTimePrekey = nil
	c := ms.add(carolAddr, nil, func(c *session.Config) { c.Transport = fixedBundle{c.Transport, old} })
	if _, err := b.m.Decrypt(bg, c.addr, mustEncrypt(t, c, b.addr, "too old")); !errors.Is(err, ratchet.ErrUnknownPrekey) {
		t.Fatalf("expired signed prekey: %v", err)
	}
}

func TestScheduledRefreshRuns(t *testing.T) {
	ms := newMesh(t)
	b := ms.add(bobAddr, nil, func(c *session.Config) {
		c.RefreshInterval = 10 * time.Millisecond
		c.Prekeys = ratchet.DefaultPrekeyConfig()
	})
	first, err := b.m.Bundle(bg)
	if err != nil {
		t.Fatal(err)
	}
	ms.clock.Advance(8 * 24 * time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps, err := ratchet.UnmarshalPrekeyStore(storedPrekeys(t, b.store))
		if err != nil {
			t.Fatal(err)
		}
		if ps.CurrentSignedPrekeyID() != first.SignedPrekey.ID {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("scheduled refresh never rotated the signed prekey")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOneTimePrekeysReplenished: one-time prekeys are replenished and
// never handed out twice; issued ones are evicted (making room) only once
// MinIssuedAge old, so with the clock moving on by that much per bundle
// twenty bundles in a row all carry one.
func TestOneTimePrekeysReplenished(t *testing.T) {
	ms := newMesh(t)
	cfg := ratchet.DefaultPrekeyConfig()
	cfg.OneTimeBatch, cfg.OneTimeThreshold, cfg.MaxOneTime = 4, 2, 8
	cfg.MinIssuedAge = time.Minute
	b := ms.add(bobAddr, nil, func(c *session.Config) { c.Prekeys = cfg })
	ids := map[uint32]bool{}
	for range 20 {
		ms.clock.Advance(time.Minute)
		bundle, err := b.m.Bundle(bg)
		if err != nil {
			t.Fatal(err)
		}
		if bundle.OneTimePrekey == nil {
			t.Fatal("ran out of one-time prekeys")
		}
		if ids[bundle.OneTimePrekey.ID] {
			t.Fatal("one-time prekey handed out twice")
		}
		ids[bundle.OneTimePrekey.ID] = true
	}
}

func TestBadInputAndClosed(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	if _, err := a.m.Encrypt(bg, messages.DeviceAddress{}, []byte("x")); !errors.Is(err, session.ErrInvalidPeer) {
		t.Fatalf("invalid peer: %v", err)
	}
	if _, err := a.m.Encrypt(bg, messages.DeviceAddress{User: "ghost", Device: 1}, []byte("x")); !errors.Is(err, session.ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	if _, err := a.m.Decrypt(bg, bobAddr, []byte{0x84, 1, 2, 3, 4}); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("malformed envelope: %v", err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := a.m.Encrypt(ctx, bobAddr, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := a.m.Receive(ctx, bobAddr, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled receive: %v", err)
	}
	if _, err := session.NewManager(bg, ms.sys, session.Config{}); !errors.Is(err, session.ErrInvalidConfig) {
		t.Fatalf("empty config: %v", err)
	}
	if err := a.m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.m.Encrypt(bg, bobAddr, []byte("x")); !errors.Is(err, session.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if _, err := a.m.Bundle(bg); !errors.Is(err, session.ErrClosed) {
		t.Fatalf("bundle after close: %v", err)
	}
	// The Close rule (persistence.ErrClosed): a second Close returns nil.
	if err := a.m.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestCorruptStoredSessionIsCorrupt(t *testing.T) {
	ms := newMesh(t)
	store := memory.NewDelivery()
	a := ms.add(aliceAddr, store, nil)
	if err := store.Update(bg, func(tx persistence.DeliveryTx) error { return tx.PutSession(bobAddr, []byte{0xa0}) }); err != nil {
		t.Fatal(err)
	}
	if _, err := a.m.Encrypt(bg, bobAddr, []byte("x")); !errors.Is(err, persistence.ErrCorrupt) {
		t.Fatalf("corrupt record: %v", err)
	}
}

func FuzzDecrypt(f *testing.F) {
	ms := newMesh(f)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	f.Add(mustEncrypt(f, a, b.addr, "seed one"))
	f.Add(mustEncrypt(f, a, b.addr, "seed two"))
	f.Add([]byte{})
	f.Add([]byte{0x84, 0x01, 0xf6, 0xf6, 0x40})
	f.Fuzz(func(t *testing.T, env []byte) {
		before := storedSession(t, b.store, a.addr)
		if _, err := b.m.Decrypt(bg, a.addr, env); err != nil {
			if !bytes.Equal(before, storedSession(t, b.store, a.addr)) {
				t.Fatal("failed Decrypt changed state")
			}
		}
	})
}

// TestSimultaneousInitiation: both sides initiate before either received
// anything; after the crossing envelopes both converge on one session and
// go on both ways (ratchet doc, "Simultaneous initiation").
func TestSimultaneousInitiation(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	ea := mustEncrypt(t, a, b.addr, "a first")
	eb := mustEncrypt(t, b, a.addr, "b first")
	mustDecrypt(t, b, a.addr, ea, "a first")
	mustDecrypt(t, a, b.addr, eb, "b first")
	for i := range 5 {
		mustDecrypt(t, b, a.addr, mustEncrypt(t, a, b.addr, fmt.Sprint("a", i)), fmt.Sprint("a", i))
		mustDecrypt(t, a, b.addr, mustEncrypt(t, b, a.addr, fmt.Sprint("b", i)), fmt.Sprint("b", i))
	}
	exchange(t, a, b, 100, 50, rand.New(rand.NewPCG(7, 8)), "sim")
}

func TestSendThroughInProcessTransport(t *testing.T) {
	ms := newMesh(t)
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, nil)
	for i := range 3 {
		if _, err := a.m.Send(bg, b.addr, []byte(fmt.Sprint("m", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := ms.net.Take(b.addr)
	if len(got) != 3 || len(ms.net.Take(b.addr)) != 0 {
		t.Fatalf("inbox: %d envelopes", len(got))
	}
	for i, d := range got {
		if d.From != a.addr {
			t.Fatalf("from %s", d.From)
		}
		mustDecrypt(t, b, d.From, d.Envelope, fmt.Sprint("m", i))
	}
	if _, err := a.m.Send(bg, messages.DeviceAddress{User: "nobody", Device: 1}, []byte("x")); !errors.Is(err, session.ErrUnknownPeer) {
		t.Fatalf("send to unknown: %v", err)
	}
}
