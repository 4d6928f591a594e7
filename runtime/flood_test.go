package runtime

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// forgedInitiation returns an initiation to bob from a throwaway identity
// with its ciphertext flipped: bob pays the whole DH/KEM agreement before
// the AEAD fails.
func forgedInitiation(t *testing.T, ctx context.Context, bob *Node, from DeviceAddress) []byte {
	t.Helper()
	id, err := ratchet.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bob.Bundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ratchet.DefaultConfig()
	rec, _, err := cfg.Initiate(ratchet.SessionRecord{}, id, bundle, ratchet.Route{From: from, To: bob.DeviceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	_, env, err := cfg.Encrypt(rec, []byte("forged"))
	if err != nil {
		t.Fatal(err)
	}
	env[len(env)-1] ^= 0xff
	return env
}

// TestFloodDoesNotStopAlice: over the remote with
// mutual TLS, a third process m (a configured peer hosting mallory.1)
// sends bob 200 forged expensive initiations as mallory.1 and 1 100
// bundle requests while alice sends bob 100 messages. All 100 are
// committed by bob's application and acknowledged to alice. What bob
// spent on the flood is counted, not timed: the decrypt attempts that
// failed stay within mallory's budget (FailedDecryptBurst, the clock
// standing still: no refill), each one initiation (a bounded number of
// DH and KEM operations), and what they computed — X25519, ML-KEM,
// KDF steps, signature checks — stays under the stated bound below,
// DefaultFailedDecryptBurst × (MaxInitiationWork + the prekey load); and m got at most its bundle burst plus the
// refill of the seconds the test ran, the rest refused.
func TestFloodDoesNotStopAlice(t *testing.T) { runIsolated(t, floodDoesNotStopAlice) }

func floodDoesNotStopAlice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	tap := &capturingTransport{}
	clock := newWall()
	rem, alice, bob := remoteDevicePair(t, ca, dir, tap, nil, clock.Now)
	m := startRemoteChild(t, "m", remoteChildSpec{CertDir: ca.issue(t, dir, "m"), RequestTimeout: 10 * time.Second})
	stopChildFirst(t, m, rem, "m")
	if err := rem.AddPeer("m", m.addr); err != nil {
		t.Fatal(err)
	}
	mallory := DeviceAddress{User: "mallory", Device: 1}
	if err := rem.AddDevice(bob, mallory, m.addr); err != nil {
		t.Fatal(err)
	}
	forged, err := wire.EnvelopeOf(&wire.DeviceEnvelope{From: mallory, To: bob.DeviceAddress(), Envelope: forgedInitiation(t, ctx, bob, mallory)})
	if err != nil {
		t.Fatal(err)
	}

	// bob's application commits what it gets.
	committed := map[messages.LogicalMessageID]bool{}
	var mu sync.Mutex
	appDone := make(chan struct{})
	go func() {
		defer close(appDone)
		for msg := range bob.Messages() {
			if _, err := bob.CommitMessage(ctx, msg); err != nil {
				t.Errorf("commit: %v", err)
				return
			}
			mu.Lock()
			committed[msg.ID] = true
			n := len(committed)
			mu.Unlock()
			if n == 100 {
				return
			}
		}
	}()
	start := time.Now()
	var flood sync.WaitGroup
	var bundles remoteReply
	flood.Add(1)
	go func() {
		defer flood.Done()
		if rep := m.call(remoteCmd{Op: "rawsend", Peer: rem.Address(), NoAddPeer: true, Type: forged.Type, CBOR: forged.Cbor, N: 200}); !rep.OK {
			t.Errorf("flood: %s", rep.Err)
		}
		bundles = m.call(remoteCmd{Op: "bundles", Peer: rem.Address(), NoAddPeer: true, Device: bob.DeviceAddress(), N: 1100, Parallel: 16})
	}()
	for i := 0; i < 100; i++ {
		if _, err := alice.Send(ctx, bob.DeviceAddress(), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	<-appDone
	for {
		p, err := alice.PendingSentMessages(ctx, 0, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Messages) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of alice's messages never acknowledged", len(p.Messages))
		case <-time.After(10 * time.Millisecond):
		}
	}
	flood.Wait()
	elapsed := time.Since(start)
	mu.Lock()
	n := len(committed)
	mu.Unlock()
	if n != 100 {
		t.Fatalf("bob committed %d of alice's 100", n)
	}
	// Wait for bob to have decided every forged envelope (its link may
	// still hold some): each either failed or was refused by the budget.
	var c session.DecryptCounters
	for {
		c = bob.device.Sessions().DecryptCounters()
		if c.Failures+c.Refused >= 200 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("bob decided %d of the 200 forged envelopes: %+v", c.Failures+c.Refused, c)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if n := rem.RefusedEnvelopes(); n != 0 {
		t.Fatalf("%d of mallory's envelopes refused by the guard: m is bound to mallory.1", n)
	}
	t.Logf("bob's decrypt work: %+v; m's bundle requests: %d served, %d refused, in %v", c, bundles.Bundles, bundles.Refusals, elapsed)
	// Every failing decrypt is the flood's (alice's all succeed).
	if c.Failures > session.DefaultFailedDecryptBurst {
		t.Fatalf("bob ran %d failing decrypts for the flood, budget %d", c.Failures, session.DefaultFailedDecryptBurst)
	}
	// Initiations bob tried: the failing ones and alice's single one.
	if c.Initiations > session.DefaultFailedDecryptBurst+1 {
		t.Fatalf("bob ran %d initiation agreements, bound %d", c.Initiations, session.DefaultFailedDecryptBurst+1)
	}
	// The stated bound on what the flood cost bob, in operations: each
	// failed attempt at most one initiation's work (MaxInitiationWork:
	// 7 X25519, 1 ML-KEM, 516 KDF steps, 1 signature check at the default
	// caps) plus loading the prekey store (one signed prekey and one KEM
	// prekey: the frozen clock never rotates them), for at most the burst.
	per := ratchet.DefaultConfig().MaxInitiationWork()
	per.Add(ratchet.Work{DH: 1, KEM: 1})
	f, burst := c.FailedWork, uint64(session.DefaultFailedDecryptBurst)
	if f.DH > burst*per.DH || f.KEM > burst*per.KEM || f.KDF > burst*per.KDF || f.Verify > burst*per.Verify {
		t.Fatalf("bob's flood work %+v beyond %d × %+v", f, burst, per)
	}
	// And what it really is: the forged envelopes carry N = 0, so each
	// failed one costs its load (1 DH, 1 KEM), the signature, the
	// agreement (4 DH with the one-time prekey's key object: 5, 1 KEM,
	// 1 HKDF), the ratchet step (1 DH, KDF_RK) and one chain step and
	// message HKDF: 7 DH, 2 KEM, 4 KDF, 1 verify.
	if want := (ratchet.Work{DH: 7 * c.Failures, KEM: 2 * c.Failures, KDF: 4 * c.Failures, Verify: c.Failures}); f != want {
		t.Fatalf("bob's flood work %+v for %d failures, want %+v", f, c.Failures, want)
	}
	if bound := DefaultBundleBurst + int(elapsed.Seconds()*DefaultBundlesPerSecond) + 1; bundles.Bundles > bound || bundles.Bundles+bundles.Refusals != 1100 {
		t.Fatalf("m got %d bundles (%d refused), bound %d", bundles.Bundles, bundles.Refusals, bound)
	}
}
