package runtime

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// Tests that need a running remote start their nodes as child processes:
// see remote_child_test.go for why.

func TestRemoteConfigValidation(t *testing.T) {
	dir := newRemoteCA(t, "ca").issue(t, t.TempDir(), "n")
	server, client, err := loadRemoteTLS(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	noClientAuth := server.Clone()
	noClientAuth.ClientAuth = tls.VerifyClientCertIfGiven
	noClientCert := client.Clone()
	noClientCert.Certificates = nil
	skip := client.Clone()
	skip.InsecureSkipVerify = true
	cases := []struct {
		name  string
		cfg   RemoteConfig
		field string
	}{
		{"neither TLS nor Plaintext", RemoteConfig{}, "RemoteConfig.TLS"},
		{"both", RemoteConfig{TLS: server, ClientTLS: client, Plaintext: true}, "RemoteConfig.Plaintext"},
		{"TLS without ClientTLS", RemoteConfig{TLS: server}, "RemoteConfig.ClientTLS"},
		{"ClientTLS without TLS", RemoteConfig{ClientTLS: client, Plaintext: true}, "RemoteConfig.ClientTLS"},
		{"client certs not required", RemoteConfig{TLS: noClientAuth, ClientTLS: client}, "RemoteConfig.TLS"},
		{"no client certificate", RemoteConfig{TLS: server, ClientTLS: noClientCert}, "RemoteConfig.ClientTLS"},
		{"skip verify", RemoteConfig{TLS: server, ClientTLS: skip}, "RemoteConfig.ClientTLS"},
		{"port", RemoteConfig{Plaintext: true, Port: 70000}, "RemoteConfig.Port"},
		{"timeout", RemoteConfig{Plaintext: true, RequestTimeout: -1}, "RemoteConfig.RequestTimeout"},
		{"advertised", RemoteConfig{Plaintext: true, AdvertisedAddress: "nohostport"}, "RemoteConfig.AdvertisedAddress"},
	}
	sys := actortest.QuietSystem()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := StartRemote(sys, c.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("got %v, want a ConfigError on %s", err, c.field)
			}
		})
	}
}

func TestRemotePortTakenIsAnErrorNotAPanic(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, err = StartRemote(actortest.QuietSystem(), RemoteConfig{Plaintext: true, Port: port})
	if !errors.Is(err, ErrRemoteListen) {
		t.Fatalf("got %v, want ErrRemoteListen", err)
	}
}

func TestRemoteGuardSanitizesBatches(t *testing.T) {
	// The guard alone, on hand-made batches (the end-to-end version is
	// TestRemoteHostileFramesKeepTheStream).
	target := actor.NewPID("127.0.0.1:1", SyncActorName)
	env, _ := wire.EnvelopeOf(&wire.Push{Push: testPush("g", 2, 4)})
	good, _ := protoMarshal(env)
	b := &remoteBatch{
		TypeNames: []string{envelopeName, "no.such.Type"},
		Targets:   []*actor.PID{target},
		Senders:   []*actor.PID{target},
		Envelopes: []*remoteEnvelope{
			{TypeId: 0, Target: 0, MessageData: good},
			{TypeId: 1, Target: 0, MessageData: good},
			{TypeId: -1, Target: 0, MessageData: good},
			{TypeId: 0, Target: 1, MessageData: good},
			{TypeId: 0, Target: 0, Sender: 2, MessageData: good},
			{TypeId: 0, Target: 0, Sender: 1, MessageData: good},
			{TypeId: 0, Target: 0, MessageData: []byte{0x0a, 0x05, 0xff}},
			{TypeId: 0, Target: 0, SerializerId: 1, MessageData: good},
		},
	}
	dropped := sanitizeBatch(b, allowedProtoTypes(nil))
	if len(b.Envelopes) != 2 || len(dropped) != 6 {
		t.Fatalf("kept %d, dropped %d", len(b.Envelopes), len(dropped))
	}
	for _, u := range dropped {
		if u.Type != guardLabel || !errors.Is(u, errGuard) {
			t.Fatalf("dropped frame %+v", u)
		}
	}
	if b.Envelopes[1].Sender != 1 {
		t.Fatal("the wrong envelopes were kept")
	}
	// Extra allowed types pass when linked in.
	b = &remoteBatch{TypeNames: []string{"actor.Stop"}, Targets: []*actor.PID{target}, Envelopes: []*remoteEnvelope{{}}}
	if d := sanitizeBatch(b, allowedProtoTypes(nil)); len(d) != 1 {
		t.Fatal("actor.Stop accepted by default")
	}
	b = &remoteBatch{TypeNames: []string{"actor.Stop"}, Targets: []*actor.PID{target}, Envelopes: []*remoteEnvelope{{}}}
	if d := sanitizeBatch(b, allowedProtoTypes([]string{"actor.Stop"})); len(d) != 0 {
		t.Fatalf("allowed type dropped: %v", d[0])
	}
}

