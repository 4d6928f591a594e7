package session_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// byteCountingStore counts the bytes of session state its transactions
// put: the session records and the skipped message keys stored beside
// them.
type byteCountingStore struct {
	persistence.DeliveryStore
	mu    sync.Mutex
	bytes int
}

type byteCountingTx struct {
	persistence.DeliveryTx
	s *byteCountingStore
}

func (t byteCountingTx) add(n int) {
	t.s.mu.Lock()
	t.s.bytes += n
	t.s.mu.Unlock()
}

func (t byteCountingTx) PutSession(peer messages.DeviceAddress, record []byte) error {
	t.add(len(record))
	return t.DeliveryTx.PutSession(peer, record)
}

func (t byteCountingTx) PutSkippedKey(peer messages.DeviceAddress, seq uint64, entry []byte) error {
	t.add(8 + len(entry))
	return t.DeliveryTx.PutSkippedKey(peer, seq, entry)
}

func (t byteCountingTx) DeleteSkippedKey(peer messages.DeviceAddress, seq uint64) error {
	t.add(8) // the key of the entry it removes
	return t.DeliveryTx.DeleteSkippedKey(peer, seq)
}

func (s *byteCountingStore) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	return s.DeliveryStore.Update(ctx, func(tx persistence.DeliveryTx) error { return fn(byteCountingTx{tx, s}) })
}

// take returns the bytes counted since the last take.
func (s *byteCountingStore) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.bytes
	s.bytes = 0
	return n
}

// rawPeer is a remote device driven through crypto/ratchet directly (a
// hostile peer needs no store of its own).
type rawPeer struct {
	addr messages.DeviceAddress
	id   ratchet.Identity
	rec  ratchet.SessionRecord
	next uint32 // logical message ids
}

func newRawPeer(tb testing.TB, addr messages.DeviceAddress) *rawPeer {
	tb.Helper()
	id, err := ratchet.NewIdentity()
	if err != nil {
		tb.Fatal(err)
	}
	return &rawPeer{addr: addr, id: id}
}

// initiate starts a new session with to (fetching its bundle), making it
// the current one.
func (p *rawPeer) initiate(tb testing.TB, to *node) {
	tb.Helper()
	b, err := to.m.Bundle(bg)
	if err != nil {
		tb.Fatal(err)
	}
	if p.rec, _, err = ratchet.Initiate(p.rec, p.id, b, ratchet.Route{From: p.addr, To: to.addr}); err != nil {
		tb.Fatal(err)
	}
}

// message encrypts one application message on the current session and
// returns its envelope and logical id.
func (p *rawPeer) message(tb testing.TB, body string) ([]byte, messages.LogicalMessageID) {
	tb.Helper()
	p.next++
	id := messages.LogicalMessageID{0xEE, byte(p.next >> 24), byte(p.next >> 16), byte(p.next >> 8), byte(p.next)}
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: id, Body: []byte(body)})
	if err != nil {
		tb.Fatal(err)
	}
	var env []byte
	if p.rec, env, err = ratchet.Encrypt(p.rec, frame); err != nil {
		tb.Fatal(err)
	}
	return env, id
}

// skip advances the current sending chain by n messages that are never
// sent: the receiver of the next one stores n skipped keys.
func (p *rawPeer) skip(tb testing.TB, n int) {
	tb.Helper()
	for range n {
		p.message(tb, "never sent")
	}
}

func receiveNew(tb testing.TB, at *node, from messages.DeviceAddress, env []byte) {
	tb.Helper()
	r, err := at.m.Receive(bg, from, env)
	if err != nil {
		tb.Fatalf("Receive at %s from %s: %v", at.addr, from, err)
	}
	if r.Outcome != inbound.OutcomeDelivery || !r.New {
		tb.Fatalf("Receive at %s from %s: %+v, want a new delivery", at.addr, from, r)
	}
}

func commit(tb testing.TB, at *node, from messages.DeviceAddress, id messages.LogicalMessageID) {
	tb.Helper()
	if _, err := at.m.Finalize(bg, from, id, persistence.FinalizationCommitted, 0); err != nil {
		tb.Fatalf("Finalize at %s of %s: %v", at.addr, id, err)
	}
}

