package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/idle"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// peerActor owns everything keyed by one remote device: its ratchet
// record and pin, the receive decision of its envelopes, the finalization
// of its pending messages and the ACK's encryption, and the outbound rows
// addressed to it. It decides from its state and hands the writes to the
// committer without waiting for them (pipelining): its state is
// speculative — the stored state plus the writes in flight (rec, pin, and
// the in/out overlays keyed by logical id). Results leave only after the
// committer made the writes durable. When a write fails, the committer
// breaks the actor's chain (no later write computed on top of it is
// made) and the actor reloads its state from the store, so what is stored
// is always a prefix of what was decided.
type peerActor struct {
	m     *Manager
	peer  messages.DeviceAddress
	entry *peerEntry
	self  *actor.PID
	idle  *idle.Timer // passivation after Config.IdleTimeout without a message

	loaded bool
	rec    ratchet.SessionRecord
	// failStreak counts the peer's envelopes in a row that failed as a
	// replay or as tampered (repairTrigger); a success resets it.
	failStreak int
	pin        *ratchet.IdentityPublic
	chain      *chain

	inflight int
	in       map[messages.LogicalMessageID]*inKey
	out      map[messages.LogicalMessageID]*outKey

	// stored remembers pending inbound entries this actor made durable —
	// their sequence and the digest of their body, not the frame — so
	// that the commit of a message received moments ago decides without
	// a read transaction (finalizeState). Only this actor's items write
	// (peer, id)'s pending entry (CountDeliveries changes its count, which
	// a finalization does not read), so a remembered entry is what the
	// store holds until the next item of the key settles; the item still
	// reads the entry inside its own transaction (writes.verifySeq), so a
	// record damaged at rest is an error there, never finalized. At most
	// maxStoredPending entries (storedRing: the oldest is forgotten
	// first); dropped with the overlays on a failed write and on
	// passivation.
	stored     map[messages.LogicalMessageID]storedPending
	storedRing []messages.LogicalMessageID
	storedNext int

	// sent holds the ids of every pending outbound row of this peer the
	// store holds, once sentState is sentKnown: then a Send of a new id
	// decides without a read transaction (sendPending). Only this actor's
	// items write the peer's outbound rows, so settled keeps it exact. It
	// is built by the first Send (a local operation: an envelope from a
	// spoofed address never costs the scan) when the device holds at most
	// maxKnownSent pending outbound rows, and given up (sentOff) past
	// maxKnownSent rows of this peer; reset with the overlays on a failed
	// write.
	sent      map[messages.LogicalMessageID]struct{}
	sentState uint8
}

// States of peerActor.sent.
const (
	sentUnknown uint8 = iota // not built: the next Send builds it
	sentKnown                // exact
	sentOff                  // too many rows: Sends read the store
)

// maxKnownSent bounds the pending outbound rows a peer actor keeps the
// ids of (16 bytes each, with the map's overhead about 40).
const maxKnownSent = 256

// maxStoredPending bounds the durable pending entries a peer actor
// remembers, about 100 bytes each: twice a link's window (64 in flight),
// so a message's commit finds its entry while its sender keeps the
// window full.
const maxStoredPending = 128

// storedPending is a remembered durable pending entry: its sequence, its
// body's ApplicationMessageDigest, and its slot in storedRing.
type storedPending struct {
	seq    uint64
	digest [32]byte
	slot   int
}

// inKey is the speculative commit-boundary state of (peer, id) while a
// write of it is in flight. pending.Sequence is not used: the sequence is
// in slot (assigned by the store inside the transaction).
type inKey struct {
	owner     *work
	pending   *persistence.PendingInbound
	slot      *seqSlot
	processed *persistence.ProcessedInbound
	// digest is the body's digest of a new pending entry (remembered
	// once it is durable: storedPending).
	digest *[32]byte
}

// outKey is the speculative pending outbound row of (peer, id) while a
// write of it is in flight (pending nil: not pending).
type outKey struct {
	owner   *work
	pending *persistence.PendingOutbound
}

// work is what the actor remembers of one submitted item.
type work struct {
	chain   *chain
	inKeys  []messages.LogicalMessageID
	outKeys []messages.LogicalMessageID
}

// settledMsg tells the actor that an item of its is durable (err nil) or
// failed. The committer sends it before it replies to the caller, so a
// caller's next request is processed after it.
type settledMsg struct {
	w   *work
	err error
}

// IgnoreDeadLetterLogging implements actor.IgnoreDeadLetterLogging: an
// item settled after its actor stopped (Close) has nobody left to tell.
func (*settledMsg) IgnoreDeadLetterLogging() {}

