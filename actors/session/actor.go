package session

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Requests to a session actor. Each carries the caller's context (checked
// before the work starts and passed to every blocking call) and a reply
// channel of capacity 1.
type (
	encryptReq struct {
		ctx       context.Context
		plaintext []byte
		reply     chan encryptRes
	}
	encryptRes struct {
		envelope []byte
		err      error
	}
	openReq struct {
		ctx      context.Context
		envelope []byte
		persist  bool // Decrypt: persist in the actor's own transaction
		reply    chan openRes
	}
	openRes struct {
		cand *Candidate
		err  error
	}
	acceptReq struct {
		ctx      context.Context
		identity ratchet.IdentityPublic
		reply    chan error
	}
	resetReq struct {
		ctx   context.Context
		reply chan error
	}
	warmReq struct {
		ctx   context.Context
		reply chan error
	}
)

// peerActor serializes every operation on one remote device's session.
// Its cached record is the stored one (stamp identifies the stored
// encoding), or it is not loaded. Keeping a digest instead of the encoding
// keeps an idle actor small.
type peerActor struct {
	m     *Manager
	peer  messages.DeviceAddress
	entry *peerEntry

	loaded bool
	rec    ratchet.SessionRecord
	stamp  stamp // of the stored encoding of rec
}

// stamp identifies a stored session record for compare-and-swap: whether
// one is stored and the SHA-256 of its encoding.
type stamp struct {
	has bool
	sum [32]byte
}

func stampOf(raw []byte, has bool) stamp {
	if !has {
		return stamp{}
	}
	return stamp{has: true, sum: sha256.Sum256(raw)}
}

func (a *peerActor) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		c.SetReceiveTimeout(a.m.cfg.IdleTimeout)
	case *actor.ReceiveTimeout:
		// Passivation: state is persisted after every operation, so there
		// is nothing to flush; the manager re-spawns on demand.
		if a.m.passivate(a.peer, a.entry) {
			c.Stop(c.Self())
		}
	case *encryptReq:
		defer a.m.done(a.entry)
		env, err := a.encrypt(msg.ctx, msg.plaintext)
		msg.reply <- encryptRes{envelope: env, err: err}
	case *openReq:
		defer a.m.done(a.entry)
		a.open(msg)
	case *acceptReq:
		defer a.m.done(a.entry)
		msg.reply <- a.accept(msg.ctx, msg.identity)
	case *resetReq:
		defer a.m.done(a.entry)
		msg.reply <- a.reset(msg.ctx)
	case *warmReq:
		defer a.m.done(a.entry)
		msg.reply <- a.load(msg.ctx)
	}
}

// load reads the stored record when the cache is not valid.
func (a *peerActor) load(ctx context.Context) error {
	if a.loaded {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var raw []byte
	var has bool
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		raw, has, err = r.Session(a.peer)
		return err
	})
	if err != nil {
		return wrapPeer("load", a.peer, err)
	}
	rec := ratchet.SessionRecord{}
	if has {
		if rec, err = ratchet.UnmarshalState(raw); err != nil {
			return wrapPeer("load", a.peer, corrupt("session record", err))
		}
	}
	a.rec, a.stamp, a.loaded = rec, stampOf(raw, has), true
	return nil
}

// casSession checks, inside tx, that the stored record is still base.
func casSession(tx persistence.DeliveryReader, peer messages.DeviceAddress, base stamp) error {
	cur, has, err := tx.Session(peer)
	if err != nil {
		return err
	}
	if stampOf(cur, has) != base {
		return ErrStaleState
	}
	return nil
}

func (a *peerActor) encrypt(ctx context.Context, plaintext []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// One retry after a stale-state failure (the cache is reloaded).
	for attempt := 0; ; attempt++ {
		env, err := a.encryptOnce(ctx, plaintext)
		if errors.Is(err, ErrStaleState) && attempt == 0 {
			continue
		}
		return env, err
	}
}

