package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// Reconciliation over the remote: a request (wire.ReconcileRequest) goes
// to the peer's sync actor like a push and is answered to the requester's
// future (wire.ReconcileReply). The stream guard binds a request to the
// TLS-authenticated peer exactly as it binds a push (its "from" must be
// the peer the client certificate authenticates, its answer address that
// peer's configured address), so the responder attributes the session —
// its busy slot, its scope — to that peer only. Bodies are bounded by the
// same limits for the writer and the reader (wire.MaxReconcileRequestBody,
// wire.MaxReconcileReplyBody), and the messages inside them by the strict
// decoders of package messages.

var _ reconcileTransport = (*Remote)(nil)

// reaches reports whether peer has an address here (Remote.AddPeer): a
// node that only accepts a peer pulls from it over this remote only then.
func (r *Remote) reaches(peer string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.peers[peer]
	return ok
}

// reconcileCall carries one reconciliation request to peer and waits for
// its answer. from is the calling node's name as peer knows it (the
// stream guard checks it against this remote's client certificate).
func (r *Remote) reconcileCall(ctx context.Context, from, peer string, kind byte, req []byte) ([]byte, error) {
	env, err := wire.EnvelopeOf(&wire.ReconcileRequest{From: from, To: peer, Kind: kind, Body: req})
	if err != nil {
		return nil, fmt.Errorf("runtime: reconcile with %s: %w", peer, err)
	}
	timeout, byCtx := r.timeout, false
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout, byCtx = time.Until(dl), true
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return nil, fmt.Errorf("%w: %w", replicate.ErrUnreachable, ErrRemoteClosed)
	}
	addr, ok := r.peers[peer]
	if !ok {
		r.mu.RUnlock()
		return nil, fmt.Errorf("%w: unknown peer %q", replicate.ErrUnreachable, peer)
	}
	f := r.sys.Root.RequestFuture(actor.NewPID(addr, SyncActorName), env, timeout)
	r.mu.RUnlock()
	r.countSent(len(env.Cbor))

	type answer struct {
		v   any
		err error
	}
	done := make(chan answer, 1)
	go func() { v, err := f.Result(); done <- answer{v, err} }()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	switch {
	case errors.Is(a.err, actor.ErrTimeout):
		if byCtx || ctx.Err() != nil {
			return nil, context.DeadlineExceeded
		}
		return nil, fmt.Errorf("%w: reconcile with %s at %s: no answer within %v", replicate.ErrUnreachable, peer, addr, timeout)
	case errors.Is(a.err, actor.ErrDeadLetter):
		return nil, fmt.Errorf("%w: reconcile with %s at %s: not connected or not serving", replicate.ErrUnreachable, peer, addr)
	case a.err != nil:
		return nil, fmt.Errorf("%w: reconcile with %s at %s: %w", replicate.ErrUnreachable, peer, addr, a.err)
	}
	v := a.v
	if e, ok := v.(*wire.Envelope); ok { // answered in-process
		v, _ = e.Deserialize()
	}
	switch m := v.(type) {
	case *wire.ReconcileReply:
		r.countRecv(m.Size)
		switch m.Status {
		case wire.ReconcileOK:
			return m.Body, nil
		case wire.ReconcileBusy:
			return nil, fmt.Errorf("%w: %s: %s", ErrReconcileBusy, peer, m.Reason)
		default:
			return nil, fmt.Errorf("%w: %s: %s", ErrReconcileRefused, peer, m.Reason)
		}
	case *wire.Rejected: // the stream guard, or a frame the peer could not decode
		r.countRecv(m.Size)
		return nil, fmt.Errorf("%w: %s: %s", ErrReconcileRefused, peer, m.Reason)
	case *wire.Undecodable:
		r.surface(m, "reconcile answer from "+peer)
		return nil, peerErr(peer, m)
	default:
		return nil, peerErr(peer, fmt.Errorf("unexpected answer %T", v))
	}
}

// serveReconcile answers a peer's reconciliation request off the actor
// goroutine, bounded with pushes by MaxConcurrentPushes (waiting holds the
// mailbox: backpressure). m.From is the peer the stream guard
// authenticated (with TLS; plaintext authenticates nothing).
func (r *Remote) serveReconcile(sender *actor.PID, m *wire.ReconcileRequest, pool *inPool) {
	r.countRecv(m.Size)
	var h reconcileHandler
	if box := r.receiverFor(m.To); box != nil {
		h, _ = box.r.(reconcileHandler)
	}
	if h == nil {
		r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileFailed, Reason: "no reconciliation receiver"})
		pool.release()
		return
	}
	if err := r.peerOfNode(h, m.From); err != nil {
		r.log.Info("reconciliation request refused", "from", m.From, "to", m.To, "err", err)
		r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileInvalid, Reason: err.Error()})
		pool.release()
		return
	}
	sem := r.in.shared.sem
	if pool != nil {
		sem = pool.sem
	}
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		defer pool.release() // after the answer was sent
		select {
		case sem <- struct{}{}:
		case <-r.baseCtx.Done():
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileFailed, Reason: "closing"})
			return
		}
		defer func() { <-sem }()
		ctx, cancel := context.WithTimeout(r.baseCtx, r.timeout)
		defer cancel()
		out, err := h.handleReconcile(ctx, m.From, m.Kind, m.Body)
		switch {
		case err == nil && len(out) > wire.MaxReconcileReplyBody:
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileFailed, Reason: "answer over the reply limit"})
		case err == nil:
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileOK, Body: out})
		case errors.Is(err, ErrReconcileBusy):
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileBusy, Reason: err.Error()})
		case errors.Is(err, ErrReconcilePeer):
			r.log.Info("reconciliation request refused", "from", m.From, "err", err)
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileInvalid, Reason: err.Error()})
		default:
			r.reply(sender, &wire.ReconcileReply{Status: wire.ReconcileFailed, Reason: err.Error()})
		}
	}()
}
