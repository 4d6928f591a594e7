package runtime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime/internal/panics"
)

// SyncActorName is the name of the actor that receives SSP/1 §14 pushes on
// every node's remote: a push to the node at address A goes to the PID
// (A, SyncActorName).
const SyncActorName = "syncmesh.sync"

// Defaults of RemoteConfig.
const (
	// DefaultRemoteRequestTimeout bounds a push's round trip.
	DefaultRemoteRequestTimeout = 10 * time.Second
	// DefaultRemoteMaxConcurrentPushes bounds the pushes handled at once.
	DefaultRemoteMaxConcurrentPushes = 64
	// DefaultRemoteMaxMessageBytes bounds one inbound gRPC message, which
	// is one protoactor batch of envelopes: two maximal pushes and slack.
	DefaultRemoteMaxMessageBytes = 2*messages.MaxPushBytes + 1<<20
)

// remoteWindowBytes is the HTTP/2 flow-control window of inbound streams.
const remoteWindowBytes = 4 << 20

// RemoteConfig configures the protoactor-go remote (gRPC) transport of the
// sync plane. Either TLS (with ClientTLS) or Plaintext must be set: events
// are signed but not encrypted, so plaintext is only ever an explicit
// choice (docs/protocol.md, "Transport security").
type RemoteConfig struct {
	// Host is the interface to listen on. Empty: 127.0.0.1.
	Host string
	// Port is the TCP port to listen on; 0 picks a free one (see
	// Remote.Address).
	Port int
	// AdvertisedAddress is the host:port peers use to reach this node, when
	// it differs from the listening address (NAT, 0.0.0.0). Responses to
	// our pushes are sent there, so it must be reachable by every peer.
	AdvertisedAddress string
	// TLS is the server side of mutual TLS: a certificate and ClientCAs,
	// with ClientAuth set to tls.RequireAndVerifyClientCert.
	TLS *tls.Config
	// ClientTLS is the dialing side of mutual TLS: a client certificate
	// and RootCAs. Required with TLS: protoactor connections are one-way,
	// so a peer's answers come over a connection this node dials.
	ClientTLS *tls.Config
	// Plaintext runs gRPC without TLS. It must be set explicitly; it is an
	// error together with TLS.
	Plaintext bool
	// RequestTimeout bounds a push round trip (a shorter context deadline
	// wins) and the receiver's handling of one push. Zero:
	// DefaultRemoteRequestTimeout.
	RequestTimeout time.Duration
	// MaxConcurrentPushes bounds the pushes of one peer handed to the
	// Receiver at once; at most twice as many of a peer's pushes are held
	// (received and not yet answered), then the stream guard stops reading
	// that peer's stream and gRPC flow control pushes back (see
	// remote_inbound.go). Zero: DefaultRemoteMaxConcurrentPushes.
	MaxConcurrentPushes int
	// MaxMessageBytes bounds one inbound gRPC message (one protoactor
	// batch). A larger batch is refused by gRPC itself, which resets that
	// connection: the pushes in it fail and are offered again next cycle.
	// Zero: DefaultRemoteMaxMessageBytes.
	MaxMessageBytes int
	// AllowedProtoTypes lists protobuf message names accepted from peers
	// besides syncmesh's envelope and the protoactor system messages the
	// remote itself uses (DeadLetterResponse, Watch, Unwatch, Terminated).
	// Every other type is dropped before protoactor sees it and surfaced
	// as undecodable (an unknown type would crash the process).
	AllowedProtoTypes []string
	// OnUndecodable, if set, is called with every frame that did not
	// decode (after it is counted and logged). It may be called from
	// several goroutines at once and must not block.
	OnUndecodable func(wire.Undecodable)
	// Logger receives the transport's logs. Nil: discarded. protoactor's
	// own logs go to the actor system's logger; gRPC's global logger is
	// silenced by protoactor's Start.
	Logger *slog.Logger
	// Registerer receives the transport's metrics. Nil: not registered.
	Registerer prometheus.Registerer

	// startFault, tests only, is called after each phase of StartRemote
	// (its name from startPhases); an error fails StartRemote there.
	startFault func(phase string) error
}

