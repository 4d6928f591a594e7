package session_test

import (
	"context"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// chainOrder fails unless envelopes are in chain order: message numbers
// 0, 1, 2… of one ratchet key.
func chainOrder(t *testing.T, what string, envs [][]byte) {
	t.Helper()
	var dh [32]byte
	for i, raw := range envs {
		env, err := messages.DecodeEnvelope(raw)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			dh = env.Header.DH
		}
		if env.Header.DH != dh || env.Header.N != uint32(i) {
			t.Fatalf("%s: envelope %d of %d reached the transport as message %d (want %d of the first chain): hand-off out of chain order", what, i, len(envs), env.Header.N, i)
		}
	}
}

// TestConcurrentSendsReachTheTransportInChainOrder: 64 concurrent sends
// and 64 concurrent commits (each ACK its own envelope) reach the
// transport in the order they were encrypted, so the receiver never
// stores a skipped key for a reordered hand-off.
func TestConcurrentSendsReachTheTransportInChainOrder(t *testing.T) {
	const n = 64
	ms := newMesh(t)
	alice, bob := ms.add(aliceAddr, nil, nil), ms.add(bobAddr, nil, nil)
	ctx := context.Background()
	ids := make([]messages.LogicalMessageID, n)
	var wg sync.WaitGroup
	for i := range ids {
		ids[i][0], ids[i][1] = byte(i), 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := alice.m.SendMessage(ctx, bobAddr, ids[i], []byte("m")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var envs [][]byte
	for _, d := range ms.net.Take(bobAddr) {
		envs = append(envs, d.Envelope)
	}
	if len(envs) != n {
		t.Fatalf("%d envelopes handed over, want %d", len(envs), n)
	}
	chainOrder(t, "alice's sends", envs)
	var got []messages.LogicalMessageID
	for _, e := range envs {
		r, err := bob.m.Receive(ctx, aliceAddr, e)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.ID)
	}
	for _, id := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := bob.m.Finalize(ctx, aliceAddr, id, persistence.FinalizationCommitted, 0); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	envs = envs[:0]
	for _, d := range ms.net.Take(aliceAddr) {
		envs = append(envs, d.Envelope)
	}
	if len(envs) != n {
		t.Fatalf("%d ACKs handed over, want %d", len(envs), n)
	}
	chainOrder(t, "bob's ACKs", envs)
}
