package runtime

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/session"
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
	mu sync.RWMutex
	// peers are the device peers of each device served here (local
	// device → its peer device → host:port of the remote hosting that
	// peer): both where the local device's envelopes to it go and the
	// only devices whose envelopes that local device accepts.
	peers  map[messages.DeviceAddress]map[messages.DeviceAddress]string
	local  map[messages.DeviceAddress]*Node // devices served here
	queues map[linkKey]*envelopeLink        // inbound, in order per (from, to); a drained link is removed

	refused        atomic.Uint64 // envelopes refused by the binding (admitDevice)
	bundlesRefused atomic.Uint64 // bundle requests refused: untrusted requester or past its budget
	bundles        bundleLimiter

	// linkHold, when set (tests: a receiver slower than its senders), is
	// called by a link's drainer before it hands on each envelope.
	linkHold func()

	streamsMu sync.Mutex
	streams   map[string]int // live inbound streams by certificate CommonName
}

// trackStream counts a live inbound stream until the returned func runs
// (when its handler returned: nothing of it runs any more).
func (r *Remote) trackStream(cert *x509.Certificate) func() {
	cn := ""
	if cert != nil {
		cn = cert.Subject.CommonName
	}
	r.dev.streamsMu.Lock()
	if r.dev.streams == nil {
		r.dev.streams = map[string]int{}
	}
	r.dev.streams[cn]++
	r.dev.streamsMu.Unlock()
	return func() {
		r.dev.streamsMu.Lock()
		if r.dev.streams[cn]--; r.dev.streams[cn] == 0 {
			delete(r.dev.streams, cn)
		}
		r.dev.streamsMu.Unlock()
	}
}

// liveStreamsFrom returns how many inbound streams authenticated as cn
// are live (tests wait for a stopped peer's to end before closing).
func (r *Remote) liveStreamsFrom(cn string) int {
	r.dev.streamsMu.Lock()
	defer r.dev.streamsMu.Unlock()
	return r.dev.streams[cn]
}

