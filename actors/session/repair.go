package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
)

// Session repair (docs/delivery.md, "Restore, reset and repair"). When a
// peer whose identity this device has pinned sends on a session this
// device does not hold — it reset the session (ResetSession), or lost it
// to a restored store — every envelope of the peer fails with
// ratchet.ErrUnknownSession until one side starts a new session, and the
// peer does not know it has to. So the receiving device starts one: a
// fresh PQXDH initiation from a fetched bundle (checked against the pin),
// carried by an ACK frame for a fresh random logical id that names no
// message. The peer accepts it as a fresh initiation from the pinned
// identity (which replaces its current session) and answers an unknown-id
// ACK with Cleared = false; its next messages go out on the new session,
// and its device layer sends its pending messages again (SessionReplaced).
// The repair is authenticated like any initiation (signed by the identity
// key, bound to both addresses) and works with peers of earlier builds,
// which know both the frame and the initiation. It is rate-limited per
// peer (Config.RepairInterval) and only for pinned peers, so an
// unauthenticated or unknown sender gets no work and no state from it.

// repairAfterFailures is how many envelopes in a row from one peer must
// fail as replays (ratchet.ErrReplay) or as tampered (ratchet.ErrTampered)
// before they start a repair. A peer whose store was rolled back (a
// restored backup) or cloned sends at chain positions this device has
// already used, or on a chain it has moved past: every such envelope
// fails, and so does its every retry. A single duplicate from the
// transport does not reach the count.
const repairAfterFailures = 3

// Steps of a session repair (Config.OnRepair).
const (
	// RepairStarted: a repair initiation was handed to the transport.
	RepairStarted = "started"
	// RepairFailed: a repair could not be made or sent.
	RepairFailed = "failed"
	// RepairSuppressed: a repair was due within the interval of the last.
	RepairSuppressed = "suppressed"
	// RepairRestored: under Config.Restored, the first encryption to the
	// peer started a fresh initiation instead of using the stored session.
	RepairRestored = "restored"
	// RepairReplaced is the device layer's step: the peer's fresh
	// initiation replaced the session (Received.SessionReplaced).
	RepairReplaced = "replaced"
)

// peerSet is a set of peers safe for concurrent use.
type peerSet struct {
	mu sync.Mutex
	m  map[messages.DeviceAddress]struct{}
}

func (p *peerSet) has(peer messages.DeviceAddress) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[peer]
	return ok
}

func (p *peerSet) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m = nil
}

func (p *peerSet) add(peer messages.DeviceAddress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[messages.DeviceAddress]struct{}{}
	}
	p.m[peer] = struct{}{}
}

// DefaultRepairInterval is Config.RepairInterval's default.
const DefaultRepairInterval = 10 * time.Second

// maxRepairPeers bounds the peers whose last repair time is kept; past it
// the entries older than the interval are dropped first.
const maxRepairPeers = 4096

// repairLimiter keeps the time of the last repair per peer.
type repairLimiter struct {
	mu   sync.Mutex
	last map[messages.DeviceAddress]time.Time
}

// allow reports whether a repair with peer may start at now, and records
// it when it may.
func (l *repairLimiter) allow(peer messages.DeviceAddress, now time.Time, interval time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[peer]; ok && now.Sub(t) < interval {
		return false
	}
	if l.last == nil {
		l.last = map[messages.DeviceAddress]time.Time{}
	}
	if len(l.last) >= maxRepairPeers {
		for p, t := range l.last {
			if now.Sub(t) >= interval {
				delete(l.last, p)
			}
		}
		if len(l.last) >= maxRepairPeers {
			return false
		}
	}
	l.last[peer] = now
	return true
}

// repairTrigger reports whether the decryption failure err of one of the
// peer's envelopes calls for a repair: a session this device does not
// hold at once, replays or tampering from repairAfterFailures envelopes
// in a row.
func (a *peerActor) repairTrigger(err error) bool {
	switch {
	case errors.Is(err, ratchet.ErrUnknownSession):
		return true
	case errors.Is(err, ratchet.ErrReplay), errors.Is(err, ratchet.ErrTampered):
		a.failStreak++
		if a.failStreak >= repairAfterFailures {
			a.failStreak = 0
			return true
		}
	}
	return false
}

