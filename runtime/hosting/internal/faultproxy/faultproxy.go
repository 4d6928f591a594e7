// Package faultproxy is the fault-injecting TCP proxy of runtime/hosting's
// fault harness: every connection between the processes of a test
// cluster (member to member, client to member, member to etcd) crosses
// it on loopback, so the test can cut nodes off the others and heal them.
//
// Each node is a name. A Route listens on a loopback port and forwards to
// one node's real address; the node a connection comes from is known
// either from its source address (Identify: each process dials from its
// own loopback address, 127.0.0.0/8 is all local) or fixed by the route
// (a node's own route to etcd). Isolate cuts a set of nodes from all the
// others in both directions: bytes crossing the cut are dropped (a
// blackhole, not a reset: the peers see silence, as across a real
// partition) and new connections across it are accepted and then ignored.
// Heal ends every cut and closes the connections that lost bytes (their
// streams are broken), so the peers redial.
//
// No proven Go library for this resolves from the module proxy here
// (toxiproxy's Go module is not available), and the proxy needs to know
// which node a connection comes from, so it is written here: a loop of
// reads and writes per direction.
package faultproxy

import (
	"errors"
	"net"
	"sync"
)

// Proxy forwards the routes and applies the cuts.
type Proxy struct {
	mu       sync.Mutex
	names    map[string]string // source IP → node
	isolated map[string]bool
	conns    map[*conn]bool
	lns      []net.Listener
	closed   bool
	wg       sync.WaitGroup
	// Dropped counts the chunks dropped by cuts (a test can show a cut
	// was crossed).
	dropped int
}

type conn struct {
	src, dst string
	a, b     net.Conn // b is nil while the connection is held across a cut
	tainted  bool
}

// New returns a proxy with no routes.
func New() *Proxy {
	return &Proxy{names: map[string]string{}, isolated: map[string]bool{}, conns: map[*conn]bool{}}
}

// Identify names the node whose connections come from the loopback
// address ip.
func (p *Proxy) Identify(ip, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names[ip] = node
}

// Route listens on a free loopback port and forwards every connection to
// target, the real address of the node dst. src, when not empty, names
// the node every connection of this route comes from; otherwise it is
// the node Identify named for the connection's source address (""
// unknown: never cut). It returns the address to dial instead of target.
func (p *Proxy) Route(dst, target, src string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = ln.Close()
		return "", errors.New("faultproxy: closed")
	}
	p.lns = append(p.lns, ln)
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from := src
			if from == "" {
				if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
					p.mu.Lock()
					from = p.names[ta.IP.String()]
					p.mu.Unlock()
				}
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(&conn{src: from, dst: dst, a: c}, target)
			}()
		}
	}()
	return ln.Addr().String(), nil
}

// cut reports whether traffic between a and b is cut (p.mu held).
func (p *Proxy) cut(a, b string) bool {
	return a != "" && b != "" && p.isolated[a] != p.isolated[b]
}

func (p *Proxy) serve(c *conn, target string) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = c.a.Close()
		return
	}
	p.conns[c] = true
	held := p.cut(c.src, c.dst)
	if held {
		c.tainted = true
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		_ = c.a.Close()
		if c.b != nil {
			_ = c.b.Close()
		}
	}()
	if held {
		// Across a cut: accept and ignore until Heal closes it.
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.a.Read(buf); err != nil {
				return
			}
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
		}
	}
	b, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	p.mu.Lock()
	c.b = b
	stale := p.closed || !p.conns[c]
	p.mu.Unlock()
	if stale {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pump(c, c.a, b); done <- struct{}{} }()
	go func() { p.pump(c, b, c.a); done <- struct{}{} }()
	<-done
	_ = c.a.Close()
	_ = b.Close()
	<-done
}

// pump copies from r to w, dropping what crosses a cut.
func (p *Proxy) pump(c *conn, r, w net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.cut(c.src, c.dst)
			if drop {
				c.tainted = true
				p.dropped++
			}
			p.mu.Unlock()
			if !drop {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// Isolate cuts the nodes off every node not named (they still reach each
// other), in both directions, until Heal.
func (p *Proxy) Isolate(nodes ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range nodes {
		p.isolated[n] = true
	}
}

// Heal ends every cut and closes the connections that lost bytes to one.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.isolated = map[string]bool{}
	var broken []net.Conn
	for c := range p.conns {
		if c.tainted {
			broken = append(broken, c.a)
			if c.b != nil {
				broken = append(broken, c.b)
			}
			delete(p.conns, c)
		}
	}
	p.mu.Unlock()
	for _, c := range broken {
		_ = c.Close()
	}
}

// Dropped returns how many chunks cuts dropped so far.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// Close stops every route and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	lns := p.lns
	var all []net.Conn
	for c := range p.conns {
		all = append(all, c.a)
		if c.b != nil {
			all = append(all, c.b)
		}
	}
	p.conns = map[*conn]bool{}
	p.mu.Unlock()
	for _, ln := range lns {
		_ = ln.Close()
	}
	for _, c := range all {
		_ = c.Close()
	}
	p.wg.Wait()
	return nil
}