// stepBytes runs the skipped-key inflation attack against bob: mallory opens
// 41 sessions (bob keeps the current one and 40 archived), one envelope
// each; with skip > 0 the last four skip skip keys each (4 × 500: the
// record at its per-record cap of 2 000, as 41 × 512 would leave it, for a
// tenth of the encryptions). It returns the session-state bytes bob's
// transactions put for one more receive, its commit (whose ACK is a
// ratchet step), and a receive that uses a skipped key and its commit.
func stepBytes(t *testing.T, kind string, skip int) (receive, commitAck, skippedReceive, skippedCommit int) {
	ms := newMesh(t)
	var inner persistence.DeliveryStore = memory.NewDelivery()
	if kind == "bolt" {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "bob.db"), bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		inner = db.Delivery()
	}
	store := &byteCountingStore{DeliveryStore: inner}
	bob := ms.add(bobAddr, store, nil)
	mallory := newRawPeer(t, messages.DeviceAddress{User: "mallory", Device: 1})
	var late []byte
	var lateID messages.LogicalMessageID
	for s := range 41 {
		mallory.initiate(t, bob)
		switch {
		case s == 40 && skip > 0:
			late, lateID = mallory.message(t, "late")
			mallory.skip(t, skip-1)
		case s >= 37:
			mallory.skip(t, skip)
		}
		env, id := mallory.message(t, fmt.Sprintf("session %d", s))
		receiveNew(t, bob, mallory.addr, env)
		commit(t, bob, mallory.addr, id)
	}
	store.take()
	env, id := mallory.message(t, "measured")
	receiveNew(t, bob, mallory.addr, env)
	receive = store.take()
	commit(t, bob, mallory.addr, id)
	commitAck = store.take()
	if late != nil {
		receiveNew(t, bob, mallory.addr, late)
		skippedReceive = store.take()
		commit(t, bob, mallory.addr, lateID)
		skippedCommit = store.take()
	}
	return receive, commitAck, skippedReceive, skippedCommit
}

// TestAttackSkippedKeysDoNotInflateEachStep: a hostile
// peer that fills its record with skipped keys (41 sessions, 2 000 skipped
// keys kept) must not make every later ratchet step of its peer
// rewrite them. The session-state bytes a receive and a commit (with its
// ACK) put stay within 1 KiB of the same steps on the same 41 sessions
// without skipped keys, and a receive that uses a skipped key writes about
// as little.
func TestAttackSkippedKeysDoNotInflateEachStep(t *testing.T) {
	for _, kind := range []string{"memory", "bolt"} {
		t.Run(kind, func(t *testing.T) {
			r0, c0, _, _ := stepBytes(t, kind, 0)
			r, c, sr, sc := stepBytes(t, kind, 500)
			const slack = 1024
			t.Logf("bytes put per step: receive %d (%d without skipped keys), commit+ACK %d (%d), receive with a skipped key %d, its commit %d", r, r0, c, c0, sr, sc)
			if r0 == 0 || c0 == 0 {
				t.Fatalf("nothing counted: receive %d, commit %d", r0, c0)
			}
			if r > r0+slack || c > c0+slack {
				t.Fatalf("with 2 000 skipped keys stored a receive put %d bytes and a commit+ACK %d; without them %d and %d", r, c, r0, c0)
			}
			if sr > r0+slack || sc > c0+slack {
				t.Fatalf("a receive that used a skipped key put %d bytes and its commit %d; a plain receive %d, commit %d", sr, sc, r0, c0)
			}
		})
	}
}

