package session

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Candidate is a decrypted envelope whose new session state is not yet
// persisted (docs/protocol.md, commit boundary, "Transactions": the ratchet step is
// persisted only inside the receive transaction). Persist it inside the
// caller's DeliveryTx, next to the caller's own rows, then release it with
// Committed (the transaction committed) or Abort (it did not, or the
// caller gives up). Commit does the whole sequence in a transaction of its
// own. Until the release, or Config.CandidateTimeout, the peer's actor
// processes no other operation; after it, Persist fails.
type Candidate struct {
	m         *Manager
	peer      messages.DeviceAddress
	envelope  []byte
	now       time.Time
	plaintext []byte
	info      ratchet.SessionInfo

	established bool

	baseRec ratchet.SessionRecord // the record the candidate was computed from
	base    stamp                 // its stored encoding
	rec     ratchet.SessionRecord // the new record
	raw     []byte                // its encoding

	prekeysBase []byte // stored prekeys the candidate consumed from (nil: none consumed)
	prekeysNew  []byte

	mu       sync.Mutex
	released bool
	done     chan bool // receives true (committed) or false once
}

// Peer returns the device the envelope came from.
func (c *Candidate) Peer() messages.DeviceAddress { return c.peer }

// Plaintext returns the decrypted plaintext (normally an encoded
// messages.SecurePayload). The caller owns it.
func (c *Candidate) Plaintext() []byte { return c.plaintext }

// Session describes the session that decrypted the envelope; Remote is
// the sender's (pinned) identity.
func (c *Candidate) Session() ratchet.SessionInfo { return c.info }

// Established reports whether the envelope created its session (an
// accepted initiation).
func (c *Candidate) Established() bool { return c.established }

// Persist writes the candidate's state inside tx: the new session record,
// the pin on first contact and, when the envelope consumed a one-time
// prekey, the prekey store without it. It fails — and the caller must let
// tx roll back — with ErrCandidateReleased after the release, ErrStaleState
// when the stored session is no longer the one the candidate was computed
// from, *IdentityChangedError when another identity is pinned, and
// ratchet.ErrUnknownPrekey when the one-time prekey was consumed by
// another transaction meanwhile (one-time prekey reuse is refused).
//
// Prekeys are merged, not overwritten: when the stored prekey store is no
// longer the one the candidate consumed from (a bundle was issued or the
// schedule ran meanwhile), the envelope is decrypted again against the
// stored store (Decrypt is deterministic), inside tx.
func (c *Candidate) Persist(tx persistence.DeliveryTx) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return ErrCandidateReleased
	}
	if err := casSession(tx, c.peer, c.base); err != nil {
		return wrapPeer("persist", c.peer, err)
	}
	pin, ok, err := tx.Pin(c.peer)
	if err != nil {
		return wrapPeer("persist", c.peer, err)
	}
	if ok {
		if err := checkPin(c.peer, pin, c.info.Remote); err != nil {
			return err
		}
	} else if err := tx.PutPin(c.peer, c.info.Remote); err != nil {
		return wrapPeer("persist", c.peer, err)
	}
	raw := c.raw
	if c.prekeysBase != nil {
		cur, ok, err := tx.Prekeys()
		if err != nil {
			return wrapPeer("persist", c.peer, err)
		}
		if !ok {
			return wrapPeer("persist", c.peer, ErrNoIdentity)
		}
		newPrekeys := c.prekeysNew
		if !bytes.Equal(cur, c.prekeysBase) {
			ps, err := ratchet.UnmarshalPrekeyStore(cur)
			if err != nil {
				return wrapPeer("persist", c.peer, corrupt("prekeys", err))
			}
			res, err := c.m.cfg.Ratchet.Decrypt(c.baseRec, c.m.local, ps, c.envelope, c.now)
			if err != nil {
				return wrapPeer("persist", c.peer, err)
			}
			if newPrekeys, err = ratchet.MarshalPrekeyStore(res.Prekeys); err != nil {
				return wrapPeer("persist", c.peer, err)
			}
			if raw, err = ratchet.MarshalState(res.Record); err != nil {
				return wrapPeer("persist", c.peer, err)
			}
		}
		if err := tx.PutPrekeys(newPrekeys); err != nil {
			return wrapPeer("persist", c.peer, err)
		}
	}
	if err := tx.PutSession(c.peer, raw); err != nil {
		return wrapPeer("persist", c.peer, err)
	}
	return nil
}

// release marks the candidate released and tells the actor once.
func (c *Candidate) release(committed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	c.done <- committed
}

// Committed reports that the transaction in which Persist ran committed;
// the peer's actor adopts the new state and resumes. Calling it for a
// transaction that did not commit is harmless for the ratchet: the next
// write finds the stored record unchanged, fails its compare-and-swap and
// reloads.
func (c *Candidate) Committed() { c.release(true) }

// Abort abandons the candidate: nothing changes, the peer's actor resumes.
func (c *Candidate) Abort() { c.release(false) }

// Commit persists the candidate in a transaction of its own and releases it.
func (c *Candidate) Commit(ctx context.Context) error {
	err := c.m.cfg.Store.Update(ctx, c.Persist)
	c.release(err == nil)
	return err
}