func (c *RemoteConfig) validate() error {
	switch {
	case c.TLS == nil && !c.Plaintext:
		return &ConfigError{"RemoteConfig.TLS", "required unless RemoteConfig.Plaintext is set explicitly"}
	case c.TLS != nil && c.Plaintext:
		return &ConfigError{"RemoteConfig.Plaintext", "set together with RemoteConfig.TLS"}
	case c.TLS != nil && c.TLS.ClientAuth != tls.RequireAndVerifyClientCert:
		return &ConfigError{"RemoteConfig.TLS", "ClientAuth must be tls.RequireAndVerifyClientCert (mutual TLS)"}
	case c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil:
		return &ConfigError{"RemoteConfig.TLS", "no server certificate"}
	case c.TLS != nil && c.ClientTLS == nil:
		return &ConfigError{"RemoteConfig.ClientTLS", "required with RemoteConfig.TLS"}
	case c.ClientTLS != nil && c.TLS == nil:
		return &ConfigError{"RemoteConfig.ClientTLS", "set without RemoteConfig.TLS"}
	case c.ClientTLS != nil && len(c.ClientTLS.Certificates) == 0 && c.ClientTLS.GetClientCertificate == nil:
		return &ConfigError{"RemoteConfig.ClientTLS", "no client certificate"}
	case c.ClientTLS != nil && c.ClientTLS.InsecureSkipVerify:
		return &ConfigError{"RemoteConfig.ClientTLS", "InsecureSkipVerify is not allowed"}
	case c.Port < 0 || c.Port > 65535:
		return &ConfigError{"RemoteConfig.Port", "out of range"}
	case c.RequestTimeout < 0:
		return &ConfigError{"RemoteConfig.RequestTimeout", "negative"}
	case c.MaxConcurrentPushes < 0:
		return &ConfigError{"RemoteConfig.MaxConcurrentPushes", "negative"}
	case c.MaxMessageBytes < 0:
		return &ConfigError{"RemoteConfig.MaxMessageBytes", "negative"}
	}
	if c.AdvertisedAddress != "" {
		if _, _, err := net.SplitHostPort(c.AdvertisedAddress); err != nil {
			return &ConfigError{"RemoteConfig.AdvertisedAddress", err.Error()}
		}
	}
	return nil
}

// RemoteStats are the transport's counters since StartRemote.
type RemoteStats struct {
	// PayloadBytesSent and PayloadBytesReceived count the CBOR payload
	// bytes of the envelopes this transport sent and received (pushes,
	// results, rejections); protobuf and gRPC framing are not counted.
	PayloadBytesSent     uint64
	PayloadBytesReceived uint64
	// PushesSent counts pushes sent; PushesReceived pushes decoded.
	PushesSent     uint64
	PushesReceived uint64
	// Undecodable counts frames surfaced as undecodable, from peers'
	// pushes, peers' answers and the stream guard.
	Undecodable uint64
	// InboundStreams counts gRPC streams peers opened to this node (one
	// per connected peer unless connections were reset).
	InboundStreams uint64
	// RefusedPushes counts pushes the stream guard refused: a From that
	// is not the peer the TLS client certificate authenticates, or an
	// answer address that is not that peer's.
	RefusedPushes uint64
	// InboundHeld counts the envelopes received and not yet answered now
	// (each holds a token of its peer's inbound pool); InboundPeak is the
	// most one pool ever held (at most 2 × MaxConcurrentPushes);
	// InboundWaits counts the times the stream guard stopped reading a
	// stream because its pool was full (push-back).
	InboundHeld, InboundPeak, InboundWaits uint64
}

// Remote is a node's protoactor-go remote (gRPC) transport for SSP/1 §14
// pushes. It implements replicate.Transport; Serve connects the node's
// replicate.Receiver. It is safe for concurrent use.
type Remote struct {
	sys     *actor.ActorSystem
	rem     *remote.Remote
	cfg     RemoteConfig
	log     *slog.Logger
	timeout time.Duration
	allowed map[string]bool
	metrics *remoteMetrics

	probes probeState // addresses that answered (remote_probe.go)

	recv atomic.Pointer[receiverBox]

	mu     sync.RWMutex // guards peers, bound and closed; held for reading around every send
	peers  map[string]string
	bound  map[string]remotePeer // remote_peers.go
	closed bool

	// in bounds what peers can make this node hold: a token per envelope
	// the stream guard let through to the sync actor and not yet answered,
	// per peer; the guard blocks when a peer's pool is full (push-back
	// through gRPC flow control). remote_inbound.go.
	in *inbound

	pid       *actor.PID
	evMu      sync.Mutex // see Close
	readers   readerGate // see stopServer
	evSub     *eventstream.Subscription
	baseCtx   context.Context
	cancel    context.CancelFunc
	inflight  sync.WaitGroup
	closers   closerStack // what StartRemote started, unwound by Close (closers.go)
	closeOnce sync.Once
	closeErr  error

	dev remoteDevices // the delivery plane (remote_device.go)

	named  sync.RWMutex
	hosted map[string]*receiverBox // nodes served by name (Host)

	bytesSent, bytesRecv   atomic.Uint64
	pushesSent, pushesRecv atomic.Uint64
	undecodable, streams   atomic.Uint64
	refused                atomic.Uint64
}

