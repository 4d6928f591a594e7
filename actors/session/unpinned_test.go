package session_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// holdingStore holds the next n read transactions once armed, telling
// held about each, until release is closed.
type holdingStore struct {
	persistence.DeliveryStore
	left    atomic.Int64
	held    chan struct{}
	release chan struct{}
}

func (s *holdingStore) View(ctx context.Context, fn func(persistence.DeliveryReader) error) error {
	if s.left.Add(-1) >= 0 {
		s.held <- struct{}{}
		<-s.release
	}
	return s.DeliveryStore.View(ctx, fn)
}

// TestAttackUnpinnedAddressesAreCapped: with
// MaxUnpinnedPeers 4 and four envelopes from four spoofed addresses being
// served (their actors hold on their store read), an envelope from a
// fifth address without a pin is refused at once with ErrTooManyUnpinned
// (and an unpinned_limit notice) and spawns nothing, while pinned alice's
// envelope is still decrypted. Once the four are done, a new address is
// served again.
func TestAttackUnpinnedAddressesAreCapped(t *testing.T) {
	ms := newMesh(t)
	store := &holdingStore{DeliveryStore: memory.NewDelivery(), held: make(chan struct{}, 8), release: make(chan struct{})}
	var mu sync.Mutex
	var refused []messages.DeviceAddress
	alice := ms.add(aliceAddr, nil, nil)
	tweak := func(c *session.Config) {
		c.MaxUnpinnedPeers = 4
		c.OnUndecryptable = func(from messages.DeviceAddress, reason string, _ error) {
			if reason == session.ReasonUnpinnedLimit {
				mu.Lock()
				refused = append(refused, from)
				mu.Unlock()
			}
		}
	}
	bob := ms.add(bobAddr, store, tweak)
	mustDecrypt(t, bob, aliceAddr, mustEncrypt(t, alice, bobAddr, "hello"), "hello")
	mustDecrypt(t, alice, bobAddr, mustEncrypt(t, bob, aliceAddr, "hi"), "hi")
	// bob restarts over his store: no peer actor is live, so alice's next
	// envelope spawns a new one (and meets the cap).
	if err := bob.m.Close(); err != nil {
		t.Fatal(err)
	}
	bob = ms.add(bobAddr, store, tweak)
	store.left.Store(4)
	garbage := []byte{0x82, 0x01, 0x02}
	done := make(chan error, 4)
	for i := range 4 {
		from := messages.DeviceAddress{User: fmt.Sprintf("spoof%d", i), Device: 1}
		if err := bob.m.ReceiveAsync(bg, from, garbage, func(_ session.Received, err error) { done <- err }); err != nil {
			t.Fatalf("spoofed address %d refused under the cap: %v", i, err)
		}
	}
	for range 4 {
		<-store.held
	}
	fifth := messages.DeviceAddress{User: "spoof4", Device: 1}
	if _, err := bob.m.Receive(bg, fifth, garbage); !errors.Is(err, session.ErrTooManyUnpinned) {
		t.Fatalf("fifth unpinned address: %v, want ErrTooManyUnpinned", err)
	}
	if n := bob.m.LiveSessions(); n != 4 {
		t.Fatalf("%d peer actors live, want the 4 being served", n)
	}
	mustDecrypt(t, bob, aliceAddr, mustEncrypt(t, alice, bobAddr, "pinned"), "pinned")
	close(store.release)
	for range 4 {
		if err := <-done; err == nil || errors.Is(err, session.ErrTooManyUnpinned) {
			t.Fatalf("spoofed envelope: %v, want a decode error", err)
		}
	}
	// Their actors hold nothing and stop; the cap frees up.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		_, err := bob.m.Receive(bg, fifth, garbage)
		if err != nil && !errors.Is(err, session.ErrTooManyUnpinned) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("the fifth address after the four finished: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) == 0 || refused[0] != fifth {
		t.Fatalf("unpinned_limit notices: %v", refused)
	}
}