func (a *peerActor) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		a.self = c.Self()
		a.idle = idle.New(a.m.cfg.IdleTimeout)
		a.idle.Touch(c)
		return
	case *idle.Tick:
		// Passivation: every state change is in the store (or in flight:
		// then the actor stays, and the settling re-arms the timer), the
		// manager re-spawns on demand.
		if a.idle.Fired(c, msg) && a.inflight == 0 && a.m.passivate(a.peer, a.entry) {
			c.Stop(c.Self())
		}
		return
	case *actor.Stopping:
		if a.idle != nil {
			a.idle.Stop()
		}
		return
	case *settledMsg:
		a.settled(msg)
	case request:
		a.serve(msg)
		a.m.done(a.entry)
		// An address this device holds nothing for (no pin, no session,
		// nothing in flight: an unauthenticated sender, or a failed first
		// contact) keeps no actor: spoofed addresses
		// leave no state behind.
		if a.loaded && a.inflight == 0 && a.pin == nil && a.rec.IsEmpty() && a.m.passivate(a.peer, a.entry) {
			c.Stop(c.Self())
			return
		}
	}
	if a.idle != nil {
		a.idle.Touch(c)
	}
}

func (a *peerActor) serve(msg request) {
	if err := msg.context().Err(); err != nil {
		msg.fail(err)
		return
	}
	if err := a.load(msg.context()); err != nil {
		msg.fail(err)
		return
	}
	msg.handle(a)
}

// request is one operation routed to a peer actor.
type request interface {
	context() context.Context
	handle(a *peerActor)
	fail(err error)
}

// load reads the stored record and pin when the state is not loaded.
func (a *peerActor) load(ctx context.Context) error {
	if a.loaded {
		return nil
	}
	var rec ratchet.SessionRecord
	var has, pinned bool
	var pin ratchet.IdentityPublic
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		if rec, has, err = loadRecord(r, a.peer); err != nil {
			return err
		}
		pin, pinned, err = r.Pin(a.peer)
		return err
	})
	if err != nil {
		return wrapPeer("load", a.peer, err)
	}
	a.rec, a.pin, a.loaded = rec, nil, true
	if pinned {
		a.pin = &pin
	}
	if pinned || has {
		a.m.knownPeer(a.entry)
	}
	a.chain = &chain{}
	return nil
}

// settled does the bookkeeping of a settled item: a durable one's keys
// leave the overlays (the store has them now); a failed one of the
// current chain resets the state to the store.
func (a *peerActor) settled(m *settledMsg) {
	a.inflight--
	if m.err != nil {
		if m.w.chain == a.chain {
			a.loaded, a.rec, a.pin, a.chain, a.in, a.out = false, ratchet.SessionRecord{}, nil, nil, nil, nil
			a.stored, a.storedRing, a.storedNext = nil, nil, 0
			a.sent, a.sentState = nil, sentUnknown
		}
		return
	}
	if a.pin != nil || !a.rec.IsEmpty() {
		a.m.knownPeer(a.entry) // durable now: no longer counted as unpinned
	}
	for _, id := range m.w.inKeys {
		if k := a.in[id]; k != nil && k.owner == m.w {
			delete(a.in, id)
			a.remember(id, k)
		}
	}
	for _, id := range m.w.outKeys {
		if k := a.out[id]; k != nil && k.owner == m.w {
			delete(a.out, id)
			a.noteSent(id, k.pending != nil)
		}
	}
	if len(a.in) == 0 {
		a.in = nil
	}
	if len(a.out) == 0 {
		a.out = nil
	}
}

// submit hands w's writes to the committer. after runs in the committer's
// goroutine once they are durable (err nil) or failed; the actor is told
// first.
func (a *peerActor) submit(w *work, wr *writes, after func(err error)) {
	a.inflight++
	self, sys := a.self, a.m.sys
	a.m.submit(&item{chain: w.chain, apply: wr.run, writes: wr, done: func(err error) {
		sys.Root.Send(self, &settledMsg{w: w, err: err})
		after(err)
	}})
}

func (a *peerActor) newWork() *work { return &work{chain: a.chain} }

func (a *peerActor) setIn(w *work, id messages.LogicalMessageID, k *inKey) {
	if a.in == nil {
		a.in = map[messages.LogicalMessageID]*inKey{}
	}
	k.owner = w
	a.in[id] = k
	w.inKeys = append(w.inKeys, id)
}

func (a *peerActor) setOut(w *work, id messages.LogicalMessageID, k *outKey) {
	if a.out == nil {
		a.out = map[messages.LogicalMessageID]*outKey{}
	}
	k.owner = w
	a.out[id] = k
	w.outKeys = append(w.outKeys, id)
}

