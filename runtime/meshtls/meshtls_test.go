package meshtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// handshake runs one mutual-TLS connection on loopback and returns what
// the server saw of the client, or the client's error.
func handshake(t *testing.T, server, client *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan *x509.Certificate, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- nil
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if tc.Handshake() != nil || len(tc.ConnectionState().PeerCertificates) == 0 {
			seen <- nil
			return
		}
		seen <- tc.ConnectionState().PeerCertificates[0]
		_, _ = tc.Write([]byte("ok"))
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err != nil {
		<-seen
		return nil, err
	}
	defer c.Close()
	if _, err := io.ReadAll(io.LimitReader(c, 2)); err != nil {
		return nil, err
	}
	return <-seen, nil
}

func TestMutualTLSAndBothBindings(t *testing.T) {
	ca, err := NewCA("test mesh", 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.Issue("node-a", NodeOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.Issue("node-b", NodeOptions{Hosts: []string{"127.0.0.1", "b.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := handshake(t, ServerConfig(a.TLSCertificate(), ca.Pool()), ClientConfig(b.TLSCertificate(), ca.Pool()))
	if err != nil || peer == nil {
		t.Fatalf("handshake: %v", err)
	}
	// Binding by CA + name: the URI SAN and the DNS SAN both name node-b.
	if name, err := NodeName(peer); err != nil || name != "node-b" {
		t.Fatalf("NodeName = %q, %v", name, err)
	}
	if err := peer.VerifyHostname("node-b"); err != nil {
		t.Fatalf("DNS SAN: %v", err)
	}
	if err := peer.VerifyHostname("node-a"); err == nil {
		t.Fatal("node-b's certificate verifies as node-a")
	}
	// Binding by pinned public key.
	if PublicKeyPin(peer) != PublicKeyPin(b.Cert) || PublicKeyPin(peer) == PublicKeyPin(a.Cert) {
		t.Fatal("public key pins do not tell the nodes apart")
	}
	if _, err := peer.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client auth usage: %v", err)
	}
}

func TestOtherCAIsRefused(t *testing.T) {
	ca, _ := NewCA("mesh", 0)
	other, _ := NewCA("other", 0)
	a, _ := ca.Issue("a", NodeOptions{Hosts: []string{"127.0.0.1"}})
	x, _ := other.Issue("x", NodeOptions{Hosts: []string{"127.0.0.1"}})
	// A client from another CA: the server refuses it.
	if peer, err := handshake(t, ServerConfig(a.TLSCertificate(), ca.Pool()), ClientConfig(x.TLSCertificate(), ca.Pool())); err == nil && peer != nil {
		t.Fatal("server accepted a client certificate from another CA")
	}
	// A server from another CA: the client names the cause.
	_, err := handshake(t, ServerConfig(x.TLSCertificate(), other.Pool()), ClientConfig(a.TLSCertificate(), ca.Pool()))
	var ua x509.UnknownAuthorityError
	if !errors.As(err, &ua) {
		t.Fatalf("want x509.UnknownAuthorityError, got %v", err)
	}
}

func TestInvalidNames(t *testing.T) {
	ca, _ := NewCA("mesh", 0)
	for _, name := range []string{"", "b@remote", "has space", "-lead", "trail.", strings.Repeat("a", 254), "ünï"} {
		if _, err := ca.Issue(name, NodeOptions{}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Issue(%q): %v", name, err)
		}
	}
	if _, err := NodeName(ca.Cert); !errors.Is(err, ErrNoNodeName) {
		t.Fatalf("NodeName of the CA: %v", err)
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, "mesh")
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrCreateCA(dir, "mesh")
	if err != nil || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("second LoadOrCreateCA made a new CA: %v", err)
	}
	n, err := again.Issue("n1", NodeOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Save(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.key", "n1.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, st.Mode(), err)
		}
	}
	server, client, err := LoadNodeTLS(dir, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, server, client); err != nil {
		t.Fatalf("handshake with loaded configs: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); !errors.Is(err, ErrBadPEM) {
		t.Fatalf("junk ca.pem: %v", err)
	}
}
