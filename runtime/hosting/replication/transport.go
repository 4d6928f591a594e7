package replication

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// The replication traffic of all partitions shares one listener. A
// connection opens with mutual TLS; the dialer then names the partition
// it is for ("SMR1" | partition(2, big-endian)) and the listener hands it
// to that partition's raft transport. Both ends check the other's
// certificate: its node name (meshtls.NodeName) must be a current member
// (SetMembers), and a dialed member must be the one at that address.
// Plaintext (explicit) checks nothing.

var muxMagic = []byte("SMR1")

// ErrNotMember is returned (wrapped) for a connection whose certificate
// names no current member; it is closed.
var ErrNotMember = errors.New("replication: peer is not a current member")

const handshakeTimeout = 10 * time.Second

type mux struct {
	e  *Engine
	ln net.Listener

	mu     sync.Mutex
	layers map[int]*streamLayer
	conns  map[net.Conn]struct{}
	closed bool
	// cut is a test hook: while set, every connection is refused and the
	// open ones are closed (a network partition of this member).
	cut bool
}

func newMux(e *Engine, ln net.Listener) *mux {
	m := &mux{e: e, ln: ln, layers: map[int]*streamLayer{}, conns: map[net.Conn]struct{}{}}
	go m.acceptLoop()
	return m
}

func (m *mux) acceptLoop() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m.e.log.Warn("replication: accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go m.route(c)
	}
}

// route authenticates an accepted connection and hands it to its
// partition's stream layer.
func (m *mux) route(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if tc, ok := c.(*tls.Conn); ok {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err == nil {
			err = m.e.checkPeer(tc.ConnectionState(), "")
		}
		if err != nil {
			m.e.log.Warn("replication: refused connection", "remote", c.RemoteAddr().String(), "err", err)
			m.e.refused.Add(1)
			_ = c.Close()
			return
		}
	}
	var hdr [6]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		_ = c.Close()
		return
	}
	p := int(binary.BigEndian.Uint16(hdr[4:]))
	switch string(hdr[:4]) {
	case string(muxMagic):
	case string(fwdMagic):
		m.serveForward(c, p)
		return
	case string(probeMagic):
		m.serveProbe(c, p)
		return
	default:
		_ = c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	m.mu.Lock()
	l := m.layers[p]
	if l == nil || m.closed || m.cut {
		m.mu.Unlock()
		_ = c.Close()
		return
	}
	m.conns[c] = struct{}{}
	m.mu.Unlock()
	select {
	case l.accept <- &trackedConn{Conn: c, m: m}:
	case <-l.done:
		m.forget(c)
		_ = c.Close()
	}
}

func (m *mux) forget(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
}

// setCut partitions (true) or heals (false) this member's replication
// traffic.
func (m *mux) setCut(cut bool) {
	m.mu.Lock()
	m.cut = cut
	var open []net.Conn
	if cut {
		for c := range m.conns {
			open = append(open, c)
		}
	}
	m.mu.Unlock()
	for _, c := range open {
		_ = c.Close()
	}
}

func (m *mux) close() error {
	m.mu.Lock()
	m.closed = true
	var open []net.Conn
	for c := range m.conns {
		open = append(open, c)
	}
	m.mu.Unlock()
	for _, c := range open {
		_ = c.Close()
	}
	return m.ln.Close()
}

// layer returns partition p's stream layer.
func (m *mux) layer(p int) *streamLayer {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := &streamLayer{m: m, p: p, accept: make(chan net.Conn, 16), done: make(chan struct{})}
	m.layers[p] = l
	return l
}

func (m *mux) dropLayer(p int, l *streamLayer) {
	m.mu.Lock()
	if m.layers[p] == l {
		delete(m.layers, p)
	}
	m.mu.Unlock()
}

type trackedConn struct {
	net.Conn
	m    *mux
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.m.forget(c.Conn) })
	return c.Conn.Close()
}