// remember records k, just made durable, as what the store holds for
// (peer, id) when it is a new pending entry, and forgets (peer, id)
// otherwise (a finalized entry is not remembered: Prune may remove it
// behind the actor's back).
func (a *peerActor) remember(id messages.LogicalMessageID, k *inKey) {
	if k.pending == nil || k.digest == nil {
		delete(a.stored, id)
		if len(a.stored) == 0 {
			// Nothing pending is remembered: hold no memory for it (an
			// idle actor keeps none).
			a.stored, a.storedRing, a.storedNext = nil, nil, 0
		}
		return
	}
	if a.stored == nil {
		a.stored = map[messages.LogicalMessageID]storedPending{}
	}
	slot := len(a.storedRing)
	if slot < maxStoredPending {
		a.storedRing = append(a.storedRing, id)
	} else {
		// Full: the slot of storedNext holds the oldest remembered id;
		// forget it unless it was forgotten already (and maybe
		// remembered again in another slot).
		slot = a.storedNext
		a.storedNext = (slot + 1) % maxStoredPending
		if old := a.storedRing[slot]; a.stored[old].slot == slot {
			delete(a.stored, old) // a no-op when it was forgotten already
		}
		a.storedRing[slot] = id
	}
	a.stored[id] = storedPending{seq: k.slot.v, digest: *k.digest, slot: slot}
}

// finalizeState is inState for a finalization: an entry this actor
// remembers (stored) decides without a read transaction, and verifySeq
// is then its sequence, to be checked inside the item's transaction.
func (a *peerActor) finalizeState(ctx context.Context, id messages.LogicalMessageID) (st inbound.State, verifySeq uint64, err error) {
	if a.in[id] == nil {
		if e, ok := a.stored[id]; ok {
			d := e.digest
			return inbound.State{Pending: &persistence.PendingInbound{Sender: a.peer, ID: id, Sequence: e.seq}, PendingDigest: &d}, e.seq, nil
		}
	}
	st, _, err = a.inState(ctx, id)
	return st, 0, err
}

// inState returns the speculative state of (peer, id) and the slot of its
// pending entry's sequence.
func (a *peerActor) inState(ctx context.Context, id messages.LogicalMessageID) (inbound.State, *seqSlot, error) {
	if k := a.in[id]; k != nil {
		return inbound.State{Pending: k.pending, Processed: k.processed}, k.slot, nil
	}
	var st inbound.State
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		st, err = inbound.ReadState(r, a.peer, id)
		return err
	})
	if err != nil {
		return st, nil, err
	}
	var slot *seqSlot
	if st.Pending != nil {
		slot = &seqSlot{v: st.Pending.Sequence}
	}
	return st, slot, nil
}

// senderPending counts peer's pending messages as decided: the stored
// count corrected by the overlay (a key in flight counts as the overlay
// says, whatever the store says yet).
func (a *peerActor) senderPending(ctx context.Context) (int, error) {
	var n int
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		if n, err = r.PendingInboundCount(&a.peer); err != nil {
			return err
		}
		for id, k := range a.in {
			_, stored, err := r.PendingInbound(a.peer, id)
			if err != nil {
				return err
			}
			if stored {
				n--
			}
			if k.pending != nil {
				n++
			}
		}
		return nil
	})
	return n, err
}

// noteSent records that the store now holds (pending) or no longer holds
// a pending outbound row of id, when sent is kept.
func (a *peerActor) noteSent(id messages.LogicalMessageID, pending bool) {
	if a.sentState != sentKnown {
		return
	}
	if !pending {
		delete(a.sent, id)
		if len(a.sent) == 0 {
			a.sent = nil // an idle actor keeps no memory for it
		}
		return
	}
	if a.sent == nil {
		a.sent = map[messages.LogicalMessageID]struct{}{}
	}
	a.sent[id] = struct{}{}
	if len(a.sent) > maxKnownSent {
		a.sent, a.sentState = nil, sentOff
	}
}

// sendPending reports whether (peer, id) is pending outbound as decided:
// the overlay, else sent (built on first use), else the store.
func (a *peerActor) sendPending(ctx context.Context, id messages.LogicalMessageID) (bool, error) {
	if k := a.out[id]; k != nil {
		return k.pending != nil, nil
	}
	if a.sentState == sentUnknown {
		a.buildSent(ctx)
	}
	if a.sentState == sentKnown {
		_, ok := a.sent[id]
		return ok, nil
	}
	p, err := a.outState(ctx, id)
	return p != nil, err
}

// buildSent reads the ids of the peer's pending outbound rows when the
// device holds at most maxKnownSent of them. Past that, or when a row does
// not read, sent is not kept (sentOff): sendPending reads the store, which
// reports a damaged row of the id it asks for.
func (a *peerActor) buildSent(ctx context.Context) {
	var ids map[messages.LogicalMessageID]struct{}
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		n, err := r.PendingOutboundCount()
		if err != nil {
			return err
		}
		if n > maxKnownSent {
			return errTooManySent
		}
		return r.PendingOutboundAfter(0, &a.peer, func(p persistence.PendingOutbound) (bool, error) {
			if ids == nil {
				ids = map[messages.LogicalMessageID]struct{}{}
			}
			ids[p.ID] = struct{}{}
			return true, nil
		})
	})
	switch {
	case err == nil:
		// Rows written by items still in flight are in the overlay until
		// they settle, and noteSent applies them again: idempotent.
		a.sent, a.sentState = ids, sentKnown
	case ctx.Err() == nil:
		a.sentState = sentOff
	}
}