func (a *peerActor) encryptOnce(ctx context.Context, plaintext []byte) ([]byte, error) {
	if err := a.load(ctx); err != nil {
		return nil, err
	}
	cfg := a.m.cfg
	rec := a.rec
	var initiated *ratchet.IdentityPublic
	if rec.IsEmpty() {
		bundle, err := cfg.Transport.FetchBundle(ctx, a.peer)
		if err != nil {
			return nil, wrapPeer("fetch bundle", a.peer, err)
		}
		if bundle == nil {
			return nil, wrapPeer("fetch bundle", a.peer, fmt.Errorf("%w: nil bundle", messages.ErrMalformed))
		}
		if err := ratchet.VerifyBundle(bundle); err != nil {
			return nil, wrapPeer("verify bundle", a.peer, err)
		}
		// Check the pin before doing the agreement (cheap early refusal);
		// it is checked again inside the write transaction.
		if err := cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
			pin, ok, err := r.Pin(a.peer)
			if err != nil || !ok {
				return err
			}
			return checkPin(a.peer, pin, bundle.Identity)
		}); err != nil {
			return nil, wrapPeer("pin", a.peer, err)
		}
		if rec, _, err = cfg.Ratchet.Initiate(rec, a.m.local, bundle); err != nil {
			return nil, wrapPeer("initiate", a.peer, err)
		}
		id := bundle.Identity
		initiated = &id
	}
	next, env, err := cfg.Ratchet.Encrypt(rec, plaintext)
	if err != nil {
		return nil, wrapPeer("encrypt", a.peer, err)
	}
	raw, err := ratchet.MarshalState(next)
	if err != nil {
		return nil, wrapPeer("encrypt", a.peer, err)
	}
	err = cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := casSession(tx, a.peer, a.stamp); err != nil {
			return err
		}
		if initiated != nil {
			pin, ok, err := tx.Pin(a.peer)
			if err != nil {
				return err
			}
			if !ok {
				if err := tx.PutPin(a.peer, *initiated); err != nil {
					return err
				}
			} else if err := checkPin(a.peer, pin, *initiated); err != nil {
				return err
			}
		}
		return tx.PutSession(a.peer, raw)
	})
	if err != nil {
		if errors.Is(err, ErrStaleState) {
			a.loaded = false
		}
		return nil, wrapPeer("persist", a.peer, err)
	}
	a.rec, a.stamp = next, stampOf(raw, true)
	return env, nil
}

// open handles Open and Decrypt.
func (a *peerActor) open(req *openReq) {
	ctx := req.ctx
	var cand *Candidate
	var err error
	for attempt := 0; ; attempt++ {
		if cand, err = a.candidate(ctx, req.envelope, !req.persist); err != nil {
			req.reply <- openRes{err: err}
			return
		}
		if !req.persist {
			break
		}
		err = a.m.cfg.Store.Update(ctx, cand.Persist)
		cand.release(err == nil)
		if err == nil {
			a.rec, a.stamp = cand.rec, stampOf(cand.raw, true)
			req.reply <- openRes{cand: cand}
			return
		}
		if errors.Is(err, ErrStaleState) {
			a.loaded = false
			if attempt == 0 {
				continue
			}
		}
		req.reply <- openRes{err: wrapPeer("persist", a.peer, err)}
		return
	}
	// Open: hand the candidate out and accept nothing else for this peer
	// until it is committed, aborted or expired.
	req.reply <- openRes{cand: cand}
	timer := time.NewTimer(a.m.cfg.CandidateTimeout)
	defer timer.Stop()
	committed := false
	select {
	case committed = <-cand.done:
	case <-timer.C:
		cand.release(false)
	case <-a.m.closing:
		cand.release(false)
	}
	if committed {
		a.rec, a.stamp = cand.rec, stampOf(cand.raw, true)
		return
	}
	// Abandoned. If it was persisted anyway the stored record differs and
	// the next write fails its compare-and-swap; reload to be exact.
	a.loaded = false
}

// candidate decrypts envelope against the cached state.
func (a *peerActor) candidate(ctx context.Context, envelope []byte, early bool) (*Candidate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := a.load(ctx); err != nil {
		return nil, err
	}
	cfg := a.m.cfg
	env, err := messages.DecodeEnvelope(envelope)
	if err != nil {
		return nil, wrapPeer("decode", a.peer, err)
	}
	// Load the prekey store only for an initiation of a session the record
	// does not hold (the only case Decrypt consumes prekeys).
	var prekeys ratchet.PrekeyStore
	var prekeysRaw []byte
	if env.Initiation != nil && !holds(a.rec, env.Header.Session) {
		if err := cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
			var ok bool
			var err error
			if prekeysRaw, ok, err = r.Prekeys(); err != nil {
				return err
			}
			if !ok {
				return ErrNoIdentity
			}
			return nil
		}); err != nil {
			return nil, wrapPeer("load prekeys", a.peer, err)
		}
		if prekeys, err = ratchet.UnmarshalPrekeyStore(prekeysRaw); err != nil {
			return nil, wrapPeer("load prekeys", a.peer, corrupt("prekeys", err))
		}
	}
	now := cfg.Now()
	res, err := cfg.Ratchet.Decrypt(a.rec, a.m.local, prekeys, envelope, now)
	if err != nil {
		return nil, wrapPeer("decrypt", a.peer, err)
	}
	// Pinning applies on receive: Persist checks the pin inside the
	// transaction; Open also checks it now, so the caller learns of an
	// identity change before it opens its own transaction.
	if early {
		if err := cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
			pin, ok, err := r.Pin(a.peer)
			if err != nil || !ok {
				return err
			}
			return checkPin(a.peer, pin, res.Session.Remote)
		}); err != nil {
			return nil, wrapPeer("pin", a.peer, err)
		}
	}
	raw, err := ratchet.MarshalState(res.Record)
	if err != nil {
		return nil, wrapPeer("decrypt", a.peer, err)
	}
	c := &Candidate{
		m: a.m, peer: a.peer, envelope: envelope, now: now,
		baseRec: a.rec, base: a.stamp, rec: res.Record, raw: raw,
		plaintext: res.Plaintext, info: res.Session, established: res.Established,
		done: make(chan bool, 1),
	}
	if res.PrekeysChanged {
		c.prekeysBase = prekeysRaw
		if c.prekeysNew, err = ratchet.MarshalPrekeyStore(res.Prekeys); err != nil {
			return nil, wrapPeer("decrypt", a.peer, err)
		}
	}
	return c, nil
}