type receiverBox struct{ r replicate.Receiver }

var _ replicate.Transport = (*Remote)(nil)

// StartRemote configures and starts protoactor's remote on sys and spawns
// the sync actor (SyncActorName). The system must not have a remote yet.
// A taken port is an error wrapping ErrRemoteListen, never a panic.
//
// Starting runs the phases of startPhases in order; each pushes what it
// started on the transport's closer stack, which an error in a later
// phase unwinds, as Close does (closers.go).
func StartRemote(sys *actor.ActorSystem, cfg RemoteConfig) (*Remote, error) {
	r, err := newRemote(sys, cfg)
	if err != nil {
		return nil, err
	}
	if err := runPhases(r.startPhases(), cfg.startFault); err != nil {
		_ = r.teardown()
		return nil, err
	}
	r.log.Info("remote started", "address", r.Address(), "tls", cfg.TLS != nil)
	return r, nil
}

// newRemote checks cfg and builds the transport with its defaults and
// metrics. It starts nothing.
func newRemote(sys *actor.ActorSystem, cfg RemoteConfig) (*Remote, error) {
	if sys == nil {
		return nil, &ConfigError{"System", "nil actor system"}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	r := &Remote{
		sys:     sys,
		cfg:     cfg,
		log:     cfg.Logger,
		timeout: cfg.RequestTimeout,
		peers:   map[string]string{},
		allowed: allowedProtoTypes(cfg.AllowedProtoTypes),
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.log = r.log.With("component", "remote")
	if r.timeout == 0 {
		r.timeout = DefaultRemoteRequestTimeout
	}
	n := cfg.MaxConcurrentPushes
	if n == 0 {
		n = DefaultRemoteMaxConcurrentPushes
	}
	r.in = newInbound(n)
	var err error
	if r.metrics, err = newRemoteMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if ext := sys.Extensions.Get((&remote.Remote{}).ExtensionID()); ext != nil {
		return nil, ErrRemoteRunning
	}
	return r, nil
}

// startPhases are the steps of StartRemote, in order; the closers they
// push unwind in reverse: the sync actor first, then the endpoint
// subscription, the gRPC server (after its handlers drained) last.
func (r *Remote) startPhases() []phase {
	return []phase{
		{"listen", r.checkPort},
		{"start", r.startServer},
		{"subscribe", r.watchEndpoints},
		{"spawn", r.spawnSyncActor},
	}
}

// checkPort fails with ErrRemoteListen when the configured port is taken:
// protoactor's Start panics on it.
func (r *Remote) checkPort() error {
	if r.cfg.Port == 0 {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(r.cfg.Host, strconv.Itoa(r.cfg.Port)))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRemoteListen, err)
	}
	if err := l.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrRemoteListen, err)
	}
	return nil
}

