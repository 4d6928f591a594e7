package runtime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Why a probe: protoactor's endpoint writer dials a peer on its own
// goroutine and, when the dial or the TLS handshake fails, only logs the
// cause; the push waits out its request timeout or comes back as a dead
// letter, "not connected or not serving". A user sees neither the cause
// (a wrong CA, a refused connection, a bad address) nor anything at all
// for the first timeout. So before the first push to an address not yet
// known to answer, and after a push to it failed, the transport dials it
// the way gRPC does — TCP, the TLS handshake with ClientTLS (ALPN h2),
// the HTTP/2 preface — and returns what failed. The first failed push
// then names the cause at once (PeerStatus.LastErr, CycleReport.Err).

// h2Preface is the HTTP/2 client connection preface and an empty SETTINGS
// frame: a gRPC server answers with its own SETTINGS frame (9 bytes of
// header at least); a TLS 1.3 server that refused our client certificate
// answers with an alert, which surfaces on that read.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// probeState remembers which addresses answered a push since the last
// failure, so a healthy peer is probed once, not per push.
type probeState struct {
	mu sync.Mutex
	ok map[string]bool
}

func (p *probeState) known(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok[addr]
}

func (p *probeState) set(addr string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ok == nil {
		p.ok = map[string]bool{}
	}
	if ok {
		p.ok[addr] = true
	} else {
		delete(p.ok, addr)
	}
}

// probe dials addr as the gRPC transport would and returns why it cannot
// be reached; nil when it answered the HTTP/2 preface. It waits at most
// timeout (or until ctx ends).
func (r *Remote) probe(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var c net.Conn = conn
	if r.cfg.ClientTLS != nil {
		cfg := r.cfg.ClientTLS.Clone()
		cfg.NextProtos = []string{"h2"}
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host // as gRPC does: the target's host
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("tls handshake: %w", err)
		}
		c = tc
	}
	if _, err := c.Write(h2Preface); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("no HTTP/2 answer within %v", timeout)
		}
		return err
	}
	return nil
}

// reachable probes addr unless it answered a push since its last
// failure. The error, if any, is the cause to report (wrapped by Push).
func (r *Remote) reachable(ctx context.Context, addr string) error {
	if r.probes.known(addr) {
		return nil
	}
	err := r.probe(ctx, addr, r.timeout)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The connection's deadline may fire a moment before ctx's timer.
	if dl, ok := ctx.Deadline(); ok && !time.Now().Add(time.Millisecond).Before(dl) {
		return context.DeadlineExceeded
	}
	return err
}

// failed forgets that addr answered and returns the cause a probe finds
// now (nil when the probe gets through: the failure was elsewhere, for
// example the peer's answer could not reach us).
func (r *Remote) failed(ctx context.Context, addr string) error {
	r.probes.set(addr, false)
	if ctx.Err() != nil {
		return nil
	}
	return r.probe(ctx, addr, min(r.timeout, 5*time.Second))
}