// streamLayer is one partition's raft.StreamLayer over the shared mux.
type streamLayer struct {
	m      *mux
	p      int
	accept chan net.Conn
	done   chan struct{}
	once   sync.Once
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func (l *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *streamLayer) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.m.dropLayer(l.p, l)
	})
	return nil
}

func (l *streamLayer) Addr() net.Addr { return advertisedAddr(l.m.e.addr) }

// Dial connects to the member at address for this partition.
func (l *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return l.m.dial(string(address), timeout, binary.BigEndian.AppendUint16(append([]byte(nil), muxMagic...), uint16(l.p)))
}

// dial connects to the member at address and sends hdr.
func (m *mux) dial(address string, timeout time.Duration, hdr []byte) (net.Conn, error) {
	m.mu.Lock()
	cut := m.cut || m.closed
	m.mu.Unlock()
	if cut {
		return nil, fmt.Errorf("replication: dial %s: %w", address, net.ErrClosed)
	}
	member, known := m.e.memberAt(address)
	d := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if m.e.cfg.Plaintext {
		c, err = d.Dial("tcp", address)
	} else {
		if !known {
			return nil, fmt.Errorf("replication: dial %s: no member at that address: %w", address, ErrNotMember)
		}
		cfg := m.e.cfg.ClientTLS.Clone()
		cfg.ServerName = member
		var tc *tls.Conn
		tc, err = tls.DialWithDialer(d, "tcp", address, cfg)
		if err == nil {
			if err = m.e.checkPeer(tc.ConnectionState(), member); err != nil {
				_ = tc.Close()
			}
		}
		c = tc
	}
	if err != nil {
		return nil, fmt.Errorf("replication: dial %s: %w", address, err)
	}
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write(hdr); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("replication: dial %s: %w", address, err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	m.mu.Lock()
	if m.cut || m.closed {
		m.mu.Unlock()
		_ = c.Close()
		return nil, fmt.Errorf("replication: dial %s: %w", address, net.ErrClosed)
	}
	m.conns[c] = struct{}{}
	m.mu.Unlock()
	return &trackedConn{Conn: c, m: m}, nil
}

// checkPeer checks a verified TLS peer's node name: a current member, and
// want if not empty.
func (e *Engine) checkPeer(st tls.ConnectionState, want string) error {
	if len(st.PeerCertificates) == 0 {
		return fmt.Errorf("no peer certificate: %w", ErrNotMember)
	}
	name, err := meshtls.NodeName(st.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if want != "" && name != want {
		return fmt.Errorf("certificate names %q, expected %q: %w", name, want, ErrNotMember)
	}
	if !e.isMember(name) {
		return fmt.Errorf("%q: %w", name, ErrNotMember)
	}
	return nil
}

type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }

func advertisedAddr(s string) net.Addr { return tcpAddr(s) }

// Forwarded proposals. A member that does not lead a partition passes a
// reservation or its release (Engine.Reserve, Engine.Release) to the
// member that does, over the same authenticated listener: "SMP1" |
// partition(2), then the entry as len(uvarint) | bytes; the receiver
// proposes it if it leads and answers status(1) | len(uvarint) |
// message. Nothing else is accepted this way: a unit's own writes are
// proposed by the leader that serves it.
var fwdMagic = []byte("SMP1")

// forwardTimeout bounds one forwarded proposal, connection included.
const forwardTimeout = 10 * time.Second

// maxForwardEntry bounds a forwarded entry: a reservation's fields at
// their limits (the same bound for the writer and the reader).
const maxForwardEntry = 2 + 2*binary.MaxVarintLen64 + MaxUnitPathLen + MaxFileNameLen + binary.MaxVarintLen64

// maxForwardMessage bounds a forwarded proposal's answer's message.
const maxForwardMessage = 1024

// Forwarded proposals' statuses.
const (
	fwdOK byte = iota
	fwdLimit
	fwdNotLeader
	fwdUnknown
	fwdBad
	fwdFailed
)

func fwdStatus(err error) byte {
	switch {
	case err == nil:
		return fwdOK
	case errors.Is(err, ErrLimit):
		return fwdLimit
	case errors.Is(err, ErrBadEntry):
		return fwdBad
	case errors.Is(err, ErrUnknownOutcome):
		return fwdUnknown
	case errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed):
		return fwdNotLeader
	}
	return fwdFailed
}