func holds(rec ratchet.SessionRecord, id messages.SessionID) bool {
	for _, s := range rec.Sessions() {
		if s.ID == id {
			return true
		}
	}
	return false
}

func (a *peerActor) accept(ctx context.Context, identity ratchet.IdentityPublic) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.load(ctx); err != nil {
		return err
	}
	drop := false
	if remote, ok := a.rec.RemoteIdentity(); ok && ratchet.CheckPin(remote, identity) != nil {
		drop = true
	}
	err := a.m.cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := casSession(tx, a.peer, a.stamp); err != nil {
			return err
		}
		if drop {
			if err := tx.DeleteSession(a.peer); err != nil {
				return err
			}
		}
		return tx.PutPin(a.peer, identity)
	})
	if err != nil {
		a.loaded = false
		return wrapPeer("accept identity", a.peer, err)
	}
	if drop {
		a.rec, a.stamp = ratchet.SessionRecord{}, stamp{}
	}
	return nil
}

func (a *peerActor) reset(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := a.m.cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error { return tx.DeleteSession(a.peer) })
	if err != nil {
		a.loaded = false
		return wrapPeer("reset", a.peer, err)
	}
	a.rec, a.stamp, a.loaded = ratchet.SessionRecord{}, stamp{}, true
	return nil
}

// Requests to the prekey actor.
type (
	bundleReq struct {
		ctx   context.Context
		reply chan bundleRes
	}
	bundleRes struct {
		bundle *messages.PrekeyBundle
		err    error
	}
	refreshReq struct {
		ctx   context.Context
		reply chan refreshRes // nil for the scheduled refresh
	}
	refreshRes struct {
		changed bool
		err     error
	}
)

// prekeyActor is the single owner of prekey issuance and the prekey
// schedule. Each operation is a read-modify-write of the stored prekey
// store in one transaction; a receive transaction that consumes a one-time
// prekey does the same (Candidate.Persist), and the store serializes
// Updates, so no update is lost.
type prekeyActor struct{ m *Manager }

func (p *prekeyActor) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *bundleReq:
		b, err := p.bundle(msg.ctx)
		msg.reply <- bundleRes{bundle: b, err: err}
	case *refreshReq:
		changed, err := p.refresh(msg.ctx)
		if msg.reply != nil {
			msg.reply <- refreshRes{changed: changed, err: err}
		} else if err != nil {
			p.m.cfg.Logger.Warn("session: scheduled prekey refresh failed", "err", err)
		}
	}
}

// update runs fn on the stored prekey store and persists the result when
// fn reports a change.
func (p *prekeyActor) update(ctx context.Context, fn func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return p.m.cfg.Store.Update(ctx, func(tx persistence.DeliveryTx) error {
		raw, ok, err := tx.Prekeys()
		if err != nil {
			return err
		}
		if !ok {
			return ErrNoIdentity
		}
		ps, err := ratchet.UnmarshalPrekeyStore(raw)
		if err != nil {
			return corrupt("prekeys", err)
		}
		next, changed, err := fn(ps)
		if err != nil || !changed {
			return err
		}
		return putPrekeys(tx, next)
	})
}

func (p *prekeyActor) bundle(ctx context.Context) (*messages.PrekeyBundle, error) {
	var out messages.PrekeyBundle
	err := p.update(ctx, func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error) {
		ps, _, err := ps.Refresh(p.m.local, p.m.cfg.Now())
		if err != nil {
			return ps, false, err
		}
		ps, out, err = ps.IssueBundle(p.m.pub)
		return ps, true, err
	})
	if err != nil {
		return nil, fmt.Errorf("session: bundle: %w", err)
	}
	return &out, nil
}

func (p *prekeyActor) refresh(ctx context.Context) (bool, error) {
	var changed bool
	err := p.update(ctx, func(ps ratchet.PrekeyStore) (ratchet.PrekeyStore, bool, error) {
		var err error
		ps, changed, err = ps.Refresh(p.m.local, p.m.cfg.Now())
		return ps, changed, err
	})
	if err != nil {
		return false, fmt.Errorf("session: refresh prekeys: %w", err)
	}
	return changed, nil
}