// remoteConfig is protoactor's configuration of this transport: gRPC's
// limits and windows, the stream guard, the credentials.
func (r *Remote) remoteConfig() *remote.Config {
	maxMsg := r.cfg.MaxMessageBytes
	if maxMsg == 0 {
		maxMsg = DefaultRemoteMaxMessageBytes
	}
	serverOpts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMsg),
		// A 1000-event push is ~256 KiB: with gRPC's default 64 KiB
		// window each push waits on flow-control round trips.
		grpc.InitialWindowSize(remoteWindowBytes),
		grpc.InitialConnWindowSize(remoteWindowBytes),
		// Each received message is read into a buffer that protobuf then
		// copies out of (message_data, then the envelope's CBOR), so the
		// buffer is garbage at once: a catching-up joiner allocated its
		// whole inbound stream a second time (~1 KiB per 5 pushed events),
		// which the collector then had to keep up with. Pooled, the buffer
		// is reused by the next message; nothing decoded aliases it
		// (TestRemoteReceiveBuffersAreNotAliased).
		experimental.RecvBufferPool(grpc.NewSharedBufferPool()),
		grpc.ChainStreamInterceptor(r.guardStream),
		grpc.ChainUnaryInterceptor(rejectUnary),
	}
	var dialCreds credentials.TransportCredentials
	if r.cfg.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(r.cfg.TLS.Clone())))
		dialCreds = credentials.NewTLS(r.cfg.ClientTLS.Clone())
	} else {
		dialCreds = insecure.NewCredentials()
	}
	opts := []remote.ConfigOption{
		remote.WithServerOptions(serverOpts...),
		remote.WithDialOptions(grpc.WithTransportCredentials(dialCreds)),
	}
	if r.cfg.AdvertisedAddress != "" {
		opts = append(opts, remote.WithAdvertisedHost(r.cfg.AdvertisedAddress))
	}
	rc := remote.Configure(r.cfg.Host, r.cfg.Port, opts...)
	// One connection attempt per endpoint writer: a failed attempt sleeps
	// 2 s inside protoactor and then answers the queued requests with dead
	// letters (ErrUnreachable here); the next push dials again. The default
	// (5 attempts) blocks every push to that peer for 10 s.
	rc.MaxRetryCount = 1
	return rc
}

// startServer registers protoactor's remote on the system and starts its
// gRPC server.
func (r *Remote) startServer() error {
	r.rem = remote.NewRemote(r.sys, r.remoteConfig())
	// Before Start: the stream guard reads it from gRPC's goroutines. Its
	// closer only matters when Start fails; stopServer cancels it first.
	r.baseCtx, r.cancel = context.WithCancel(context.Background())
	r.closers.pushFunc(r.cancel)
	if err := panics.Call(r.rem.Start); err != nil {
		return fmt.Errorf("%w: %w", ErrRemoteListen, err)
	}
	r.closers.pushFunc(r.stopServer)
	return nil
}

// stopServer ends the handlers (their context cancelled: a stream guard
// waiting on a full pool returns, so gRPC's graceful stop does not wait
// on it), then stops protoactor's remote.
func (r *Remote) stopServer() {
	r.cancel()
	r.inflight.Wait()
	// protoactor's Shutdown (pinned version) sets its endpoint manager's
	// connections to nil without synchronization, while that manager's
	// handler for EndpointTerminatedEvent (published when a peer
	// disconnects) reads it. Taking evMu orders Shutdown after every
	// such handler that already ran: ours runs after it in the same
	// Publish. A peer disconnecting during Shutdown itself remains
	// protoactor's race.
	r.evMu.Lock()
	//lint:ignore SA2001 an ordering point (above), not a critical section
	r.evMu.Unlock()
	// Likewise its reader's suspended flag, written by Shutdown and read
	// after every message a stream receives (remote_readergate.go).
	if !r.readers.close(readerGateTimeout) {
		r.log.Warn("remote: a stream still held a message when the server stopped")
	}
	r.rem.Shutdown(true)
}

// watchEndpoints subscribes the ordering point stopServer waits on to
// protoactor's endpoint events. Subscribed after Start, so after
// protoactor's endpoint manager: in each Publish this handler runs after
// the manager's.
func (r *Remote) watchEndpoints() error {
	r.evSub = r.sys.EventStream.SubscribeWithPredicate(func(any) {
		r.evMu.Lock()
		defer r.evMu.Unlock()
	}, func(m any) bool {
		switch m.(type) {
		case *remote.EndpointTerminatedEvent, *remote.EndpointConnectedEvent:
			return true
		}
		return false
	})
	r.closers.pushFunc(func() { r.sys.EventStream.Unsubscribe(r.evSub) })
	return nil
}

// spawnSyncActor spawns the actor that receives pushes (SyncActorName).
func (r *Remote) spawnSyncActor() error {
	props := actor.PropsFromProducer(func() actor.Actor { return &syncActor{r: r} })
	pid, err := r.sys.Root.SpawnNamed(props, SyncActorName)
	if err != nil {
		return fmt.Errorf("runtime: spawn %s: %w", SyncActorName, err)
	}
	r.pid = pid
	r.closers.push(func() error {
		if err := r.sys.Root.StopFuture(r.pid).Wait(); err != nil {
			return fmt.Errorf("runtime: stop %s: %w", SyncActorName, err)
		}
		return nil
	})
	return nil
}