// FuzzRemoteGuard: whatever a peer sends, the guard leaves a batch whose
// every envelope protoactor's endpoint reader can index and deserialize.
func FuzzRemoteGuard(f *testing.F) {
	env, _ := wire.EnvelopeOf(&wire.Push{Push: testPush("g", 2, 4)})
	good, _ := protoMarshal(env)
	seed := &remoteBatch{
		TypeNames: []string{envelopeName, "actor.Terminated"},
		Targets:   []*actor.PID{actor.NewPID("a:1", "x")},
		Senders:   []*actor.PID{actor.NewPID("b:1", "y")},
		Envelopes: []*remoteEnvelope{{TypeId: 0, MessageData: good, Sender: 1}, {TypeId: 1}},
	}
	raw, _ := protoMarshal(seed)
	f.Add(raw)
	f.Add([]byte{})
	f.Add(raw[:len(raw)/2])
	allowed := allowedProtoTypes(nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		var b remoteBatch
		if err := protoUnmarshal(data, &b); err != nil {
			return
		}
		sanitizeBatch(&b, allowed)
		for _, e := range b.Envelopes {
			if e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames) || e.Target < 0 || int(e.Target) >= len(b.Targets) ||
				e.Sender < 0 || int(e.Sender) > len(b.Senders) || e.SerializerId != 0 {
				t.Fatalf("kept an envelope the reader cannot index: %+v", e)
			}
			if b.TypeNames[e.TypeId] == envelopeName {
				var w wire.Envelope
				if err := protoUnmarshal(e.MessageData, &w); err != nil {
					t.Fatalf("kept an envelope that does not unmarshal: %v", err)
				}
				if _, err := w.Deserialize(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

func TestRemotePushRoundTripAcrossProcesses(t *testing.T) {
	a := startRemoteChild(t, "a", remoteChildSpec{Plaintext: true, RequestTimeout: 5 * time.Second})
	b := startRemoteChild(t, "b", remoteChildSpec{Plaintext: true, RequestTimeout: 5 * time.Second})
	for _, dir := range []struct{ from, to *remoteChild }{{b, a}, {a, b}} {
		rep := dir.from.call(remoteCmd{Op: "push", Peer: dir.to.addr, Events: 5, EventBytes: 250})
		if !rep.OK {
			t.Fatalf("%s → %s: %s", dir.from.name, dir.to.name, rep.Err)
		}
		r := rep.Result
		if r == nil || r.Applied != 4 || len(r.Retry) != 1 || r.Retry[0] != 2 || len(r.Watermarks) != 1 || r.Watermarks[0].HLC != 1234 || r.Watermarks[0].Group.Table != "notes" {
			t.Fatalf("%s → %s: result %+v", dir.from.name, dir.to.name, r)
		}
		if rep.Stats.PushesSent != 1 || rep.Stats.PayloadBytesSent < 5*250 || rep.Stats.PayloadBytesReceived == 0 {
			t.Fatalf("sender stats %+v", rep.Stats)
		}
		if p := waitForLen(t, dir.to.pushes, 1); len(p) != 1 || p[0]["Events"] != float64(5) {
			t.Fatalf("%s received %v", dir.to.name, p)
		}
	}
	// A push being handled does not hold up the pushes behind it: the
	// receiver blocks the first push until it has handled the second.
	if rep := b.call(remoteCmd{Op: "pushasync", Peer: a.addr, Type: "block", Events: 1, EventBytes: 8}); !rep.OK {
		t.Fatal(rep.Err)
	}
	if n := len(waitForLen(t, a.blocked, 1)); n != 1 {
		t.Fatal("the blocking push never reached the receiver")
	}
	if rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Type: "unblock", Events: 1, EventBytes: 8}); !rep.OK {
		t.Fatalf("push behind a blocked one: %+v", rep)
	}
	if rep := b.call(remoteCmd{Op: "await"}); !rep.OK {
		t.Fatalf("the blocked push: %+v", rep)
	}
	// A push to the node's own address is delivered in-process (the
	// envelope is not serialized) and answered the same way.
	if rep := b.call(remoteCmd{Op: "push", Peer: b.addr, Events: 4, EventBytes: 8}); !rep.OK || rep.Result.Applied != 3 {
		t.Fatalf("push to self: %+v", rep)
	}
	// A receiver error comes back as a rejection.
	rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Events: 1, EventBytes: 10, Type: "fail-me"})
	if rep.OK || !rep.Rejected || rep.Unreachable || !strings.Contains(rep.Err, "failed on purpose") {
		t.Fatalf("failing receiver: %+v", rep)
	}
	st := a.call(remoteCmd{Op: "stats"}).Stats
	if st.PushesReceived != 4 || st.InboundStreams != 1 || st.Undecodable != 0 {
		t.Fatalf("receiver stats %+v", st)
	}
}

