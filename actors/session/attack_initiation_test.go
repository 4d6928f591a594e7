package session_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Regression tests of the initiation attacks of the delivery plane against
// hostile peers, through the Manager's API: the
// from address each test passes is what the transport authenticated.

// TestAttackReplayedInitiationUnderAnotherAddressIsRefused: replaying
// carol's first envelope as coming from dave.7 must not deliver carol's text
// as dave's, nor pin carol's identity to dave.7; carol's genuine copy still
// establishes her session afterwards.
func TestAttackReplayedInitiationUnderAnotherAddressIsRefused(t *testing.T) {
	ms := newMesh(t)
	bob := ms.add(bobAddr, nil, nil)
	carol := ms.add(carolAddr, nil, nil)
	dave := messages.DeviceAddress{User: "dave", Device: 7}
	bg := context.Background()

	env := mustEncrypt(t, carol, bobAddr, "from carol")
	if pt, err := bob.m.Decrypt(bg, dave, env); err == nil {
		t.Fatalf("carol's initiation replayed as %s was accepted: %q", dave, pt)
	}
	if raw := storedSession(t, bob.store, dave); raw != nil {
		t.Fatalf("a session was stored for %s", dave)
	}
	if pinned := storedPin(t, bob, dave); pinned {
		t.Fatalf("an identity was pinned to %s", dave)
	}
	mustDecrypt(t, bob, carolAddr, env, "from carol")
	// And the session works both ways afterwards.
	mustDecrypt(t, carol, bobAddr, mustEncrypt(t, bob, carolAddr, "hi carol"), "hi carol")
}

// stripOneTime is a transport that serves bundles without their one-time
// prekey, as a hostile bundle server can: initiations are then last-resort
// ones (PQXDH §3.3), which consume nothing on the responder.
type stripOneTime struct{ session.Transport }

func (s stripOneTime) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	b, err := s.Transport.FetchBundle(ctx, peer)
	if err != nil {
		return nil, err
	}
	c := *b
	c.OneTimePrekey = nil
	return &c, nil
}

// TestAttackLastResortInitiationReplayIsRefused: a recorded last-resort
// initiation replayed after ResetSession, after AcceptIdentity, and after
// 297 later sessions (more than the record's archive and retired ids
// hold) is refused and never decrypted again as a new message.
func TestAttackLastResortInitiationReplayIsRefused(t *testing.T) {
	ms := newMesh(t)
	// A small one-time batch keeps the prekey store (rewritten on every
	// bundle) small: 299 sessions stay cheap under -race.
	bob := ms.add(bobAddr, nil, func(c *session.Config) {
		c.Prekeys = ratchet.DefaultPrekeyConfig()
		c.Prekeys.OneTimeBatch, c.Prekeys.OneTimeThreshold, c.Prekeys.MaxOneTime = 4, 1, 8
	})
	alice := ms.add(aliceAddr, nil, func(c *session.Config) { c.Transport = stripOneTime{c.Transport} })
	bg := context.Background()

	recorded := mustEncrypt(t, alice, bobAddr, "transfer 100 EUR")
	mustDecrypt(t, bob, aliceAddr, recorded, "transfer 100 EUR")

	replayRefused := func(when string) {
		t.Helper()
		pt, err := bob.m.Decrypt(bg, aliceAddr, recorded)
		if err == nil {
			t.Fatalf("%s: the recorded initiation was delivered again as new: %q", when, pt)
		}
		if !errors.Is(err, ratchet.ErrReplay) {
			t.Fatalf("%s: replay refused with %v, want ErrReplay", when, err)
		}
	}
	replayRefused("same session")

	if err := bob.m.ResetSession(bg, aliceAddr); err != nil {
		t.Fatal(err)
	}
	replayRefused("after ResetSession")

	if err := bob.m.AcceptIdentity(bg, aliceAddr, alice.m.Identity()); err != nil {
		t.Fatal(err)
	}
	replayRefused("after AcceptIdentity")

	// 297 later sessions, each a fresh last-resort initiation from alice.
	for i := range 297 {
		if err := alice.m.ResetSession(bg, bobAddr); err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("later %d", i)
		mustDecrypt(t, bob, aliceAddr, mustEncrypt(t, alice, bobAddr, msg), msg)
	}
	replayRefused("after 297 later sessions")
	if err := bob.m.ResetSession(bg, aliceAddr); err != nil {
		t.Fatal(err)
	}
	replayRefused("after 297 later sessions and ResetSession")
}

func storedPin(tb testing.TB, n *node, peer messages.DeviceAddress) bool {
	tb.Helper()
	var pinned bool
	if err := n.store.View(context.Background(), func(r persistence.DeliveryReader) error {
		var err error
		_, pinned, err = r.Pin(peer)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return pinned
}