var errTooManySent = errors.New("session: too many pending outbound rows to keep")

// outState returns the speculative pending outbound row of (peer, id).
func (a *peerActor) outState(ctx context.Context, id messages.LogicalMessageID) (*persistence.PendingOutbound, error) {
	if k := a.out[id]; k != nil {
		return k.pending, nil
	}
	var p persistence.PendingOutbound
	var ok bool
	err := a.m.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		p, ok, err = r.PendingOutbound(a.peer, id)
		return err
	})
	if err != nil || !ok {
		return nil, err
	}
	return &p, nil
}

// encrypted is an encryption decided on the speculative record.
type encrypted struct {
	rec      ratchet.SessionRecord
	envelope []byte
	pin      *ratchet.IdentityPublic // to pin (first contact by initiation)
}

// encrypt encrypts plaintext on the speculative record. Without a session
// it fetches peer's bundle, verifies it, checks it against the pin and
// initiates one (the only blocking step of a peer actor: a network fetch).
func (a *peerActor) encrypt(ctx context.Context, plaintext []byte) (encrypted, error) {
	cfg := &a.m.cfg // a copy of Config would escape to the heap with the closures
	rec := a.rec
	var out encrypted
	if a.m.restored.Load() && !rec.IsEmpty() && a.pin != nil && !a.m.freshened.has(a.peer) {
		// The stored session may be behind the peer's (a restored
		// store): start a fresh one rather than send on it.
		out, err := a.encryptFresh(ctx, plaintext)
		if err == nil {
			a.m.freshened.add(a.peer)
			if cfg.OnRepair != nil {
				cfg.OnRepair(a.peer, RepairRestored, nil)
			}
		} else if cfg.OnRepair != nil {
			cfg.OnRepair(a.peer, RepairFailed, err)
		}
		return out, err
	}
	if rec.IsEmpty() {
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
		if a.pin != nil {
			if err := checkPin(a.peer, *a.pin, bundle.Identity); err != nil {
				return out, err
			}
		} else {
			id := bundle.Identity
			out.pin = &id
		}
		if rec, _, err = cfg.Ratchet.Initiate(rec, a.m.local, bundle, ratchet.Route{From: a.m.self, To: a.peer}); err != nil {
			return out, wrapPeer("initiate", a.peer, err)
		}
	}
	next, env, err := cfg.Ratchet.Encrypt(rec, plaintext)
	if err != nil {
		return out, wrapPeer("encrypt", a.peer, err)
	}
	out.rec, out.envelope = next, env
	return out, nil
}

// adoptEncryption makes e the speculative state and adds its writes.
func (a *peerActor) adoptEncryption(e encrypted, wr *writes) {
	wr.setSession(a.rec, e.rec)
	a.rec = e.rec
	if e.pin != nil {
		a.pin = e.pin
		wr.pin = e.pin
	}
}

// decrypted is an envelope decrypted on the speculative record.
type decrypted struct {
	res      ratchet.DecryptResult
	replaced bool
	pin      *ratchet.IdentityPublic
	accept   *ratchet.AcceptedInitiation
}

func (a *peerActor) decrypt(ctx context.Context, envelope []byte) (decrypted, error) {
	cfg := &a.m.cfg
	var out decrypted
	// The session id and the initiation slot decide whether the prekeys
	// are read; the ratchet decodes the envelope strictly itself, so a
	// well-formed one is only peeked at here (not decoded twice).
	session, initiation, ok := messages.PeekEnvelope(envelope)
	if !ok {
		env, err := messages.DecodeEnvelope(envelope)
		if err != nil {
			err = wrapPeer("decode", a.peer, err)
			a.undecryptable(ReasonMalformed, err)
			return out, err
		}
		session, initiation = env.Header.Session, env.Initiation != nil
	}
	// The sender's budget is spent before anything costs (the prekey
	// read, the agreement): a flood stops at its own sender's budget.
	now := cfg.Now()
	b := &a.m.budgets
	if !b.take(a.peer, now) {
		b.refused.Add(1)
		err := budgetError(a.peer)
		a.undecryptable(ReasonBudget, err)
		return out, err
	}
	// The prekey store is read only for an initiation of a session the
	// record does not hold (the only case Decrypt consumes prekeys). It is
	// the stored snapshot: the consumption is applied to the stored store
	// at commit (writes.accept), which refuses a one-time prekey consumed
	// or a last-resort initiation accepted by another copy meanwhile.
	var prekeys ratchet.PrekeyStore
	if initiation && !holds(a.rec, session) {
		var raw []byte
		if err := cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
			var ok bool
			var err error
			if raw, ok, err = r.Prekeys(); err != nil {
				return err
			}
			if !ok {
				return ErrNoIdentity
			}
			return nil
		}); err != nil {
			return out, wrapPeer("load prekeys", a.peer, err)
		}
		var err error
		if prekeys, err = ratchet.UnmarshalPrekeyStore(raw); err != nil {
			return out, wrapPeer("load prekeys", a.peer, corrupt("prekeys", err))
		}
	}
	// The work is counted, not timed: the prekey
	// store's load and whatever Decrypt computes, success or failure.
	work := prekeys.LoadWork()
	rc := cfg.Ratchet
	rc.Work = &work
	b.attempts.Add(1)
	if initiation && !holds(a.rec, session) {
		b.initiations.Add(1)
	}
	// a.peer is the sender the transport authenticated (the caller's
	// from): an initiation naming another address is refused.
	res, err := rc.Decrypt(a.rec, a.m.local, prekeys, envelope, ratchet.Route{From: a.peer, To: a.m.self}, now)
	b.addWork(work, err != nil)
	if err != nil {
		b.failures.Add(1)
		err = wrapPeer("decrypt", a.peer, err)
		a.undecryptable(ReasonDecrypt, err)
		return out, err
	}
	b.refund(a.peer)
	a.failStreak = 0
	if a.pin != nil {
		if err := checkPin(a.peer, *a.pin, res.Session.Remote); err != nil {
			a.undecryptable(ReasonIdentityChanged, err)
			return out, err
		}
	} else {
		id := res.Session.Remote
		out.pin = &id
	}
	out.accept = res.Accepted
	out.res = res
	// A fresh initiation that became current while we held another
	// session: the peer reset or repaired it (SessionReplaced).
	out.replaced = res.Established && res.Current && !a.rec.IsEmpty()
	return out, nil
}