// TestRemoteReceiveBuffersAreNotAliased: the receiving side reads
// messages into pooled buffers; a push a receiver keeps must keep its
// bytes while later pushes of other sizes (other layouts in the reused
// buffers) arrive on the same stream.
func TestRemoteReceiveBuffersAreNotAliased(t *testing.T) {
	a := startRemoteChild(t, "a", remoteChildSpec{Plaintext: true, RequestTimeout: 10 * time.Second})
	b := startRemoteChild(t, "b", remoteChildSpec{Plaintext: true, RequestTimeout: 10 * time.Second})
	// Kept pushes of several sizes, each followed by pushes laid out
	// differently; every push checks every kept one before it is answered.
	for i, size := range []int{250, 997, 4093} {
		if rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Type: "keep", Events: 40 + i, EventBytes: size}); !rep.OK {
			t.Fatalf("kept push %d: %+v", i, rep)
		}
		for j, other := range []struct{ events, size int }{{7, 3001}, {300, 61}, {2, 70001}, {1000, 250}} {
			if rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Type: "other", Events: other.events, EventBytes: other.size}); !rep.OK {
				t.Fatalf("push %d after kept push %d: %+v", j, i, rep)
			}
		}
	}
	if st := a.call(remoteCmd{Op: "stats"}).Stats; st.PushesReceived != 15 {
		t.Fatalf("receiver stats %+v", st)
	}
}

