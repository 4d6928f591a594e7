package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials addr from the loopback address src, sends a line and
// reports whether it came back within d.
func roundTrip(t *testing.T, src, addr string, d time.Duration) bool {
	t.Helper()
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	c, err := dialer.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "ping\n"
}

func TestIsolateBlackholesBothWaysAndHealReconnects(t *testing.T) {
	p := New()
	defer p.Close()
	p.Identify("127.0.0.11", "a")
	p.Identify("127.0.0.12", "b")
	toB, err := p.Route("b", echo(t), "")
	if err != nil {
		t.Fatal(err)
	}
	toEtcdFromA, err := p.Route("etcd", echo(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	if !roundTrip(t, "127.0.0.11", toB, 5*time.Second) || !roundTrip(t, "127.0.0.11", toEtcdFromA, 5*time.Second) {
		t.Fatal("no traffic before the cut")
	}
	// A connection open across the cut goes silent.
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.11")}}
	open, err := dialer.Dial("tcp", toB)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	p.Isolate("a")
	if roundTrip(t, "127.0.0.11", toB, 300*time.Millisecond) {
		t.Fatal("a reached b across the cut")
	}
	if roundTrip(t, "127.0.0.11", toEtcdFromA, 300*time.Millisecond) {
		t.Fatal("a reached etcd across the cut (route with a fixed source)")
	}
	if !roundTrip(t, "127.0.0.12", toB, 5*time.Second) {
		t.Fatal("b cut from itself")
	}
	_ = open.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := open.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(open).ReadString('\n'); err == nil {
		t.Fatal("open connection answered across the cut")
	}
	if p.Dropped() == 0 {
		t.Fatal("no chunk counted as dropped")
	}
	p.Heal()
	if !roundTrip(t, "127.0.0.11", toB, 5*time.Second) || !roundTrip(t, "127.0.0.11", toEtcdFromA, 5*time.Second) {
		t.Fatal("no traffic after heal")
	}
	// The connection that lost bytes was closed by Heal.
	_ = open.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(open).ReadString('\n'); err == nil {
		t.Fatal("the broken connection still delivers after heal")
	}
}