// adoptDecryption makes d the speculative state and adds its writes.
func (a *peerActor) adoptDecryption(d decrypted, wr *writes) {
	wr.setSession(a.rec, d.res.Record)
	a.rec = d.res.Record
	wr.accept = d.accept
	if d.pin != nil {
		a.pin = d.pin
		wr.pin = d.pin
	}
}

// Reasons an envelope is undecryptable (Config.OnUndecryptable, the
// delivery plane's metric label): a closed set, so a hostile sender
// cannot grow the series.
const (
	ReasonBudget          = "budget"
	ReasonDecrypt         = "decrypt"
	ReasonIdentityChanged = "identity_changed"
	ReasonMalformed       = "malformed"
	ReasonUnpinnedLimit   = "unpinned_limit"
)

func (a *peerActor) undecryptable(reason string, err error) {
	if f := a.m.cfg.OnUndecryptable; f != nil {
		f(a.peer, reason, err)
	}
}

func holds(rec ratchet.SessionRecord, id messages.SessionID) bool {
	for _, s := range rec.Sessions() {
		if s.ID == id {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Receive (docs/protocol.md, commit boundary, "Transactions", Receive): the ratchet
// step, the pending row (or the cleared outbound row of an ACK) and, for a
// copy of a finalized message, the ratchet step of the ACK sent again, in
// one item.

type receiveReq struct {
	ctx      context.Context
	envelope []byte
	reply    func(Received, error)
}

func (r *receiveReq) context() context.Context { return r.ctx }
func (r *receiveReq) fail(err error)           { r.reply(Received{}, err) }

func (r *receiveReq) handle(a *peerActor) {
	cfg := &a.m.cfg
	d, err := a.decrypt(r.ctx, r.envelope)
	if err != nil {
		if a.repairTrigger(err) && a.repairDue() {
			a.repair(r.ctx, func(h *handoff) { r.reply(Received{Sender: a.peer, repair: h}, err) })
			return
		}
		r.fail(err)
		return
	}
	payload, err := messages.DecodeSecurePayload(d.res.Plaintext)
	if err != nil {
		r.fail(fmt.Errorf("session: receive from %s: frame: %w", a.peer, err))
		return
	}
	res := Received{Sender: a.peer, ID: payload.ID, SessionReplaced: d.replaced}
	wr := &writes{peer: a.peer, id: payload.ID}
	w := a.newWork()
	switch payload.Type {
	case messages.PayloadAck:
		a.adoptDecryption(d, wr)
		k := a.out[payload.ID]
		now := persistence.UnixMilli(cfg.Now())
		if k != nil {
			// A write of the row is in flight: decide on it.
			dec := inbound.DecideAck(k.pending != nil)
			res.Outcome, res.Cleared = dec.Outcome, dec.Cleared
			wr.deleteOutbound = dec.Effects.DeleteOutbound
			if k.pending != nil {
				wr.retire = &persistence.RetiredOutbound{Recipient: a.peer, ID: payload.ID, How: persistence.RetiredAcknowledged,
					RetiredAt: now, Digest: digest.ApplicationMessage(k.pending.Body)}
			}
		} else {
			// The store holds the row's state: DecideAck runs on what the
			// delete finds in the item's own transaction (a missing row
			// changes nothing), which saves a read transaction per ACK.
			wr.deleteOutbound, wr.ackDecides, wr.retireAt = true, true, now
		}
		if wr.deleteOutbound {
			a.setOut(w, payload.ID, &outKey{})
		}
		a.submit(w, wr, func(err error) {
			if err != nil {
				r.fail(wrapPeer("persist", a.peer, err))
				return
			}
			if wr.ackDecides {
				dec := inbound.DecideAck(wr.cleared)
				res.Outcome, res.Cleared = dec.Outcome, dec.Cleared
				res.UnknownAck = wr.unknownAck
			}
			r.reply(res, nil)
		})
		return
	case messages.PayloadHeld:
		// Not an ACK: the ratchet step is persisted and nothing else is
		// written; the verdict is decided on the pending outbound row
		// (outbound.DecideReceipt), in the overlay when a write of it is
		// in flight, else inside the item's own transaction.
		a.adoptDecryption(d, wr)
		res.Outcome = inbound.OutcomeHeld
		if k := a.out[payload.ID]; k != nil {
			res.Receipt = outbound.DecideReceipt(k.pending, payload.Digest)
		} else {
			dg := payload.Digest
			wr.checkHeld = &dg
		}
		a.submit(w, wr, func(err error) {
			if err != nil {
				r.fail(wrapPeer("persist", a.peer, err))
				return
			}
			if wr.checkHeld != nil {
				res.Receipt = wr.receipt
			}
			r.reply(res, nil)
		})
		return
	case messages.PayloadApplicationMessage:
	default:
		r.fail(fmt.Errorf("session: receive from %s: %w", a.peer, inbound.ErrNotApplicationMessage))
		return
	}
	st, slot, err := a.inState(r.ctx, payload.ID)
	if err != nil {
		r.fail(wrapPeer("receive", a.peer, err))
		return
	}
	limit := cfg.MaxPendingPerSender
	if limit > 0 && st.Pending == nil && st.Processed == nil {
		if st.SenderPending, err = a.senderPending(r.ctx); err != nil {
			r.fail(wrapPeer("receive", a.peer, err))
			return
		}
	}
	dec := inbound.DecideReceive(st, inbound.ReceiveInput{Sender: a.peer, ID: payload.ID, Body: payload.Body, Frame: d.res.Plaintext,
		Now: persistence.UnixMilli(cfg.Now()), MaxPendingPerSender: limit, HeldReceipts: !cfg.NoHeldReceipts})
	if dec.Err != nil {
		// Nothing is adopted: the ratchet step rolls back.
		r.fail(dec.Err)
		return
	}
	a.adoptDecryption(d, wr)
	res.Outcome, res.New = dec.Outcome, dec.New
	wr.countDelivery = dec.Effects.CountDelivery
	if p := dec.Effects.PutPending; p != nil {
		slot = &seqSlot{}
		wr.putPending, wr.slot, wr.maxPending = p, slot, cfg.MaxPending
		d := digest.ApplicationMessage(payload.Body)
		a.setIn(w, payload.ID, &inKey{pending: p, slot: slot, digest: &d})
	}
	var ack []byte
	var ackErr error
	switch {
	case dec.Effects.Ack:
		ack, ackErr = a.ack(r.ctx, payload.ID, wr)
	case dec.Effects.Held:
		ack, ackErr = a.held(r.ctx, payload.ID, digest.ApplicationMessage(payload.Body), wr)
	}
	pending, body := dec.Pending, dec.Plaintext
	a.submit(w, wr, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		if pending != nil {
			p := *pending
			p.Sequence = slot.v
			if wr.countDelivery {
				p.Deliveries = wr.deliveries
			}
			m := inbound.Message(p, body)
			res.Message = &m
			if cfg.OnDelivery != nil {
				cfg.OnDelivery(m)
			}
		}
		switch {
		case dec.Effects.Ack:
			res.AckSent, res.ack = a.m.handOffAck(a.peer, payload.ID, ack, ackErr)
		case dec.Effects.Held:
			res.HeldSent, res.ack = a.m.handOffHeld(a.peer, payload.ID, ack, ackErr)
		}
		r.reply(res, nil)
	})
}

// held encrypts a held receipt for id naming the body's digest d, as ack
// does an ACK: its ratchet step goes into wr, and an encryption failure
// only means no receipt is sent (the sender keeps its short schedule).
func (a *peerActor) held(ctx context.Context, id messages.LogicalMessageID, d [32]byte, wr *writes) ([]byte, error) {
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadHeld, ID: id, Digest: d})
	if err != nil {
		return nil, err
	}
	e, err := a.encrypt(ctx, frame)
	if err != nil {
		return nil, err
	}
	a.adoptEncryption(e, wr)
	return e.envelope, nil
}

