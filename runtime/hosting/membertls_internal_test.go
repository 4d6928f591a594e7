package hosting

import (
	"bytes"
	"crypto/tls"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// TestMemberTransportIsMutualTLSUnlessPlaintextIsExplicit: a member
// without TLS and without Plaintext is refused, as are TLS settings that
// are not mutual or whose two certificates name different members; a
// member's identity is its certificate's name.
func TestMemberTransportIsMutualTLSUnlessPlaintextIsExplicit(t *testing.T) {
	ca, err := meshtls.NewCA("test CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string) tls.Certificate {
		nc, err := ca.Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		return nc.TLSCertificate()
	}
	m1, m2 := issue("member1"), issue("member2")
	server, client := meshtls.ServerConfig(m1, ca.Pool()), meshtls.ClientConfig(m1, ca.Pool())
	oneWay := server.Clone()
	oneWay.ClientAuth = tls.NoClientCert
	bad := []struct {
		name string
		cfg  ClusterConfig
	}{
		{"neither TLS nor Plaintext", ClusterConfig{}},
		{"TLS and Plaintext", ClusterConfig{TLS: server, ClientTLS: client, Plaintext: true}},
		{"TLS without client certificates", ClusterConfig{TLS: oneWay, ClientTLS: client}},
		{"TLS without ClientTLS", ClusterConfig{TLS: server}},
		{"two members' certificates", ClusterConfig{TLS: server, ClientTLS: meshtls.ClientConfig(m2, ca.Pool())}},
		{"a MemberName not the certificate's", ClusterConfig{TLS: server, ClientTLS: client, MemberName: "member2"}},
	}
	for _, tc := range bad {
		if _, err := tc.cfg.memberIdentity(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", tc.name, err)
		}
	}
	if name, err := (&ClusterConfig{TLS: server, ClientTLS: client}).memberIdentity(); err != nil || name != "member1" {
		t.Fatalf("mutual TLS: %q %v, want member1", name, err)
	}
	if name, err := (&ClusterConfig{Plaintext: true, MemberName: "m"}).memberIdentity(); err != nil || name != "m" {
		t.Fatalf("plaintext: %q %v", name, err)
	}
	if _, err := NewCluster(ClusterConfig{Config: Config{Root: t.TempDir(), MeshID: []byte("m")}, Name: "c", Provider: test.NewTestProvider(test.NewInMemAgent())}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewCluster without TLS or Plaintext: %v", err)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPlaintextMemberIsLoggedAtStart: a member started with Plaintext
// says so in a warning when it starts.
func TestPlaintextMemberIsLoggedAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster member (about 3 s)")
	}
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := NewCluster(ClusterConfig{Config: Config{Root: t.TempDir(), MeshID: []byte("m"), NoSync: true, Logger: log},
		Name: "plain", Provider: test.NewTestProvider(test.NewInMemAgent()), Plaintext: true, MemberName: "plain0"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s := logs.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "WITHOUT TLS") || !strings.Contains(s, "member=plain0") {
		t.Fatalf("start logs: %s", s)
	}
}

// TestCallerIsStampedFromTheConnection: the interceptor replaces a
// request's Caller (whatever the sender wrote) with the name of the
// connection's certificate, keeps every other field, and leaves frames
// that are not hosting requests, or do not decode, unchanged.
func TestCallerIsStampedFromTheConnection(t *testing.T) {
	peer := messages.DeviceAddress{User: "carol", Device: 1}
	req := &Request{Op: OpDeliver, Peer: &peer, Envelope: []byte{1, 2}, Caller: "member0", Principal: &Principal{Tenant: "t"}}
	env, err := req.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(env.(*wire.Envelope))
	if err != nil {
		t.Fatal(err)
	}
	out := stampCaller(raw, "front")
	var got wire.Envelope
	if err := proto.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	r, err := DecodeRequest(got.Cbor)
	if err != nil {
		t.Fatal(err)
	}
	if r.Caller != "front" || r.Op != OpDeliver || *r.Peer != peer || string(r.Envelope) != "\x01\x02" || r.Principal.Tenant != "t" {
		t.Fatalf("stamped request: %+v", r)
	}
	rep, _ := (&Reply{Member: "m"}).Serialize()
	repRaw, _ := proto.Marshal(rep.(*wire.Envelope))
	for _, b := range [][]byte{repRaw, {0xff, 0x01}, nil} {
		if o := stampCaller(b, "front"); !bytes.Equal(o, b) {
			t.Fatalf("non-request frame %x changed to %x", b, o)
		}
	}
	if memberIDOf("member0@abc") != "member0" || memberIDOf("abc") != "" {
		t.Fatal("member id parsing")
	}
}