func fwdError(status byte, msg string) error {
	var base error
	switch status {
	case fwdOK:
		return nil
	case fwdLimit:
		base = ErrLimit
	case fwdNotLeader:
		base = ErrNotLeader
	case fwdUnknown:
		base = ErrUnknownOutcome
	case fwdBad:
		base = ErrBadEntry
	default:
		return fmt.Errorf("replication: forwarded: %s", msg)
	}
	return fmt.Errorf("replication: forwarded: %s: %w", msg, base)
}

// decodeForwarded checks a forwarded entry for partition p of n.
func decodeForwarded(b []byte, p, n int) (entry, error) {
	en, err := decodeEntry(b)
	if err != nil {
		return entry{}, err
	}
	if en.kind != kindReserve && en.kind != kindRelease {
		return entry{}, badEntry("kind %d is not forwarded", en.kind)
	}
	if partitionOf(en.unit, n) != p {
		return entry{}, badEntry("unit %q is not of partition %d", en.unit, p)
	}
	return en, nil
}

// serveForward proposes one forwarded entry and answers its outcome.
func (m *mux) serveForward(c net.Conn, p int) {
	defer c.Close()
	m.mu.Lock()
	refused := m.cut || m.closed
	m.mu.Unlock()
	if refused {
		return
	}
	_ = c.SetDeadline(time.Now().Add(forwardTimeout))
	br := bufio.NewReader(io.LimitReader(c, maxForwardEntry+binary.MaxVarintLen64))
	n, err := binary.ReadUvarint(br)
	if err != nil || n > maxForwardEntry {
		return
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return
	}
	en, err := decodeForwarded(b, p, m.e.cfg.Partitions)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), forwardTimeout-time.Second)
		err = m.e.propose(ctx, en)
		cancel()
	}
	msg := "applied"
	if err != nil {
		msg = err.Error()
	}
	if len(msg) > maxForwardMessage {
		msg = msg[:maxForwardMessage]
	}
	out := binary.AppendUvarint([]byte{fwdStatus(err)}, uint64(len(msg)))
	_, _ = c.Write(append(out, msg...))
}

// forward passes en (of partition p) to member t and returns its outcome.
func (m *mux) forward(ctx context.Context, t Peer, p int, en entry) error {
	b, err := en.encode()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(forwardTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c, err := m.dial(t.Addr, time.Until(deadline), binary.BigEndian.AppendUint16(append([]byte(nil), fwdMagic...), uint16(p)))
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	_ = c.SetDeadline(deadline)
	if _, err := c.Write(append(binary.AppendUvarint(nil, uint64(len(b))), b...)); err != nil {
		return fmt.Errorf("replication: forward to %s: %w", t.Member, err)
	}
	br := bufio.NewReader(io.LimitReader(c, 1+binary.MaxVarintLen64+maxForwardMessage))
	status, err := br.ReadByte()
	if err != nil {
		// Sent, no answer: it may have been applied.
		return fmt.Errorf("replication: forward to %s: %w: %w", t.Member, ErrUnknownOutcome, err)
	}
	n, err := binary.ReadUvarint(br)
	if err != nil || n > maxForwardMessage {
		return fmt.Errorf("replication: forward to %s: bad answer: %w", t.Member, ErrUnknownOutcome)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(br, msg); err != nil {
		return fmt.Errorf("replication: forward to %s: %w: %w", t.Member, ErrUnknownOutcome, err)
	}
	return fwdError(status, t.Member+": "+string(msg))
}