// ack encrypts an ACK frame for id on the speculative record and adds its
// ratchet step to wr. An encryption failure is returned, not fatal: the
// finalization stands and the ACK is not sent (ackSent = false).
func (a *peerActor) ack(ctx context.Context, id messages.LogicalMessageID, wr *writes) ([]byte, error) {
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadAck, ID: id})
	if err != nil {
		return nil, err
	}
	e, err := a.encrypt(ctx, frame)
	if err != nil {
		return nil, err
	}
	a.adoptEncryption(e, wr)
	return e.envelope, nil
}

// ---------------------------------------------------------------------------
// Finalize (docs/protocol.md, commit boundary, "Transactions", Commit): remove the
// pending entry, write the processed entry and — a deviation the project
// documents — the ratchet step of the ACK, in one item. The ACK is handed
// to the transport only after that item is durable; an encryption failure
// never fails the finalization (ackSent = false).

type finalizeReq struct {
	ctx    context.Context
	id     messages.LogicalMessageID
	fin    persistence.Finalization
	reason persistence.DiscardReason
	reply  func(Finalized, error)
}

func (r *finalizeReq) context() context.Context { return r.ctx }
func (r *finalizeReq) fail(err error)           { r.reply(Finalized{}, err) }

func (r *finalizeReq) handle(a *peerActor) {
	st, verifySeq, err := a.finalizeState(r.ctx, r.id)
	if err != nil {
		r.fail(wrapPeer("finalize", a.peer, err))
		return
	}
	dec := inbound.DecideFinalize(st, inbound.FinalizeInput{Sender: a.peer, ID: r.id, Finalization: r.fin, Reason: r.reason,
		Now: persistence.UnixMilli(a.m.cfg.Now())})
	if dec.Err != nil {
		r.fail(dec.Err)
		return
	}
	wr := &writes{peer: a.peer, id: r.id, deletePending: dec.Effects.DeletePending, putProcessed: dec.Effects.PutProcessed}
	if dec.Effects.DeletePending {
		wr.verifySeq = verifySeq
	}
	w := a.newWork()
	if dec.Effects.PutProcessed != nil {
		a.setIn(w, r.id, &inKey{processed: dec.Effects.PutProcessed})
	}
	var ack []byte
	var ackErr error
	if dec.Effects.Ack {
		ack, ackErr = a.ack(r.ctx, r.id, wr)
	}
	res := Finalized{Outcome: dec.Outcome, Sender: a.peer, ID: r.id}
	a.submit(w, wr, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		if dec.Effects.Ack {
			res.AckSent, res.ack = a.m.handOffAck(a.peer, r.id, ack, ackErr)
		}
		r.reply(res, nil)
	})
}

