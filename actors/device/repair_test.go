package device_test

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
)

// A one-sided ResetSession heals by itself: after bob resets his session
// with alice, alice's next message names a session bob no longer holds.
// Bob, who has alice's identity pinned, starts a fresh authenticated
// initiation to her; alice accepts it, and the message still pending at
// alice goes out again on the new session and decrypts at bob — without
// bob's application sending anything and without a manual reset at alice.
func TestOneSidedResetHealsWithoutTheResettingSideSending(t *testing.T) {
	ms := newMesh(t)
	var mu sync.Mutex
	var steps []string
	record := func(who string) func(*device.Config) {
		return func(c *device.Config) {
			c.OnSessionRepair = func(peer messages.DeviceAddress, step string, resent int, err error) {
				mu.Lock()
				defer mu.Unlock()
				steps = append(steps, fmt.Sprintf("%s:%s:%s:%d:%v", who, peer.User, step, resent, err))
			}
		}
	}
	a := ms.add(aliceAddr, record("alice"))
	b := ms.add(bobAddr, record("bob"))
	first := a.send(b, "before the reset")
	b.pump()
	b.commit(a, first.ID)
	a.pump() // the ACK: both sides hold the session

	if err := b.d.Sessions().ResetSession(bg, a.addr); err != nil {
		t.Fatal(err)
	}
	lost := a.send(b, "after the reset")
	_, err := b.recv(b.takeOne())
	if !errors.Is(err, ratchet.ErrUnknownSession) {
		t.Fatalf("first envelope after the reset: %v", err)
	}
	// Alice takes whatever bob sent back (nothing on the old code).
	var replaced bool
	for _, r := range a.pump() {
		if r.SessionReplaced && r.Resent == 1 && r.Kind == device.Acknowledgement && !r.Cleared {
			replaced = true
		}
	}
	var delivered bool
	for _, r := range b.pump() {
		if r.Message != nil && r.Message.ID == lost.ID && string(r.Message.Plaintext) == "after the reset" {
			delivered = true
		}
	}
	if !delivered {
		t.Fatalf("after ResetSession on bob, alice's pending message never decrypted at bob (alice saw a session replacement: %v)", replaced)
	}
	if !replaced {
		t.Fatal("alice's side did not report the replaced session and the resend")
	}
	mu.Lock()
	got := fmt.Sprint(steps)
	mu.Unlock()
	if want := "[bob:alice:started:0:<nil> alice:bob:replaced:1:<nil>]"; got != want {
		t.Fatalf("repair notices %s, want %s", got, want)
	}
	// Both directions work on the new session.
	if r := b.commit(a, lost.ID); !r.AckSent {
		t.Fatalf("commit: %+v", r)
	}
	if acks := a.pump(); len(acks) != 1 || !acks[0].Cleared {
		t.Fatalf("ACK on the new session: %+v", acks)
	}
	back := b.send(a, "bob answers")
	if rs := a.pump(); len(rs) != 1 || rs[0].Message == nil || rs[0].Message.ID != back.ID {
		t.Fatalf("bob → alice on the new session: %+v", rs)
	}
}

// Repairs are rate-limited per peer: a burst of undecryptable envelopes
// from a pinned peer starts one repair per interval, not one per envelope.
func TestSessionRepairIsRateLimited(t *testing.T) {
	ms, a, b := pair(t)
	first := a.send(b, "x")
	b.pump()
	b.commit(a, first.ID)
	a.pump()
	if err := b.d.Sessions().ResetSession(bg, a.addr); err != nil {
		t.Fatal(err)
	}
	// Alice's envelopes on the old session, never delivered to alice's
	// own actor in between (so she does not switch sessions).
	for range 5 {
		a.send(b, "old session")
	}
	for _, e := range b.take() {
		if _, err := b.recv(e); !errors.Is(err, ratchet.ErrUnknownSession) {
			t.Fatalf("receive: %v", err)
		}
	}
	if n := len(a.take()); n != 1 {
		t.Fatalf("%d repair initiations for 5 undecryptable envelopes in one interval, want 1", n)
	}
	ms.clock.Advance(time.Minute)
	a.send(b, "later")
	if _, err := b.recv(b.takeOne()); !errors.Is(err, ratchet.ErrUnknownSession) {
		t.Fatalf("receive: %v", err)
	}
	if n := len(a.take()); n != 1 {
		t.Fatalf("%d repair initiations after the interval, want 1", n)
	}
}

// copyFile returns the bytes of the device's closed bolt file, then opens
// it again (a backup taken while the process was down).
func (v *dev) backup() []byte {
	v.ms.tb.Helper()
	_ = v.d.Close()
	_ = v.db.Close()
	b, err := os.ReadFile(v.path)
	if err != nil {
		v.ms.tb.Fatal(err)
	}
	v.openDB()
	v.start()
	return b
}