func TestRemoteHostileFramesKeepTheStream(t *testing.T) {
	// Nothing here is about time: a generous bound, because the oversize
	// push (64 MiB) alone takes seconds of CPU under -race, and a loaded
	// machine stretched it past a 30 s request timeout, once past 90 s
	// (awaitChild waits longer for a child's answer).
	a := startRemoteChild(t, "a", remoteChildSpec{Plaintext: true, RequestTimeout: 4 * time.Minute})
	b := startRemoteChild(t, "b", remoteChildSpec{Plaintext: true, RequestTimeout: 4 * time.Minute})
	valid := func(step string) {
		t.Helper()
		rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Events: 3, EventBytes: 20})
		if !rep.OK || rep.Result.Applied != 2 {
			t.Fatalf("valid push after %s: %+v", step, rep)
		}
	}
	valid("nothing")

	invalid := testPush("b", 3, 4)
	invalid.V = 2
	invalidRaw, _ := messages.Marshal(invalid)
	tooMany := testPush("b", messages.MaxPushEvents+1, 1)
	tooManyRaw, _ := messages.Marshal(tooMany)
	hostile := []struct {
		name  string
		cmd   remoteCmd
		known bool
		err   string
	}{
		{"unknown type", remoteCmd{Type: "no.such.type", CBOR: []byte{0xa0}}, false, "unknown type"},
		{"garbage cbor", remoteCmd{Type: wire.TypeSyncPush, CBOR: []byte{0xff, 0xfe, 0x00}}, true, "decode sync push"},
		{"invalid push", remoteCmd{Type: wire.TypeSyncPush, CBOR: invalidRaw}, true, "unsupported version"},
		{"too many events", remoteCmd{Type: wire.TypeSyncPush, CBOR: tooManyRaw}, true, "4096"},
		{"oversize push", remoteCmd{Type: wire.TypeSyncPush, Zeros: messages.MaxPushBytes + 1}, true, "too large"},
	}
	for i, h := range hostile {
		h.cmd.Op, h.cmd.Peer = "raw", a.addr
		rep := b.call(h.cmd)
		if rep.OK || !rep.Rejected {
			t.Fatalf("%s: answered %+v, want a rejection", h.name, rep)
		}
		u := waitForLen(t, a.undecodables, i+1)
		if len(u) != i+1 {
			t.Fatalf("%s: %d undecodables surfaced, want %d", h.name, len(u), i+1)
		}
		last := u[i]
		if last.Type != h.cmd.Type || last.Known != h.known || !strings.Contains(last.Err, h.err) {
			t.Fatalf("%s: surfaced %+v", h.name, last)
		}
		valid(h.name)
	}
	// The same connection throughout: one stream into a, one connection
	// from b, never torn down.
	if st := a.call(remoteCmd{Op: "stats"}); st.Stats.InboundStreams != 1 || st.Stats.Undecodable != uint64(len(hostile)) {
		t.Fatalf("receiver: %+v", st.Stats)
	}
	if st := b.call(remoteCmd{Op: "stats"}); st.Connected != 1 || st.Terminated != 0 {
		t.Fatalf("sender connected %d times, terminated %d", st.Connected, st.Terminated)
	}
	if n := len(waitForLen(t, a.pushes, len(hostile)+1)); n != len(hostile)+1 {
		t.Fatalf("receiver handled %d pushes, want %d", n, len(hostile)+1)
	}

	// Below our envelope: batches protoactor's reader would crash or end
	// the stream on, then a valid push on the same raw stream.
	before := len(a.undecodables())
	rep := b.call(remoteCmd{Op: "guard", Peer: a.addr})
	if !rep.OK || rep.Result == nil || rep.Result.Applied != 2 {
		t.Fatalf("guard probe: %+v", rep)
	}
	u := waitForLen(t, a.undecodables, before+len(rep.Guard))[before:]
	if len(u) != len(rep.Guard) {
		t.Fatalf("%d guard drops surfaced for %d hostile batches: %+v", len(u), len(rep.Guard), u)
	}
	for _, x := range u {
		if x.Type != guardLabel || x.Known {
			t.Fatalf("guard drop surfaced as %+v", x)
		}
	}
	if st := a.call(remoteCmd{Op: "stats"}); st.Stats.InboundStreams != 2 {
		t.Fatalf("receiver streams %d, want 2 (b's and the probe's)", st.Stats.InboundStreams)
	}
	valid("the guard probe")
}

func TestRemoteMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	a := startRemoteChild(t, "a", remoteChildSpec{CertDir: ca.issue(t, dir, "a"), RequestTimeout: 3 * time.Second})
	b := startRemoteChild(t, "b", remoteChildSpec{CertDir: ca.issue(t, dir, "b"), RequestTimeout: 3 * time.Second})
	if rep := a.call(remoteCmd{Op: "addpeer", Name: "b", Peer: b.addr}); !rep.OK {
		t.Fatal(rep.Err)
	}
	rep := b.call(remoteCmd{Op: "push", Peer: a.addr, Type: "b", Events: 3, EventBytes: 50})
	if !rep.OK || rep.Result.Applied != 2 {
		t.Fatalf("push over mutual TLS: %+v", rep)
	}

	// A node whose certificate comes from another CA (and that trusts only
	// the mesh CA, so it can dial a) is refused by a.
	other := newRemoteCA(t, "other-ca")
	cDir := other.issue(t, dir, "c")
	c := startRemoteChild(t, "c", remoteChildSpec{CertDir: cDir, TrustDir: filepath.Join(dir, "a"), RequestTimeout: 2 * time.Second})
	rep = c.call(remoteCmd{Op: "push", Peer: a.addr, Events: 1, EventBytes: 10})
	if rep.OK || !rep.Unreachable {
		t.Fatalf("push with a foreign certificate: %+v", rep)
	}
	if n := len(waitForLen(t, a.pushes, 1)); n != 1 {
		t.Fatalf("a handled %d pushes, want only b's", n)
	}

	// A client without a certificate: the handshake fails (TLS 1.3 reports
	// the server's refusal on the first read).
	caPEM, err := os.ReadFile(filepath.Join(dir, "a", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", a.addr, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		if err == nil {
			_, err = conn.Read(make([]byte, 64))
		}
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without a certificate got %v, want a certificate error", err)
	}
	// The mesh still works after the refusals.
	rep = b.call(remoteCmd{Op: "push", Peer: a.addr, Type: "b", Events: 2, EventBytes: 50})
	if !rep.OK {
		t.Fatalf("push after refusals: %+v", rep)
	}
}

// TestAttackRemoteCertificateForMCannotPushAsV: over the real remote with
// mutual TLS, m holds a valid mesh certificate (for m) and pushes under
// v's name. r binds each configured peer to its certificate: the push is
// refused with a typed rejection answered to m (never to an address the
// pusher chose), counted, and never reaches r's receiver; v's own pushes
// and m's honest ones still go through.
func TestAttackRemoteCertificateForMCannotPushAsV(t *testing.T) {
	dir := t.TempDir()
	ca := newRemoteCA(t, "mesh-ca")
	r := startRemoteChild(t, "r", remoteChildSpec{CertDir: ca.issue(t, dir, "r"), RequestTimeout: 3 * time.Second})
	v := startRemoteChild(t, "v", remoteChildSpec{CertDir: ca.issue(t, dir, "v"), RequestTimeout: 3 * time.Second})
	m := startRemoteChild(t, "m", remoteChildSpec{CertDir: ca.issue(t, dir, "m"), RequestTimeout: 3 * time.Second})
	for _, p := range []*remoteChild{v, m} {
		if rep := r.call(remoteCmd{Op: "addpeer", Name: p.name, Peer: p.addr}); !rep.OK {
			t.Fatal(rep.Err)
		}
	}
	rep := m.call(remoteCmd{Op: "push", Peer: r.addr, Name: "r", Type: "v", Events: 2, EventBytes: 20})
	if rep.OK || !rep.Rejected || !strings.Contains(rep.Err, "authenticated peer") {
		t.Fatalf("m pushing as v over m's certificate: %+v", rep)
	}
	if rep := v.call(remoteCmd{Op: "push", Peer: r.addr, Name: "r", Type: "v", Events: 2, EventBytes: 20}); !rep.OK {
		t.Fatalf("v's own push: %+v", rep)
	}
	if rep := m.call(remoteCmd{Op: "push", Peer: r.addr, Name: "r", Type: "m", Events: 1, EventBytes: 20}); !rep.OK {
		t.Fatalf("m's honest push: %+v", rep)
	}
	got := waitForLen(t, r.pushes, 2)
	fromV := 0
	for _, p := range got {
		if p["From"] == "v" {
			fromV++
		}
	}
	if len(got) != 2 || fromV != 1 {
		t.Fatalf("r's receiver saw %v; want v's push once and m's once", got)
	}
	if st := r.call(remoteCmd{Op: "stats"}).Stats; st.RefusedPushes != 1 {
		t.Fatalf("r counted %d refused pushes, want 1", st.RefusedPushes)
	}
}

