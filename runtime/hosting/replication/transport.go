package replication

import (
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
	if _, err := io.ReadFull(c, hdr[:]); err != nil || string(hdr[:4]) != string(muxMagic) {
		_ = c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	p := int(binary.BigEndian.Uint16(hdr[4:]))
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
	m := l.m
	m.mu.Lock()
	cut := m.cut || m.closed
	m.mu.Unlock()
	if cut {
		return nil, fmt.Errorf("replication: dial %s: %w", address, net.ErrClosed)
	}
	member, known := m.e.memberAt(string(address))
	d := &net.Dialer{Timeout: timeout}
	var c net.Conn
	var err error
	if m.e.cfg.Plaintext {
		c, err = d.Dial("tcp", string(address))
	} else {
		if !known {
			return nil, fmt.Errorf("replication: dial %s: no member at that address: %w", address, ErrNotMember)
		}
		cfg := m.e.cfg.ClientTLS.Clone()
		cfg.ServerName = member
		var tc *tls.Conn
		tc, err = tls.DialWithDialer(d, "tcp", string(address), cfg)
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
	hdr := binary.BigEndian.AppendUint16(append([]byte(nil), muxMagic...), uint16(l.p))
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