// Address returns the host:port peers reach this node at (the advertised
// address if configured, else the listening address with the real port).
func (r *Remote) Address() string { return r.sys.Address() }

// RemovePeer forgets peer; later pushes to it fail with ErrUnreachable.
func (r *Remote) RemovePeer(peer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.peers, peer)
}

// Serve makes recv handle the pushes this node receives. Until Serve is
// called, pushes are answered with a rejection. Calling it again replaces
// the receiver for later pushes.
func (r *Remote) Serve(recv Receiver) {
	if recv == nil {
		r.recv.Store(nil)
		return
	}
	r.recv.Store(&receiverBox{r: recv})
	if a, ok := recv.(transportAttacher); ok {
		a.attachTransport(r) // a receive-only node pulls over it
	}
}

// Stats returns the transport's counters.
func (r *Remote) Stats() RemoteStats {
	waits, peak := r.in.stats()
	return RemoteStats{
		InboundHeld:          r.in.held(),
		InboundPeak:          peak,
		InboundWaits:         waits,
		PayloadBytesSent:     r.bytesSent.Load(),
		PayloadBytesReceived: r.bytesRecv.Load(),
		PushesSent:           r.pushesSent.Load(),
		PushesReceived:       r.pushesRecv.Load(),
		Undecodable:          r.undecodable.Load(),
		InboundStreams:       r.streams.Load(),
		RefusedPushes:        r.refused.Load(),
	}
}

// Push sends p to peer and waits for its result (replicate.Transport,
// SSP/1 §14.1). An unknown peer, a closed transport, a peer that cannot be
// reached and a missing answer within the request timeout (or ctx's
// deadline) are errors matching replicate.ErrUnreachable. A push the peer
// refused matches ErrPushRejected; an invalid p is rejected before
// sending with the messages error.
func (r *Remote) Push(ctx context.Context, peer string, p *messages.SyncPush) (*messages.PushResult, error) {
	env, err := wire.EnvelopeOf(&wire.Push{Push: p})
	if err != nil {
		return nil, fmt.Errorf("runtime: push to %s: %w", peer, err)
	}
	if len(env.Cbor) > messages.MaxPushBytes {
		return nil, fmt.Errorf("runtime: push to %s: %w: %d bytes, limit %d", peer, messages.ErrTooLarge, len(env.Cbor), messages.MaxPushBytes)
	}
	timeout, byCtx := r.timeout, false
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout, byCtx = time.Until(dl), true
	}
	if err := ctx.Err(); err != nil {
		return nil, ctxErr(peer, err)
	}
	if timeout <= 0 {
		return nil, ctxErr(peer, context.DeadlineExceeded)
	}

	r.mu.RLock()
	addr, ok := r.peers[peer]
	r.mu.RUnlock()
	if ok {
		// The cause of a first failure, at once (remote_probe.go).
		if err := r.reachable(ctx, addr); err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return nil, ctxErr(peer, err)
			}
			return nil, fmt.Errorf("%w: %s at %s: %w", replicate.ErrUnreachable, peer, addr, err)
		}
	}
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return nil, fmt.Errorf("%w: %w", replicate.ErrUnreachable, ErrRemoteClosed)
	}
	addr, ok = r.peers[peer]
	if !ok {
		r.mu.RUnlock()
		return nil, fmt.Errorf("%w: unknown peer %q", replicate.ErrUnreachable, peer)
	}
	f := r.sys.Root.RequestFuture(actor.NewPID(addr, SyncActorName), env, timeout)
	r.mu.RUnlock()
	r.countSent(len(env.Cbor))
	r.pushesSent.Add(1)
	r.metrics.pushes.WithLabelValues("sent").Inc()

	type answer struct {
		v   any
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := f.Result()
		done <- answer{v, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		return nil, ctxErr(peer, ctx.Err())
	}
	switch {
	case errors.Is(a.err, actor.ErrTimeout):
		if byCtx || ctx.Err() != nil {
			return nil, ctxErr(peer, context.DeadlineExceeded)
		}
		if cause := r.failed(ctx, addr); cause != nil {
			return nil, fmt.Errorf("%w: %s at %s: no answer within %v: %w", replicate.ErrUnreachable, peer, addr, timeout, cause)
		}
		return nil, fmt.Errorf("%w: %s at %s: no answer within %v", replicate.ErrUnreachable, peer, addr, timeout)
	case errors.Is(a.err, actor.ErrDeadLetter):
		if cause := r.failed(ctx, addr); cause != nil {
			return nil, fmt.Errorf("%w: %s at %s: %w", replicate.ErrUnreachable, peer, addr, cause)
		}
		return nil, fmt.Errorf("%w: %s at %s: not connected or not serving", replicate.ErrUnreachable, peer, addr)
	case a.err != nil:
		r.probes.set(addr, false)
		return nil, fmt.Errorf("%w: %s at %s: %w", replicate.ErrUnreachable, peer, addr, a.err)
	}
	r.probes.set(addr, true)
	v := a.v
	if e, ok := v.(*wire.Envelope); ok { // answered in-process, not through the remote
		v, _ = e.Deserialize()
	}
	switch m := v.(type) {
	case *wire.Result:
		r.countRecv(m.Size)
		return m.Result, nil
	case *wire.Rejected:
		r.countRecv(m.Size)
		return nil, fmt.Errorf("%w: %s: %s", ErrPushRejected, peer, m.Reason)
	case *wire.Undecodable:
		r.surface(m, "answer from "+peer)
		return nil, fmt.Errorf("%w: %s: %w", ErrBadResponse, peer, m)
	default:
		return nil, fmt.Errorf("%w: %s: unexpected %T", ErrBadResponse, peer, v)
	}
}