// ---------------------------------------------------------------------------
// Outbound: Send stores the pending row and its encryption in one item and
// hands the envelope over after it is durable; Resend records the attempt
// with a fresh encryption; Abandon clears the row.

type sendReq struct {
	ctx    context.Context
	id     messages.LogicalMessageID
	body   []byte
	resend bool
	reply  func(Sent, error)
}

func (r *sendReq) context() context.Context { return r.ctx }
func (r *sendReq) fail(err error)           { r.reply(Sent{}, err) }

func (r *sendReq) handle(a *peerActor) {
	cfg := &a.m.cfg
	var cur *persistence.PendingOutbound
	var err error
	if r.resend {
		cur, err = a.outState(r.ctx, r.id)
	} else if pending, perr := a.sendPending(r.ctx, r.id); pending || perr != nil {
		// Only whether it is pending matters to a new Send.
		cur, err = &persistence.PendingOutbound{}, perr
	}
	if err != nil {
		r.fail(wrapPeer("send", a.peer, err))
		return
	}
	now := persistence.UnixMilli(cfg.Now())
	wr := &writes{peer: a.peer, id: r.id}
	w := a.newWork()
	var row persistence.PendingOutbound
	if r.resend {
		if cur == nil {
			r.fail(fmt.Errorf("%w: %s/%s", outbound.ErrNotPending, a.peer, r.id))
			return
		}
		row = *cur
		row.Attempts++
		row.LastAttemptAt = now
	} else {
		if cur != nil {
			r.fail(fmt.Errorf("%w: %s/%s", outbound.ErrAlreadyPending, a.peer, r.id))
			return
		}
		if a.m.abandoned.conflicts(a.peer, r.id, r.body) {
			r.fail(fmt.Errorf("%w: %s/%s was abandoned with another body", ErrLogicalIDReused, a.peer, r.id))
			return
		}
		row = persistence.PendingOutbound{Recipient: a.peer, ID: r.id, CreatedAt: now, Attempts: 1, LastAttemptAt: now, Body: bytes.Clone(r.body)}
		if row.Body == nil {
			row.Body = []byte{}
		}
	}
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: r.id, Body: row.Body})
	if err != nil {
		r.fail(fmt.Errorf("session: send: %w", err))
		return
	}
	e, encErr := a.encrypt(r.ctx, frame)
	if encErr != nil && r.resend {
		// Nothing to hand over: the attempt is not recorded.
		r.fail(encErr)
		return
	}
	if encErr == nil {
		a.adoptEncryption(e, wr)
	}
	slot := &seqSlot{v: row.Sequence}
	if r.resend {
		wr.markAttempt, wr.attemptAt = true, now
	} else {
		// Stored even when the encryption failed: the message is pending
		// and the caller learns it was not handed over (Resend later).
		p := row
		wr.putOutbound, wr.outSlot = &p, slot
	}
	a.setOut(w, r.id, &outKey{pending: &row})
	a.submit(w, wr, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		stored := row
		stored.Sequence = slot.v
		out := Sent{Message: outbound.FromStored(stored), HandOff: encErr}
		if encErr == nil {
			out.env = e.envelope
		}
		r.reply(a.m.handOffSent(a.peer, out), nil)
	})
}

