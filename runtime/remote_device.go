package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// The delivery plane over the remote: the same gRPC connections and the
// same actor (SyncActorName) carry ratchet envelopes between devices and
// prekey bundle fetches. Envelopes are one way (the receiver's ACK is an
// envelope of its own): the sender's message stays pending until that ACK
// arrives, so a lost envelope is a retry, never a loss.

// remoteDevices is the device-plane state of a Remote.
type remoteDevices struct {
	mu     sync.RWMutex
	peers  map[messages.DeviceAddress]string // remote devices → host:port
	local  map[messages.DeviceAddress]*Node  // devices served here
	queues map[linkKey]*envelopeLink         // inbound, in order per (from, to)
}

// AddDevice makes the device addr reachable at address (host:port of the
// remote hosting it), replacing a previous address.
func (r *Remote) AddDevice(addr messages.DeviceAddress, address string) {
	r.dev.mu.Lock()
	defer r.dev.mu.Unlock()
	if r.dev.peers == nil {
		r.dev.peers = map[messages.DeviceAddress]string{}
	}
	r.dev.peers[addr] = address
}

// ServeDevice makes this remote deliver envelopes and bundle requests for
// n's device to n (several nodes on one actor system share one remote).
func (r *Remote) ServeDevice(n *Node) {
	r.dev.mu.Lock()
	defer r.dev.mu.Unlock()
	if r.dev.local == nil {
		r.dev.local = map[messages.DeviceAddress]*Node{}
	}
	r.dev.local[n.DeviceAddress()] = n
}

// DeviceTransport returns the transport of the local device self over
// this remote (DeviceConfig.Transport).
func (r *Remote) DeviceTransport(self messages.DeviceAddress) DeviceTransport {
	return &remoteDeviceTransport{r: r, self: self}
}

type remoteDeviceTransport struct {
	r    *Remote
	self messages.DeviceAddress
}

func (t *remoteDeviceTransport) address(peer messages.DeviceAddress) (string, error) {
	t.r.mu.RLock()
	closed := t.r.closed
	t.r.mu.RUnlock()
	if closed {
		return "", fmt.Errorf("%w: %w", replicate.ErrUnreachable, ErrRemoteClosed)
	}
	t.r.dev.mu.RLock()
	defer t.r.dev.mu.RUnlock()
	addr, ok := t.r.dev.peers[peer]
	if !ok {
		return "", fmt.Errorf("%w: unknown device %s", replicate.ErrUnreachable, peer)
	}
	return addr, nil
}

// FetchBundle asks the remote hosting peer for a fresh prekey bundle.
func (t *remoteDeviceTransport) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	addr, err := t.address(peer)
	if err != nil {
		return nil, err
	}
	env, err := wire.EnvelopeOf(&wire.BundleRequest{To: peer})
	if err != nil {
		return nil, err
	}
	timeout := t.r.timeout
	f := t.r.sys.Root.RequestFuture(actor.NewPID(addr, SyncActorName), env, timeout)
	t.r.countSent(len(env.Cbor))
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
	if a.err != nil {
		return nil, fmt.Errorf("%w: bundle of %s at %s: %w", replicate.ErrUnreachable, peer, addr, a.err)
	}
	v := a.v
	if e, ok := v.(*wire.Envelope); ok {
		v, _ = e.Deserialize()
	}
	switch m := v.(type) {
	case *wire.Bundle:
		t.r.countRecv(m.Size)
		return m.Bundle, nil
	case *wire.Rejected:
		return nil, fmt.Errorf("%w: bundle of %s: %s", ErrPushRejected, peer, m.Reason)
	case *wire.Undecodable:
		t.r.surface(m, "bundle answer from "+addr)
		return nil, fmt.Errorf("%w: bundle of %s: %w", ErrBadResponse, peer, m)
	}
	return nil, fmt.Errorf("%w: bundle of %s: unexpected %T", ErrBadResponse, peer, v)
}