// TestAttackHostileAddressesCannotEvictHonestSkippedKeys (the
// per-device cap): with MaxSkippedKeysPerDevice 1 000, five hostile
// addresses each open two sessions whose first envelope skips 512 keys
// (5 120 keys, each record under the per-record cap) after alice left 9
// keys waiting for her late messages. The device keeps at most 1 000 keys,
// the hostile peers (the largest holders) lose their own oldest keys and
// alice loses none: after a restart (keys read from the store) all nine
// late messages decrypt, while a hostile peer's evicted early message is
// ErrReplay. The cap is reported in Stats and logged once, on both stores.
func TestAttackHostileAddressesCannotEvictHonestSkippedKeys(t *testing.T) {
	for _, kind := range []string{"memory", "bolt"} {
		t.Run(kind, func(t *testing.T) {
			ms := newMesh(t)
			var store persistence.DeliveryStore = memory.NewDelivery()
			if kind == "bolt" {
				db, err := bolt.Open(filepath.Join(t.TempDir(), "bob.db"), bolt.Options{NoSync: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				store = db.Delivery()
			}
			const limit = 1000
			var mu sync.Mutex
			evicted := map[messages.DeviceAddress]int{}
			most := 0
			var logs bytes.Buffer
			tweak := func(c *session.Config) {
				c.MaxSkippedKeysPerDevice = limit
				c.Logger = slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))
				c.Observe = func(s session.Stats) {
					mu.Lock()
					defer mu.Unlock()
					most = max(most, s.SkippedKeys)
					for _, e := range s.SkippedEvicted {
						evicted[e.Peer] += e.Count
					}
				}
			}
			bob := ms.add(bobAddr, store, tweak)
			alice := newRawPeer(t, aliceAddr)
			alice.initiate(t, bob)
			env, id := alice.message(t, "hello")
			receiveNew(t, bob, aliceAddr, env)
			commit(t, bob, aliceAddr, id)
			var held [][]byte
			for range 10 {
				env, _ := alice.message(t, "late")
				held = append(held, env)
			}
			receiveNew(t, bob, aliceAddr, held[9])
			held = held[:9]

			var early []byte
			var early0 messages.DeviceAddress
			for h := range 5 {
				p := newRawPeer(t, messages.DeviceAddress{User: fmt.Sprintf("hostile%d", h), Device: 1})
				for s := range 2 {
					p.initiate(t, bob)
					if h == 0 && s == 0 {
						early, _ = p.message(t, "early")
						early0 = p.addr
						p.skip(t, 511)
					} else {
						p.skip(t, 512)
					}
					env, id := p.message(t, "flood")
					receiveNew(t, bob, p.addr, env)
					commit(t, bob, p.addr, id)
				}
			}
			count := func(peer *messages.DeviceAddress) int {
				t.Helper()
				var n int
				if err := store.View(bg, func(r persistence.DeliveryReader) error {
					var err error
					n, err = r.SkippedKeyCount(peer)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				return n
			}
			a := aliceAddr
			if n, na := count(nil), count(&a); n > limit || na != 9 {
				t.Fatalf("after the flood the device stores %d skipped keys (cap %d), alice %d (want 9)", n, limit, na)
			}
			mu.Lock()
			total := 0
			for p, n := range evicted {
				if p == aliceAddr {
					t.Errorf("the cap evicted %d of alice's keys", n)
				}
				total += n
			}
			notices := strings.Count(logs.String(), "skipped key cap")
			mu.Unlock()
			if stored := count(nil); total != 9+5*2*512-stored || most > limit {
				t.Fatalf("Stats: %d keys evicted, at most %d stored; want %d evicted, at most %d", total, most, 9+5*2*512-stored, limit)
			}
			if notices != 1 {
				t.Fatalf("%d notices of the cap during one flood, want 1:\n%s", notices, logs.String())
			}

			// A restart reads the keys from the store.
			if err := bob.m.Close(); err != nil {
				t.Fatal(err)
			}
			bob = ms.add(bobAddr, store, tweak)
			for i, env := range held {
				r, err := bob.m.Receive(bg, aliceAddr, env)
				if err != nil || !r.New {
					t.Fatalf("alice's late message %d after the flood: %+v %v", i, r, err)
				}
			}
			if _, err := bob.m.Receive(bg, early0, early); !errors.Is(err, ratchet.ErrReplay) {
				t.Fatalf("a hostile peer's evicted message: %v, want ErrReplay", err)
			}
			if n := count(&a); n != 0 {
				t.Fatalf("alice's keys left after her late messages: %d", n)
			}
		})
	}
}

// lockedWriter serializes writes to w (the committer logs from its own
// goroutine).
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