// repairDue reports whether an envelope on an unknown session from this
// actor's peer should start a repair now: only for a pinned peer (the
// transport authenticated the address, the pin names the identity the
// new session must have) and at most once per Config.RepairInterval.
func (a *peerActor) repairDue() bool {
	cfg := &a.m.cfg
	if cfg.RepairInterval < 0 || a.pin == nil {
		return false
	}
	if !a.m.repairs.allow(a.peer, cfg.Now(), cfg.RepairInterval) {
		if cfg.OnRepair != nil {
			cfg.OnRepair(a.peer, RepairSuppressed, nil)
		}
		return false
	}
	return true
}

// repair starts a fresh session with the peer and persists it; done gets
// the envelope to hand over once that is durable (nil when nothing is to
// be sent: a failure, told to OnRepair, or an ordered transport that
// queued it already).
func (a *peerActor) repair(ctx context.Context, done func(*handoff)) {
	cfg := &a.m.cfg
	fail := func(err error) {
		if cfg.OnRepair != nil {
			cfg.OnRepair(a.peer, RepairFailed, err)
		}
		done(nil)
	}
	var id messages.LogicalMessageID
	if _, err := rand.Read(id[:]); err != nil {
		fail(err)
		return
	}
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadAck, ID: id})
	if err != nil {
		fail(err)
		return
	}
	e, err := a.encryptFresh(ctx, frame)
	if err != nil {
		fail(err)
		return
	}
	wr := &writes{peer: a.peer}
	a.adoptEncryption(e, wr)
	a.submit(a.newWork(), wr, func(err error) {
		if err != nil {
			fail(wrapPeer("persist repair", a.peer, err))
			return
		}
		if a.m.ordered != nil {
			if err := a.m.ordered.Enqueue(a.peer, e.envelope); err != nil {
				fail(fmt.Errorf("session: repair with %s: %w", a.peer, err))
				return
			}
			if cfg.OnRepair != nil {
				cfg.OnRepair(a.peer, RepairStarted, nil)
			}
			done(nil)
			return
		}
		done(&handoff{env: e.envelope})
	})
}

// encryptFresh is encrypt on a new session: a fresh initiation from a
// fetched bundle whose identity must be the pinned one, even when the
// record holds sessions (they are archived and stay decryptable).
func (a *peerActor) encryptFresh(ctx context.Context, plaintext []byte) (encrypted, error) {
	cfg := &a.m.cfg
	var out encrypted
	bundle, err := cfg.Transport.FetchBundle(ctx, a.peer)
	if err != nil {
		return out, wrapPeer("fetch bundle", a.peer, err)
	}
	if bundle == nil {
		return out, wrapPeer("fetch bundle", a.peer, fmt.Errorf("%w: nil bundle", messages.ErrMalformed))
	}
	if err := ratchet.VerifyBundle(bundle); err != nil {
		return out, wrapPeer("verify bundle", a.peer, err)
	}
	if err := checkPin(a.peer, *a.pin, bundle.Identity); err != nil {
		return out, err
	}
	rec, _, err := cfg.Ratchet.Initiate(a.rec, a.m.local, bundle, ratchet.Route{From: a.m.self, To: a.peer})
	if err != nil {
		return out, wrapPeer("initiate", a.peer, err)
	}
	next, env, err := cfg.Ratchet.Encrypt(rec, plaintext)
	if err != nil {
		return out, wrapPeer("encrypt", a.peer, err)
	}
	out.rec, out.envelope = next, env
	return out, nil
}

// handRepair hands a durable repair initiation to the transport (on the
// caller's goroutine, as handAck) and tells OnRepair.
func (m *Manager) handRepair(ctx context.Context, to messages.DeviceAddress, h *handoff) {
	err := m.cfg.Transport.Send(ctx, to, h.env)
	if err != nil {
		err = fmt.Errorf("session: repair with %s: %w", to, err)
	}
	if m.cfg.OnRepair != nil {
		step := RepairStarted
		if err != nil {
			step = RepairFailed
		}
		m.cfg.OnRepair(to, step, err)
	}
}