// Send hands the envelope to the remote toward peer (one way).
func (t *remoteDeviceTransport) Send(ctx context.Context, peer messages.DeviceAddress, envelope []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	addr, err := t.address(peer)
	if err != nil {
		return err
	}
	env, err := wire.EnvelopeOf(&wire.DeviceEnvelope{From: t.self, To: peer, Envelope: envelope})
	if err != nil {
		return err
	}
	t.r.sys.Root.Send(actor.NewPID(addr, SyncActorName), env)
	t.r.countSent(len(env.Cbor))
	t.r.metrics.pushes.WithLabelValues("device_sent").Inc()
	return nil
}

// deliverDevice hands an inbound envelope to the local device it names,
// in order per (from, to), off the actor goroutine.
func (r *Remote) deliverDevice(m *wire.DeviceEnvelope) {
	r.countRecv(m.Size)
	r.metrics.pushes.WithLabelValues("device_received").Inc()
	r.dev.mu.Lock()
	n := r.dev.local[m.To]
	if n == nil {
		r.dev.mu.Unlock()
		r.log.Warn("envelope for a device not served here", "to", m.To.String(), "from", m.From.String())
		return
	}
	if r.dev.queues == nil {
		r.dev.queues = map[linkKey]*envelopeLink{}
	}
	k := linkKey{m.From, m.To}
	l := r.dev.queues[k]
	if l == nil {
		l = newEnvelopeLink()
		r.dev.queues[k] = l
	}
	r.dev.mu.Unlock()
	if !l.add(m.Envelope, false) {
		return
	}
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		for {
			env, ok := l.next()
			if !ok {
				return
			}
			// Pipelined, in order: up to linkWindow envelopes of the link
			// are being decided and written at once.
			l.window <- struct{}{}
			r.inflight.Add(1)
			ctx, cancel := context.WithTimeout(r.baseCtx, r.timeout)
			done := func(err error) {
				if err != nil && !errors.Is(err, context.Canceled) {
					// The sender keeps the message pending and retries.
					r.log.Debug("envelope not accepted", "from", m.From.String(), "to", m.To.String(), "err", err)
				}
				cancel()
				<-l.window
				r.inflight.Done()
			}
			if err := n.receiveEnvelopeAsync(ctx, m.From, env, done); err != nil {
				done(err)
			}
		}
	}()
}

// answerBundle serves a bundle request for a local device.
func (r *Remote) answerBundle(sender *actor.PID, m *wire.BundleRequest) {
	r.countRecv(m.Size)
	r.dev.mu.RLock()
	n := r.dev.local[m.To]
	r.dev.mu.RUnlock()
	if n == nil {
		r.reply(sender, &wire.Rejected{Reason: "no such device here"})
		return
	}
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		ctx, cancel := context.WithTimeout(r.baseCtx, r.timeout)
		defer cancel()
		b, err := n.Bundle(ctx)
		if err != nil {
			r.reply(sender, &wire.Rejected{Reason: err.Error()})
			return
		}
		r.reply(sender, &wire.Bundle{Bundle: b})
	}()
}

// Host serves node n on this remote: its sync pushes (routed by the name
// peers push to, n.Name()) and its device's envelopes. Many nodes on one
// actor system share its one remote this way (multi-tenant hosting):
// open them with Config.System set and DeviceConfig.Transport =
// r.DeviceTransport(address), then Host each.
func (r *Remote) Host(n *Node) {
	r.named.Lock()
	if r.hosted == nil {
		r.hosted = map[string]*receiverBox{}
	}
	r.hosted[n.Name()] = &receiverBox{r: n}
	r.named.Unlock()
	if n.DeviceAddress() != (messages.DeviceAddress{}) {
		r.ServeDevice(n)
	}
}

// Unhost stops serving node n (its pushes then go to Serve's receiver, or
// are rejected).
func (r *Remote) Unhost(n *Node) {
	r.named.Lock()
	delete(r.hosted, n.Name())
	r.named.Unlock()
	r.dev.mu.Lock()
	delete(r.dev.local, n.DeviceAddress())
	r.dev.mu.Unlock()
}

// receiverFor picks the receiver of a push addressed to name: a hosted
// node of that name, else the one given to Serve.
func (r *Remote) receiverFor(name string) *receiverBox {
	if name != "" {
		r.named.RLock()
		box := r.hosted[name]
		r.named.RUnlock()
		if box != nil {
			return box
		}
	}
	return r.recv.Load()
}