func TestRemoteUnreachablePeer(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	b := startRemoteChild(t, "b", remoteChildSpec{Plaintext: true, RequestTimeout: timeout})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	rep := b.call(remoteCmd{Op: "push", Peer: closed, Events: 1, EventBytes: 10})
	if rep.OK || !rep.Unreachable {
		t.Fatalf("push to a closed port: %+v", rep)
	}
	// A refused connection is named as such, at once (remote_probe.go).
	if !strings.Contains(rep.Err, "connection refused") {
		t.Fatalf("push to a closed port: %q does not name the cause", rep.Err)
	}
	// Generous slack: the bound is the request timeout, not a benchmark.
	if rep.Elapsed > timeout+3*time.Second {
		t.Fatalf("push to a closed port took %v, timeout %v", rep.Elapsed, timeout)
	}
	rep = b.call(remoteCmd{Op: "push", Name: "stranger", NoAddPeer: true, Events: 1, EventBytes: 10})
	if rep.OK || !rep.Unreachable || !strings.Contains(rep.Err, "unknown peer") {
		t.Fatalf("push to an unknown peer: %+v", rep)
	}
	// A context deadline shorter than the request timeout wins: a
	// listener that accepts and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	defer func() {
		silent.Close()
		for len(held) > 0 {
			(<-held).Close()
		}
	}()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			select {
			case held <- c:
			default:
				c.Close()
			}
		}
	}()
	rep = b.call(remoteCmd{Op: "push", Peer: silent.Addr().String(), Events: 1, EventBytes: 10, CtxTimeout: 200 * time.Millisecond})
	if rep.OK || !rep.Unreachable || !strings.Contains(rep.Err, "deadline") {
		t.Fatalf("push with a short context: %+v", rep)
	}
	// A peer that answers too slowly is unreachable too.
	slow := startRemoteChild(t, "slow", remoteChildSpec{Plaintext: true, RequestTimeout: timeout, HandleDelay: 3 * timeout})
	rep = b.call(remoteCmd{Op: "push", Peer: slow.addr, Events: 1, EventBytes: 10})
	if rep.OK || !rep.Unreachable {
		t.Fatalf("push to a slow peer: %+v", rep)
	}
}

// BenchmarkRemotePush: pushes of 1000 events of ~250 bytes between two
// node processes over loopback (plaintext gRPC), one push in flight and
// four; and single-event pushes, for the round-trip overhead.
func BenchmarkRemotePush(b *testing.B) {
	for _, bc := range []struct{ events, inflight int }{{1000, 1}, {1000, 4}, {1, 1}} {
		b.Run("events="+strconv.Itoa(bc.events)+"/inflight="+strconv.Itoa(bc.inflight), func(b *testing.B) {
			recv := startRemoteChild(b, "recv", remoteChildSpec{Plaintext: true, RequestTimeout: 30 * time.Second})
			send := startRemoteChild(b, "send", remoteChildSpec{Plaintext: true, RequestTimeout: 30 * time.Second})
			if rep := send.call(remoteCmd{Op: "bench", Peer: recv.addr, N: 2, Parallel: 1, Events: bc.events, EventBytes: 250}); !rep.OK {
				b.Fatal(rep.Err)
			}
			b.ResetTimer()
			rep := send.call(remoteCmd{Op: "bench", Peer: recv.addr, N: b.N, Parallel: bc.inflight, Events: bc.events, EventBytes: 250})
			b.StopTimer()
			if !rep.OK {
				b.Fatal(rep.Err)
			}
			sec := rep.Elapsed.Seconds()
			b.ReportMetric(float64(b.N)/sec, "pushes/s")
			b.ReportMetric(float64(b.N*bc.events)/sec, "events/s")
			b.ReportMetric(float64(rep.Bytes)/float64(b.N*bc.events), "payload-B/event")
		})
	}
}

// waitForLen polls get until it returns at least n items (a child's
// report lines and its peer's answer travel through different pipes) or
// 10 s pass, and returns the last value.
func waitForLen[T any](t testing.TB, get func() []T, n int) []T {
	t.Helper()
	// Generous: it costs only when the condition never holds, and a
	// child's report can lag on a loaded machine.
	deadline := time.Now().Add(time.Minute)
	for {
		v := get()
		if len(v) >= n || time.Now().After(deadline) {
			return v
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type (
	remoteBatch    = remote.MessageBatch
	remoteEnvelope = remote.MessageEnvelope
)

func protoUnmarshal(b []byte, m proto.Message) error { return proto.Unmarshal(b, m) }