func ctxErr(peer string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: push to %s: %w", replicate.ErrUnreachable, peer, err)
	}
	return fmt.Errorf("runtime: push to %s: %w", peer, err)
}

// Close stops the sync actor, cancels and waits for the pushes being
// handled, and shuts protoactor's remote down (gracefully: peers are told
// to disconnect; protoactor bounds the gRPC drain at 10 s). It does not
// stop the actor system. Close is idempotent: the first call returns
// what stopping met, later calls return nil.
func (r *Remote) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		r.closeErr = r.teardown()
		r.log.Info("remote closed", "address", r.Address())
	})
	if !first {
		return nil
	}
	return r.closeErr
}

// teardown marks the transport closed (sends fail with ErrRemoteClosed)
// and unwinds what StartRemote started, last first: the sync actor, the
// endpoint subscription, the handlers and the gRPC server.
func (r *Remote) teardown() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return r.closers.unwind()
}

func (r *Remote) countSent(n int) {
	r.bytesSent.Add(uint64(n))
	r.metrics.bytes.WithLabelValues("sent").Add(float64(n))
}

func (r *Remote) countRecv(n int) {
	r.bytesRecv.Add(uint64(n))
	r.metrics.bytes.WithLabelValues("received").Add(float64(n))
}

// surface counts, logs and reports a frame that did not decode.
func (r *Remote) surface(u *wire.Undecodable, where string) {
	r.undecodable.Add(1)
	label := "unknown"
	if u.Known {
		label = u.Type
	}
	r.metrics.undecodable.WithLabelValues(label).Inc()
	r.log.Warn("undecodable frame", "from", where, "type", u.Type, "bytes", u.Size, "error", u.Err)
	if r.cfg.OnUndecodable != nil {
		r.cfg.OnUndecodable(*u)
	}
}

// syncActor receives pushes from peers. It hands each to the Receiver on
// its own goroutine (bounded by MaxConcurrentPushes) and answers the
// captured sender from there, so a slow push does not hold up the pushes
// behind it in the mailbox (answering a remote future needs only the
// sender PID, not the actor context).
type syncActor struct{ r *Remote }