// AddDevice makes the device addr a device peer of n's device, reachable
// at address (host:port of the remote hosting it), replacing a previous
// address. It returns ErrNoDevice if n has no device.
//
// Device trust is per served node, as the sync plane's peer set is
// (Node.AddPeer): an envelope from addr is accepted only for the device
// of a node that added addr. A remote serving several nodes (Host) keeps
// each node's device peers apart: a device added for node x is refused
// when it sends to node y's device on the same remote, unless y added it
// too.
//
// It also binds addr to that host: an envelope whose From is addr is
// accepted only over a connection authenticated (TLS) as the peer
// configured with AddPeer at the same address — the sync plane's
// binding, so a device shares the certificate of the cluster member that
// hosts it. An envelope from a device the addressed node did not add, or
// over any other connection, is refused at the stream guard before it
// reaches a device (counted in RefusedEnvelopes) and no state is kept
// for it. Without TLS (RemoteConfig.Plaintext) nothing is authenticated:
// From must still be a device the addressed node added.
//
// A device moving to another cluster member: call AddDevice(n, addr,
// newAddress) (and AddPeer for the new member if it is not configured
// yet). From then on addr's envelopes are accepted only from the new
// member; envelopes still in flight from the old one are refused, stay
// pending at the sender, and reach this node again on its next resend
// (DeviceConfig.Retry or Resend) over the new member.
func (r *Remote) AddDevice(n *Node, addr messages.DeviceAddress, address string) error {
	if n == nil || n.DeviceAddress() == (messages.DeviceAddress{}) {
		return ErrNoDevice
	}
	if err := addr.Validate(); err != nil {
		return err
	}
	self := n.DeviceAddress()
	r.dev.mu.Lock()
	defer r.dev.mu.Unlock()
	if r.dev.peers == nil {
		r.dev.peers = map[messages.DeviceAddress]map[messages.DeviceAddress]string{}
	}
	if r.dev.peers[self] == nil {
		r.dev.peers[self] = map[messages.DeviceAddress]string{}
	}
	r.dev.peers[self][addr] = address
	return nil
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
	addr, ok := t.r.dev.peers[t.self][peer]
	if !ok {
		return "", fmt.Errorf("%w: unknown device %s (not a device peer of %s)", replicate.ErrUnreachable, peer, t.self)
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

// The remote's hand-off only queues (one endpoint writer per address,
// one stream, and the receiver's link queue per (from, to)): it is the
// session layer's ordered hand-off.
var _ session.OrderedTransport = (*remoteDeviceTransport)(nil)

// Send hands the envelope to the remote toward peer (one way).
func (t *remoteDeviceTransport) Send(ctx context.Context, peer messages.DeviceAddress, envelope []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return t.Enqueue(peer, envelope)
}

// Enqueue implements session.OrderedTransport: the envelope is queued on
// the endpoint toward peer's host, behind those sent before it, and
// Enqueue returns without waiting for the receiver.
func (t *remoteDeviceTransport) Enqueue(peer messages.DeviceAddress, envelope []byte) error {
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

// RefusedEnvelopes counts the device envelopes the stream guard refused:
// a From that is not a device peer (AddDevice) of the addressed device's
// node, or not one configured at the connection's authenticated peer.
func (r *Remote) RefusedEnvelopes() uint64 { return r.dev.refused.Load() }

// RefusedBundleRequests counts the bundle requests the stream guard
// refused: from a requester the addressed device's node does not trust
// (authorizeBundle), or past their requester's budget (LimitBundles).
func (r *Remote) RefusedBundleRequests() uint64 { return r.dev.bundlesRefused.Load() }

// remotePeerNamed is a configured peer's name and address.
type remotePeerNamed struct{ name, addr string }

// bundleRequestTo reads only the addressed device of a bundle request's
// CBOR (the full decode happens once, in the endpoint reader).
func bundleRequestTo(b []byte) (messages.DeviceAddress, error) {
	var q struct {
		_  struct{} `cbor:",toarray"`
		To messages.DeviceAddress
	}
	if err := cbor.Unmarshal(b, &q); err != nil {
		return q.To, err
	}
	return q.To, q.To.Validate()
}

// authorizeBundle decides whether a bundle request for the local device
// to, over a stream authenticated by cert and answered at replyAddr, may
// be served. Every bundle hands out one of to's one-time prekeys, so only
// a requester to's node trusts is answered (SSP/1 §14: a node answers its
// own peers): with TLS, cert must be that of a peer configured (AddPeer)
// at the address of one of to's device peers (AddDevice for that node,
// the binding authorizeDevice checks for envelopes), or of a peer of to's
// node (Node.AddPeer, AcceptPeer). Without TLS nothing is authenticated:
// replyAddr must be such an address. A request for a device not served
// here passes (answerBundle rejects it; nothing is issued).
func (r *Remote) authorizeBundle(to messages.DeviceAddress, cert *x509.Certificate, replyAddr string) error {
	r.dev.mu.RLock()
	n := r.dev.local[to]
	addrs := make(map[string]bool, len(r.dev.peers[to]))
	for _, a := range r.dev.peers[to] {
		addrs[a] = true
	}
	r.dev.mu.RUnlock()
	if n == nil {
		return nil
	}
	// The configured peers this connection authenticates as (without
	// TLS: those at the reply address), copied out so that the node's
	// peer set is read without holding r.mu.
	var as []remotePeerNamed
	r.mu.RLock()
	for name, p := range r.bound {
		if (r.cfg.TLS == nil && p.addr == replyAddr) || (r.cfg.TLS != nil && p.matches(name, cert)) {
			as = append(as, remotePeerNamed{name, p.addr})
		}
	}
	r.mu.RUnlock()
	for _, p := range as {
		if addrs[p.addr] || n.acceptsPeer(p.name) {
			return nil
		}
	}
	if r.cfg.TLS == nil && addrs[replyAddr] {
		return nil
	}
	who := "no certificate"
	switch {
	case r.cfg.TLS == nil:
		who = "the reply address " + truncateName(replyAddr)
	case cert != nil:
		who = "the certificate of " + truncateName(cert.Subject.CommonName)
	}
	return fmt.Errorf("%w: bundle request for %s over a connection with %s, not a device peer or peer of its node", ErrUnknownSender, truncateName(to.String()), who)
}

// envelopeAddrs reads only the addresses of a device envelope's CBOR (the
// full decode happens once, in the endpoint reader).
func envelopeAddrs(b []byte) (from, to messages.DeviceAddress, err error) {
	var e struct {
		_    struct{} `cbor:",toarray"`
		From messages.DeviceAddress
		To   messages.DeviceAddress
		Env  cbor.RawMessage
	}
	if err := cbor.Unmarshal(b, &e); err != nil {
		return from, to, err
	}
	if err := e.From.Validate(); err != nil {
		return from, to, err
	}
	return e.From, e.To, e.To.Validate()
}

// authorizeDevice decides whether an envelope claiming to be from from,
// addressed to the local device to, over a stream authenticated by cert,
// may reach to: from must be a device peer of to's node (AddDevice for
// that node; SSP/1 §14: a node answers its own peers) and, with TLS, cert
// must be that of the peer configured (AddPeer) at the address that node
// gave for from.
func (r *Remote) authorizeDevice(from, to messages.DeviceAddress, cert *x509.Certificate) error {
	r.dev.mu.RLock()
	address, ok := r.dev.peers[to][from]
	r.dev.mu.RUnlock()
	if !ok {
		return fmt.Errorf("%w: %s is not a device peer of %s", replicate.ErrUnknownSender, truncateName(from.String()), truncateName(to.String()))
	}
	if r.cfg.TLS == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name, p := range r.bound {
		if p.addr == address && p.matches(name, cert) {
			return nil
		}
	}
	who := "no certificate"
	if cert != nil {
		who = "the certificate of " + truncateName(cert.Subject.CommonName)
	}
	return fmt.Errorf("%w: envelope from %s over a connection with %s, not the peer at %s", replicate.ErrSenderMismatch, truncateName(from.String()), who, address)
}

// admitDevice runs in the stream guard for the delivery plane's frames: a
// device envelope passes only from a device peer of the addressed
// device's node, bound to the connection's authenticated peer
// (authorizeDevice); a bundle request only from a requester the
// addressed device's node trusts (authorizeBundle) and within its
// requester's budget (LimitBundles; a refused one is answered with a
// rejection when the answer goes to the authenticated peer). It reports
// whether the frame goes on to the sync actor.
func (r *Remote) admitDevice(env envelopeView, b *remote.MessageBatch, e *remote.MessageEnvelope, cert *x509.Certificate) bool {
	replyAddr := ""
	if e.Sender > 0 {
		replyAddr = b.Senders[e.Sender-1].Address
	}
	if env.Type == wire.TypeBundleRequest {
		if to, err := bundleRequestTo(env.Cbor); err == nil {
			if err := r.authorizeBundle(to, cert, replyAddr); err != nil {
				// Refused before the budget: an untrusted requester
				// keeps no state here and consumes no prekey.
				r.dev.bundlesRefused.Add(1)
				r.log.Debug("bundle request refused by the stream guard", "error", err)
				if e.Sender > 0 && (r.cfg.TLS == nil || r.replyAllowed(cert, replyAddr)) {
					r.reply(b.Senders[e.Sender-1], &wire.Rejected{Reason: err.Error()})
				}
				return false
			}
		}
		// Undecodable: the endpoint reader surfaces it and answers with
		// a rejection (within the budget below).
		//
		// The requester: its TLS key, or (plaintext, nothing
		// authenticated) the address it asks to be answered at.
		key := "addr:" + replyAddr
		if cert != nil {
			h := SPKIHash(cert)
			key = "key:" + string(h[:])
		}
		if r.dev.bundles.allow(key, time.Now()) {
			return true
		}
		r.dev.bundlesRefused.Add(1)
		if e.Sender > 0 && (r.cfg.TLS == nil || r.replyAllowed(cert, replyAddr)) {
			r.reply(b.Senders[e.Sender-1], &wire.Rejected{Reason: ErrBundleRateLimited.Error()})
		}
		return false
	}
	from, to, err := envelopeAddrs(env.Cbor)
	if err != nil {
		// Undecodable: the endpoint reader surfaces it and drops it.
		return true
	}
	if err := r.authorizeDevice(from, to, cert); err != nil {
		r.dev.refused.Add(1)
		r.log.Debug("envelope refused by the stream guard", "error", err)
		return false
	}
	return true
}

// deviceFrame reports whether a message the sync actor got through the
// remote is one of the delivery plane's, which take no inbound token.
func deviceFrame(msg any) bool {
	switch m := msg.(type) {
	case *wire.DeviceEnvelope, *wire.BundleRequest:
		return true
	case *wire.Undecodable:
		return m.Type == wire.TypeDeviceEnvelope || m.Type == wire.TypeBundleRequest
	}
	return false
}

// Defaults of LimitBundles.
const (
	DefaultBundleBurst      = 32
	DefaultBundlesPerSecond = 1.0
	// maxBundleRequesters bounds the requesters tracked at once.
	maxBundleRequesters = 4096
)

// LimitBundles sets the bundle budget of each requester (a TLS key, or a
// reply address without TLS): a burst of burst requests, refilled at
// perSecond. Every bundle issued hands out a one-time prekey, so an
// unbounded requester could cycle them out; an honest
// device asks once per new session. Default DefaultBundleBurst and
// DefaultBundlesPerSecond; burst ≤ 0 turns the limit off.
func (r *Remote) LimitBundles(perSecond float64, burst int) {
	r.dev.bundles.mu.Lock()
	defer r.dev.bundles.mu.Unlock()
	r.dev.bundles.rate, r.dev.bundles.burst, r.dev.bundles.set = perSecond, burst, true
	r.dev.bundles.buckets = nil
}

// bundleLimiter is a token bucket per requester, bounded in how many
// requesters it tracks.
type bundleLimiter struct {
	mu      sync.Mutex
	set     bool
	rate    float64
	burst   int
	buckets map[string]*tokenBucket
}

type tokenBucket struct {
	tokens float64
	at     time.Time
}

func (l *bundleLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.set {
		l.rate, l.burst, l.set = DefaultBundlesPerSecond, DefaultBundleBurst, true
	}
	if l.burst <= 0 {
		return true
	}
	if l.buckets == nil {
		l.buckets = map[string]*tokenBucket{}
	}
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= maxBundleRequesters {
			// Forget the requesters whose budget is full again (they
			// lose nothing); if none is, refuse the newcomer.
			for k, o := range l.buckets {
				if o.tokens+now.Sub(o.at).Seconds()*l.rate >= float64(l.burst) {
					delete(l.buckets, k)
				}
			}
			if len(l.buckets) >= maxBundleRequesters {
				return false
			}
		}
		b = &tokenBucket{tokens: float64(l.burst), at: now}
		l.buckets[key] = b
	}
	b.tokens = min(float64(l.burst), b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// deliverDevice hands an inbound envelope to the local device it names,
// in order per (from, to), off the actor goroutine. A link's state lives
// only while it holds envelopes: the drainer removes it when it empties
// (so idle or spoofed links keep nothing).
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
	// Added under dev.mu: the drainer removes an empty link under it too,
	// so an envelope never lands on a link already removed.
	start, ok := l.add(m.Envelope, false)
	r.dev.mu.Unlock()
	if !ok {
		// Never silent: counted and noticed by the receiving node (the
		// sender, in another process, keeps the message pending and its
		// retry schedule sends it again).
		n.envelopeDropped(m.From, fmt.Errorf("%w: %s to %s holds %d envelopes", ErrLinkFull, m.From, m.To, maxLinkQueue))
		return
	}
	if !start {
		return
	}
	r.inflight.Add(1)
	go func() {
		defer r.inflight.Done()
		for {
			r.dev.mu.Lock()
			env, ok := l.next()
			if !ok && r.dev.queues[k] == l {
				delete(r.dev.queues, k)
			}
			r.dev.mu.Unlock()
			if !ok {
				return
			}
			if hold := r.dev.linkHold; hold != nil {
				hold()
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
	n.attachTransport(r) // a receive-only node pulls over it
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