type abandonReq struct {
	ctx   context.Context
	id    messages.LogicalMessageID
	reply func(bool, error)
}

func (r *abandonReq) context() context.Context { return r.ctx }
func (r *abandonReq) fail(err error)           { r.reply(false, err) }

func (r *abandonReq) handle(a *peerActor) {
	cur, err := a.outState(r.ctx, r.id)
	if err != nil {
		r.fail(wrapPeer("abandon", a.peer, err))
		return
	}
	if cur == nil {
		r.reply(false, nil)
		return
	}
	w := a.newWork()
	a.setOut(w, r.id, &outKey{})
	body := cur.Body
	// Retired in the same transaction, so that no Send, even after a
	// restart, puts another body under the id while an ACK of this one
	// may still arrive.
	retire := &persistence.RetiredOutbound{Recipient: a.peer, ID: r.id, How: persistence.RetiredAbandoned,
		RetiredAt: persistence.UnixMilli(a.m.cfg.Now()), Digest: digest.ApplicationMessage(body)}
	a.submit(w, &writes{peer: a.peer, id: r.id, deleteOutbound: true, retire: retire}, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		a.m.abandoned.add(a.peer, r.id, body)
		r.reply(true, nil)
	})
}

// ---------------------------------------------------------------------------
// Plain session operations: Encrypt and Decrypt persist the ratchet step
// alone; AcceptIdentity and ResetSession; Warm only loads.

type encryptReq struct {
	ctx       context.Context
	plaintext []byte
	reply     func([]byte, error)
}

func (r *encryptReq) context() context.Context { return r.ctx }
func (r *encryptReq) fail(err error)           { r.reply(nil, err) }

func (r *encryptReq) handle(a *peerActor) {
	e, err := a.encrypt(r.ctx, r.plaintext)
	if err != nil {
		r.fail(err)
		return
	}
	wr := &writes{peer: a.peer}
	a.adoptEncryption(e, wr)
	a.submit(a.newWork(), wr, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		r.reply(e.envelope, nil)
	})
}

type decryptReq struct {
	ctx      context.Context
	envelope []byte
	reply    func([]byte, error)
}

func (r *decryptReq) context() context.Context { return r.ctx }
func (r *decryptReq) fail(err error)           { r.reply(nil, err) }

func (r *decryptReq) handle(a *peerActor) {
	d, err := a.decrypt(r.ctx, r.envelope)
	if err != nil {
		r.fail(err)
		return
	}
	wr := &writes{peer: a.peer}
	a.adoptDecryption(d, wr)
	a.submit(a.newWork(), wr, func(err error) {
		if err != nil {
			r.fail(wrapPeer("persist", a.peer, err))
			return
		}
		r.reply(d.res.Plaintext, nil)
	})
}

type acceptReq struct {
	ctx      context.Context
	identity ratchet.IdentityPublic
	reply    func(error)
}

func (r *acceptReq) context() context.Context { return r.ctx }
func (r *acceptReq) fail(err error)           { r.reply(err) }

func (r *acceptReq) handle(a *peerActor) {
	id := r.identity
	wr := &writes{peer: a.peer, pin: &id}
	if remote, ok := a.rec.RemoteIdentity(); ok && ratchet.CheckPin(remote, id) != nil {
		wr.deleteSession = true
		a.rec = ratchet.SessionRecord{}
	}
	a.pin = &id
	a.submit(a.newWork(), wr, func(err error) { r.reply(wrapPeer("accept identity", a.peer, err)) })
}

type resetReq struct {
	ctx   context.Context
	reply func(error)
}

func (r *resetReq) context() context.Context { return r.ctx }
func (r *resetReq) fail(err error)           { r.reply(err) }

func (r *resetReq) handle(a *peerActor) {
	a.rec = ratchet.SessionRecord{}
	a.submit(a.newWork(), &writes{peer: a.peer, deleteSession: true}, func(err error) { r.reply(wrapPeer("reset", a.peer, err)) })
}

type warmReq struct {
	ctx   context.Context
	reply func(error)
}

func (r *warmReq) context() context.Context { return r.ctx }
func (r *warmReq) fail(err error)           { r.reply(err) }
func (r *warmReq) handle(*peerActor)        { r.reply(nil) }