// restore puts an earlier backup of the device's file back and starts it.
func (v *dev) restore(b []byte) {
	v.ms.tb.Helper()
	_ = v.d.Close()
	_ = v.db.Close()
	if err := os.WriteFile(v.path, b, 0o600); err != nil {
		v.ms.tb.Fatal(err)
	}
	v.openDB()
	v.start()
}

// A sender whose node.db is restored from an earlier backup sends at chain
// positions the receiver already used; the receiver refuses each as a
// replay. After a few such envelopes in a row it repairs the session, the
// restored sender sends everything its store still holds pending again on
// the new session, and nothing is lost: the message the backup still had
// pending (committed at the receiver meanwhile) is acknowledged again,
// the ones sent after the restore are delivered.
func TestRestoredSenderHealsThroughTheReceiversRepair(t *testing.T) {
	ms := newMesh(t)
	a := ms.addBolt(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	first := a.send(b, "one")
	b.pump()
	b.commit(a, first.ID)
	a.pump()
	second := a.send(b, "two") // pending at alice in the backup
	saved := a.backup()
	b.pump()
	b.commit(a, second.ID)
	a.pump()
	for _, s := range []string{"three", "four"} {
		m := a.send(b, s)
		b.pump()
		b.commit(a, m.ID)
		a.pump()
	}

	a.restore(saved)
	if n := len(a.sentPending()); n != 1 {
		t.Fatalf("%d pending at the restored sender, want 1", n)
	}
	var after []string
	for _, s := range []string{"five", "six", "seven"} {
		after = append(after, a.send(b, s).ID.String())
	}
	refused := 0
	for _, e := range b.take() {
		if _, err := b.recv(e); err != nil {
			refused++
		}
	}
	if refused != 3 {
		t.Fatalf("%d of the restored sender's 3 envelopes refused, want 3 (same chain positions)", refused)
	}
	var resent int
	for _, r := range a.pump() {
		if r.SessionReplaced {
			resent += r.Resent
		}
	}
	if resent != 4 {
		t.Fatalf("the restored sender sent %d pending messages again, want 4 (the backup's one and three new)", resent)
	}
	got := map[string]bool{}
	var ackedAgain bool
	for _, r := range b.pump() {
		if r.Message != nil {
			got[r.Message.ID.String()] = true
			b.commit(a, r.Message.ID)
		}
		if r.ID == second.ID && r.Kind == device.AlreadyCommitted && r.AckSent {
			ackedAgain = true
		}
	}
	for i, id := range after {
		if !got[id] {
			t.Fatalf("message %d sent after the restore never delivered", i)
		}
	}
	if !ackedAgain {
		t.Fatal("the backup's pending message was not acknowledged again")
	}
	a.pump()
	if n := len(a.sentPending()); n != 0 {
		t.Fatalf("%d still pending at the restored sender", n)
	}
}

// A device opened with Restored (the node's restore check suspected its
// store, or the operator said so) does not send on its stored sessions:
// its first envelope to each peer carries a fresh initiation, so nothing
// it sends after the restore is refused, and the message its store still
// holds pending goes out again at Open.
func TestRestoredDeviceReinitiatesBeforeSending(t *testing.T) {
	ms := newMesh(t)
	var mu sync.Mutex
	var steps []string
	a := ms.addBolt(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	first := a.send(b, "one")
	b.pump()
	b.commit(a, first.ID)
	a.pump()
	pending := a.send(b, "two")
	saved := a.backup()
	b.pump()
	b.commit(a, pending.ID)
	a.pump()
	m := a.send(b, "three")
	b.pump()
	b.commit(a, m.ID)
	a.pump()

	a.tweak = func(c *device.Config) {
		c.Restored = true
		c.OnSessionRepair = func(peer messages.DeviceAddress, step string, _ int, err error) {
			mu.Lock()
			defer mu.Unlock()
			steps = append(steps, fmt.Sprintf("%s:%s:%v", peer.User, step, err))
		}
	}
	a.restore(saved)
	// The backup's pending message, on a fresh session: acknowledged again.
	var rs []device.ReceiveResult
	waitFor(t, func() bool { rs = append(rs, b.pump()...); return len(rs) > 0 }, "the resend at Open")
	if len(rs) != 1 || rs[0].ID != pending.ID || rs[0].Kind != device.AlreadyCommitted || !rs[0].AckSent {
		t.Fatalf("the restored device's resend at Open: %+v", rs)
	}
	after := a.send(b, "four")
	rs = b.pump()
	if len(rs) != 1 || rs[0].Message == nil || rs[0].Message.ID != after.ID {
		t.Fatalf("the restored device's first new message: %+v", rs)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(steps) != "[bob:restored:<nil>]" {
		t.Fatalf("repair steps %v", steps)
	}
}
