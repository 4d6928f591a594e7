// Package meshtls creates the certificates a syncmesh mesh runs mutual TLS
// on: one mesh certificate authority, and one certificate per node that
// the node uses both to serve and to dial (RemoteConfig.TLS and
// RemoteConfig.ClientTLS in package runtime).
//
// A node certificate names its node three ways: the subject Common Name,
// a DNS SAN, and a URI SAN of the form syncmesh://node/<name> (NodeURI).
// A peer can therefore be bound to its certificate either by pinning the
// certificate's public key (PublicKeyPin) or by the mesh CA plus the node
// name (NodeName reads it back from a verified certificate); both bindings
// work with every certificate this package issues. The certificate also
// carries the hosts (IP addresses or DNS names) peers dial it at, which TLS
// checks on the server side.
//
// Keys are ECDSA P-256. Files are PEM: ca.pem and ca.key, <name>.pem and
// <name>.key; key files are written with mode 0600.
package meshtls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Defaults.
const (
	// DefaultCAValidity is how long a CA from NewCA is valid.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// DefaultNodeValidity is how long a node certificate is valid.
	DefaultNodeValidity = 365 * 24 * time.Hour
	// URIScheme and uriHost form a node's URI SAN: syncmesh://node/<name>.
	URIScheme = "syncmesh"
	uriHost   = "node"
)

// CA is a mesh certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a mesh CA named name (its Common Name). validity ≤ 0 means
// DefaultCAValidity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Pool returns a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// CertPEM returns the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// NodeOptions tune Issue.
type NodeOptions struct {
	// Hosts are the IP addresses and DNS names peers dial the node at
	// (for example "127.0.0.1", "node-a.internal"). The node name is
	// always a DNS SAN besides them.
	Hosts []string
	// Validity ≤ 0 means DefaultNodeValidity.
	Validity time.Duration
}

// NodeCert is a node's certificate and key.
type NodeCert struct {
	Name    string
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// TLSCertificate returns the pair for tls.Config.Certificates.
func (nc *NodeCert) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{nc.Cert.Raw}, PrivateKey: nc.Key, Leaf: nc.Cert}
}

// Issue creates the certificate of node name, valid to serve and to dial
// (server and client auth), naming it in its Common Name, a DNS SAN and
// the URI SAN NodeURI(name).
func (ca *CA) Issue(name string, opts NodeOptions) (*NodeCert, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if opts.Validity <= 0 {
		opts.Validity = DefaultNodeValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(opts.Validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{name},
		URIs:        []*url.URL{NodeURI(name)},
	}
	for _, h := range opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != name {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &NodeCert{
		Name: name, Cert: cert, Key: key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
	}, nil
}

// ValidateName checks that name can be a node certificate's DNS SAN.
func ValidateName(name string) error {
	if len(name) == 0 || len(name) > 253 || strings.Trim(name, ".-") != name {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return fmt.Errorf("%w: %q (letters, digits, '-' and '.')", ErrInvalidName, name)
		}
	}
	return nil
}

// NodeURI is the URI SAN naming node name: syncmesh://node/<name>.
func NodeURI(name string) *url.URL {
	return &url.URL{Scheme: URIScheme, Host: uriHost, Path: "/" + name}
}

// NodeName returns the node name a certificate's URI SAN carries. Call it
// on a certificate TLS verified against the mesh CA (for example
// tls.ConnectionState.PeerCertificates[0]): the name is only as good as
// that verification.
func NodeName(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if u.Scheme == URIScheme && u.Host == uriHost && len(u.Path) > 1 {
			return u.Path[1:], nil
		}
	}
	return "", ErrNoNodeName
}

// PublicKeyPin is the SHA-256 of a certificate's SubjectPublicKeyInfo: a
// value to pin a peer by that survives reissuing its certificate with the
// same key.
func PublicKeyPin(cert *x509.Certificate) [32]byte {
	return sha256.Sum256(cert.RawSubjectPublicKeyInfo)
}

// ServerConfig is the serving side of mutual TLS for a node: its
// certificate, client certificates required and verified against pool.
func ServerConfig(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
}

// ClientConfig is the dialing side of mutual TLS for a node: its
// certificate as the client certificate, servers verified against pool.
func ClientConfig(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
}

// Save writes the CA to dir as ca.pem and ca.key (0600).
func (ca *CA) Save(dir string) error {
	kb, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return err
	}
	return writePair(dir, "ca", ca.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}))
}

// Save writes the node certificate to dir as <name>.pem and <name>.key (0600).
func (nc *NodeCert) Save(dir string) error { return writePair(dir, nc.Name, nc.CertPEM, nc.KeyPEM) }

// LoadCA reads ca.pem and ca.key from dir.
func LoadCA(dir string) (*CA, error) {
	cert, key, err := loadPair(dir, "ca")
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrBadPEM, filepath.Join(dir, "ca.pem"))
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadOrCreateCA loads the CA in dir, creating and saving one named name
// when dir has none.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	ca, err := LoadCA(dir)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return ca, err
	}
	if ca, err = NewCA(name, 0); err != nil {
		return nil, err
	}
	return ca, ca.Save(dir)
}

// LoadNodeTLS reads <name>.pem, <name>.key and ca.pem from dir and
// returns the node's server and client TLS configurations.
func LoadNodeTLS(dir, name string) (server, client *tls.Config, err error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
	if err != nil {
		return nil, nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("%w: no certificate in %s", ErrBadPEM, filepath.Join(dir, "ca.pem"))
	}
	return ServerConfig(pair, pool), ClientConfig(pair, pool), nil
}

func writePair(dir, base string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, base+".key"), keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, base+".pem"), certPEM, 0o644)
}

func loadPair(dir, base string) (*x509.Certificate, crypto.Signer, error) {
	cb, err := os.ReadFile(filepath.Join(dir, base+".pem"))
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(filepath.Join(dir, base+".key"))
	if err != nil {
		return nil, nil, err
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || cblk.Type != "CERTIFICATE" || kblk == nil {
		return nil, nil, fmt.Errorf("%w: %s or %s", ErrBadPEM, base+".pem", base+".key")
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, nil, err
	}
	var key any
	switch kblk.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kblk.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kblk.Bytes)
	default:
		err = fmt.Errorf("%w: key block %q", ErrBadPEM, kblk.Type)
	}
	if err != nil {
		return nil, nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%w: key is not a signer", ErrBadPEM)
	}
	return cert, signer, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