// Receive implements actor.Actor.
func (a *syncActor) Receive(c actor.Context) {
	msg := c.Message()
	var pool *inPool
	if e, ok := msg.(*wire.Envelope); ok { // sent in-process, not through the remote
		msg, _ = e.Deserialize()
	} else if _, ok := msg.(remote.RootSerializable); ok && !deviceFrame(msg) {
		// Came through the stream guard, which took a token for it (not
		// for the delivery plane's frames: remote_device.go): a push or a
		// reconciliation request gives it back once answered, anything
		// else now.
		pool = a.r.in.claimed(c.Sender())
	}
	switch msg.(type) {
	case *wire.Push, *wire.ReconcileRequest:
		// Answered off the actor goroutine: the token goes back then.
	default:
		defer pool.release()
	}
	switch m := msg.(type) {
	case *wire.Push:
		a.r.pushesRecv.Add(1)
		a.r.metrics.pushes.WithLabelValues("received").Inc()
		a.r.countRecv(m.Size)
		a.r.handle(c.Sender(), m.Push, pool)
	case *wire.Undecodable:
		from := "unknown sender"
		if s := c.Sender(); s != nil {
			from = s.Address
		}
		a.r.surface(m, from)
		a.r.reply(c.Sender(), &wire.Rejected{Reason: m.Error()})
	case *wire.DeviceEnvelope:
		a.r.deliverDevice(m)
	case *wire.BundleRequest:
		a.r.answerBundle(c.Sender(), m)
	case *wire.ReconcileRequest:
		a.r.serveReconcile(c.Sender(), m, pool) // remote_reconcile.go
	case *wire.Result, *wire.Rejected, *wire.Bundle, *wire.ReconcileReply:
		a.r.log.Warn("unexpected message on the sync actor", "type", fmt.Sprintf("%T", m))
	}
}

// handle runs one push through the Receiver off the actor goroutine, at
// most MaxConcurrentPushes of one pool at once (the rest wait for a
// handler, bounded by the pool's tokens; the actor never waits, so one
// peer's pushes never hold up another's). The push's token of pool (nil:
// sent in-process, no token) is given back once it is answered.
func (r *Remote) handle(sender *actor.PID, p *messages.SyncPush, pool *inPool) {
	box := r.receiverFor(p.To)
	if box == nil {
		r.reply(sender, &wire.Rejected{Reason: "no receiver"})
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
			r.reply(sender, &wire.Rejected{Reason: "closing"})
			return
		}
		defer func() { <-sem }()
		ctx, cancel := context.WithTimeout(r.baseCtx, r.timeout)
		defer cancel()
		res, err := box.r.HandlePush(ctx, p)
		switch {
		case err != nil:
			r.reply(sender, &wire.Rejected{Reason: err.Error()})
		case res == nil:
			r.reply(sender, &wire.Rejected{Reason: "receiver returned no result"})
		default:
			r.reply(sender, &wire.Result{Result: res})
		}
	}()
}

// reply encodes m and sends it to sender (a requester's future, usually on
// another node). An answer that does not encode becomes a rejection.
func (r *Remote) reply(sender *actor.PID, m remote.RootSerializable) {
	if sender == nil {
		return
	}
	env, err := wire.EnvelopeOf(m)
	if err != nil {
		r.log.Error("answer does not encode", "type", fmt.Sprintf("%T", m), "error", err)
		if env, err = wire.EnvelopeOf(&wire.Rejected{Reason: "invalid answer: " + err.Error()}); err != nil {
			return
		}
	}
	r.countSent(len(env.Cbor))
	r.sys.Root.Send(sender, env)
}

type remoteMetrics struct {
	undecodable *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	pushes      *prometheus.CounterVec
	refused     prometheus.Counter
}

func newRemoteMetrics(reg prometheus.Registerer) (*remoteMetrics, error) {
	m := &remoteMetrics{
		undecodable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "remote", Name: "undecodable_total",
			Help: "Frames from peers that did not decode, by wire type (unknown: an unregistered name; protobuf: dropped by the stream guard).",
		}, []string{"type"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "remote", Name: "payload_bytes_total",
			Help: "CBOR payload bytes of envelopes sent and received over the remote.",
		}, []string{"direction"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "syncmesh", Subsystem: "remote", Name: "pushes_total",
			Help: "SSP/1 pushes sent and received over the remote.",
		}, []string{"direction"}),
	}
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "syncmesh", Subsystem: "remote", Name: "refused_pushes_total",
		Help: "Pushes the stream guard refused: From not the peer the TLS client certificate authenticates, or an answer address not that peer's.",
	})
	if reg == nil {
		return m, nil
	}
	if c, err := promreg.Register(reg, m.refused); err != nil {
		return nil, fmt.Errorf("runtime: remote metrics: %w", err)
	} else {
		m.refused = c
	}
	for _, c := range []**prometheus.CounterVec{&m.undecodable, &m.bytes, &m.pushes} {
		var err error
		if *c, err = promreg.Register(reg, *c); err != nil { // remotes sharing a Registerer share the counters
			return nil, fmt.Errorf("runtime: remote metrics: %w", err)
		}
	}
	return m, nil
}
