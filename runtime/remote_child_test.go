package runtime

// Multi-node remote tests run every node in a child process re-executed
// from this test binary (TestRemoteChild below), one protoactor remote per
// process. Reason, measured: protoactor's remote.Start (pinned version,
// remote/server.go:61) calls grpclog.SetLoggerV2, a write to gRPC's global
// logger that races with the gRPC goroutines of any remote already running
// in the process (google.golang.org/grpc/internal/grpclog reads it without
// synchronization). That race is protoactor's, not ours, and it cannot be
// avoided from outside Start; running each node in its own process also
// makes these tests what they claim to be: nodes in separate processes
// on 127.0.0.1 syncing through the remote. A race in our code inside a
// child still fails the test: the child exits non-zero and the parent
// reports its stderr.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
)

const remoteChildEnv = "SYNCMESH_REMOTE_CHILD"

// remoteChildSpec configures a child node.
type remoteChildSpec struct {
	Plaintext      bool
	CertDir        string // written by remoteCA.issue
	TrustDir       string // CA to verify peers against; empty: CertDir's
	RequestTimeout time.Duration
	HandleDelay    time.Duration // the fake receiver sleeps this long
	// MaxConcurrentPushes is RemoteConfig.MaxConcurrentPushes.
	MaxConcurrentPushes int
}

// remoteCmd is one command to a child; remoteReply its answer.
type remoteCmd struct {
	Op         string // push, raw, guard, stats, bench, addpeer
	Peer       string // address
	Name       string // peer name for push ("" = Peer)
	NoAddPeer  bool
	Events     int
	EventBytes int
	CtxTimeout time.Duration
	Type       string                 // raw envelope type
	CBOR       []byte                 // raw envelope payload
	Zeros      int                    // raw envelope payload of this many zero bytes instead
	N          int                    // bench pushes
	Parallel   int                    // bench pushes in flight
	Device     messages.DeviceAddress // bundles: the device asked
}

type remoteReply struct {
	OK          bool
	Err         string
	Unreachable bool
	Rejected    bool
	BadResponse bool
	Result      *messages.PushResult
	Elapsed     time.Duration
	Stats       RemoteStats
	Connected   int // EndpointConnectedEvents seen by this node
	Terminated  int // EndpointTerminatedEvents seen by this node
	Guard       []string
	Bytes       uint64
	Bundles     int // bundles: requests answered with a bundle
	Refusals    int // bundles: requests answered with a rejection or not at all
}

// remoteChildUndecodable is what a child reports from OnUndecodable.
type remoteChildUndecodable struct {
	Type  string
	Known bool
	Size  int
	Err   string
}

// TestRemoteChild is not a test: it is the body of a child node process,
// run only when the parent sets SYNCMESH_REMOTE_CHILD.
func TestRemoteChild(t *testing.T) {
	runAsChild(t, remoteChildEnv, "helper process for the remote tests", runRemoteChild)
}

// runAsChild is the body of a test that is a child process's main: it
// skips unless the parent set env to the child's JSON spec, and otherwise
// runs body on stdin/stdout and exits (3 on an error).
func runAsChild(t *testing.T, env, why string, body func(spec string, in io.Reader, out io.Writer) error) {
	raw := os.Getenv(env)
	if raw == "" {
		t.Skip(why)
	}
	if err := body(raw, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

// fakeReceiver answers every push with a result derived from it: applied
// = events, retry = the sequences whose raw bytes start with 0xEE, and one
// watermark per claim.
//
// A push from "block" waits (up to 10 s, then fails) until a push from
// "unblock" has been handled: if pushes were handled one at a time on the
// sync actor's goroutine, the unblocking push would wait behind it.
//
// A push from "stall" waits, without a time limit, until the "release"
// command.
type fakeReceiver struct {
	delay     time.Duration
	out       func(kind string, v any)
	unblock   chan struct{}
	unblockMu sync.Once
	release   chan struct{}
	releaseMu sync.Once
	// kept are the pushes from "keep", held as decoded: every later push
	// first checks that their events still hold testPush's bytes.
	keptMu sync.Mutex
	kept   []*messages.SyncPush
}

// checkKept reports the first kept push whose events no longer hold the
// bytes testPush gave them (a decoded push aliasing a reused buffer).
func (f *fakeReceiver) checkKept() error {
	f.keptMu.Lock()
	defer f.keptMu.Unlock()
	for k, p := range f.kept {
		want := testPush(p.From, len(p.Events), len(p.Events[0].Raw))
		for i, e := range p.Events {
			if !bytes.Equal(e.Raw, want.Events[i].Raw) {
				return fmt.Errorf("kept push %d: event %d changed after later pushes", k, i)
			}
		}
	}
	return nil
}

func (f *fakeReceiver) HandlePush(ctx context.Context, p *messages.SyncPush) (*messages.PushResult, error) {
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch p.From {
	case "block":
		f.out("BLOCKING", p.From)
		select {
		case <-f.unblock:
		case <-time.After(10 * time.Second):
			return nil, errors.New("never unblocked")
		}
	case "unblock":
		f.unblockMu.Do(func() { close(f.unblock) })
	case "stall":
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := f.checkKept(); err != nil {
		return nil, err
	}
	if p.From == "keep" && len(p.Events) > 0 {
		f.keptMu.Lock()
		f.kept = append(f.kept, p)
		f.keptMu.Unlock()
	}
	f.out("PUSHED", map[string]any{"From": p.From, "Events": len(p.Events)})
	if p.From == "fail-me" {
		return nil, errors.New("receiver failed on purpose")
	}
	res := &messages.PushResult{V: messages.SyncVersion}
	for _, e := range p.Events {
		if e.Raw[0] == 0xEE {
			res.Retry = append(res.Retry, e.Seq)
		} else {
			res.Applied++
		}
	}
	for _, c := range p.Claims {
		res.Watermarks = append(res.Watermarks, messages.GroupWatermark{Group: c.Group, HLC: c.HLC})
	}
	return res, nil
}

// testPush builds a valid push of n events of about size bytes each; the
// event at index 1 (if any) starts with 0xEE (the fake receiver retries it).
func testPush(from string, n, size int) *messages.SyncPush {
	p := &messages.SyncPush{V: messages.SyncVersion, From: from, Log: bytes.Repeat([]byte{9}, 16), After: 0, Through: uint64(n), Tail: uint64(n) + 5}
	for i := 0; i < n; i++ {
		raw := bytes.Repeat([]byte{byte(i)}, max(size, 1))
		raw[0] = 0x01
		if i == 1 {
			raw[0] = 0xEE
		}
		p.Events = append(p.Events, messages.PushedEvent{Seq: uint64(i + 1), Raw: raw})
	}
	p.Claims = []messages.WatermarkClaim{{Group: messages.Group{Site: messages.SiteID{3}, Schema: "app", Table: "notes"}, HLC: messages.HLC(1234), Seq: uint64(n)}}
	return p
}

func runRemoteChild(rawSpec string, in io.Reader, stdout io.Writer) error {
	var spec remoteChildSpec
	if err := json.Unmarshal([]byte(rawSpec), &spec); err != nil {
		return err
	}
	var outMu sync.Mutex
	out := func(kind string, v any) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(stdout, "%s %s\n", kind, b)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	var evMu sync.Mutex
	connected, terminated := 0, 0
	sys.EventStream.Subscribe(func(m any) {
		evMu.Lock()
		defer evMu.Unlock()
		switch m.(type) {
		case *remote.EndpointConnectedEvent:
			connected++
		case *remote.EndpointTerminatedEvent:
			terminated++
		}
	})
	cfg := RemoteConfig{
		Plaintext:           spec.Plaintext,
		RequestTimeout:      spec.RequestTimeout,
		MaxConcurrentPushes: spec.MaxConcurrentPushes,
		Logger:              slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnUndecodable: func(u wire.Undecodable) {
			out("UNDECODABLE", remoteChildUndecodable{Type: u.Type, Known: u.Known, Size: u.Size, Err: u.Err.Error()})
		},
	}
	if spec.CertDir != "" {
		var err error
		if cfg.TLS, cfg.ClientTLS, err = loadRemoteTLS(spec.CertDir, spec.TrustDir); err != nil {
			return err
		}
	}
	r, err := StartRemote(sys, cfg)
	if err != nil {
		return err
	}
	fake := &fakeReceiver{delay: spec.HandleDelay, out: out, unblock: make(chan struct{}), release: make(chan struct{})}
	r.Serve(fake)
	out("ADDR", r.Address())

	var pending []chan remoteReply
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 200<<20)
	for sc.Scan() {
		var cmd remoteCmd
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			return err
		}
		var rep remoteReply
		switch cmd.Op {
		case "pushasync":
			cmd.Op = "push"
			ch := make(chan remoteReply, 1)
			pending = append(pending, ch)
			go func(cmd remoteCmd) { ch <- childCommand(sys, r, cmd) }(cmd)
			rep.OK = true
		case "release":
			fake.releaseMu.Do(func() { close(fake.release) })
			rep.OK = true
		case "await":
			if len(pending) == 0 {
				rep.Err = "nothing pending"
				break
			}
			rep = <-pending[0]
			pending = pending[1:]
		default:
			rep = childCommand(sys, r, cmd)
		}
		evMu.Lock()
		rep.Connected, rep.Terminated = connected, terminated
		evMu.Unlock()
		rep.Stats = r.Stats()
		out("REPLY", rep)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if err := r.Close(); err != nil {
		return err
	}
	if err := r.Close(); err != nil { // idempotent
		return fmt.Errorf("second Close: %w", err)
	}
	if _, err := r.Push(context.Background(), "x", testPush("x", 1, 1)); !errors.Is(err, ErrRemoteClosed) || !errors.Is(err, ErrClosed) || !errors.Is(err, replicate.ErrUnreachable) {
		return fmt.Errorf("push after Close: %v", err)
	}
	sys.Shutdown()
	return nil
}

func describe(rep *remoteReply, err error) {
	if err == nil {
		rep.OK = true
		return
	}
	rep.Err = err.Error()
	rep.Unreachable = errors.Is(err, replicate.ErrUnreachable)
	rep.Rejected = errors.Is(err, ErrPushRejected)
	rep.BadResponse = errors.Is(err, ErrBadResponse)
}

func childCommand(sys *actor.ActorSystem, r *Remote, cmd remoteCmd) remoteReply {
	var rep remoteReply
	name := cmd.Name
	if name == "" {
		name = cmd.Peer
	}
	if !cmd.NoAddPeer && cmd.Peer != "" && cmd.Op != "addpeer" {
		r.AddPeer(name, cmd.Peer)
	}
	timeout := r.timeout + 5*time.Second
	switch cmd.Op {
	case "push":
		ctx := context.Background()
		if cmd.CtxTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cmd.CtxTimeout)
			defer cancel()
		}
		from := "child"
		if cmd.Type != "" {
			from = cmd.Type
		}
		start := time.Now()
		res, err := r.Push(ctx, name, testPush(from, cmd.Events, cmd.EventBytes))
		rep.Elapsed = time.Since(start)
		rep.Result = res
		describe(&rep, err)
	case "raw":
		// A frame the Push API would never send: straight to the peer's
		// sync actor, answered like a push.
		env := &wire.Envelope{Type: cmd.Type, Cbor: cmd.CBOR}
		if cmd.Zeros > 0 {
			env.Cbor = make([]byte, cmd.Zeros)
		}
		v, err := sys.Root.RequestFuture(actor.NewPID(cmd.Peer, SyncActorName), env, timeout).Result()
		switch m := v.(type) {
		case *wire.Rejected:
			err = fmt.Errorf("%w: %s", ErrPushRejected, m.Reason)
		case *wire.Result:
			rep.Result = m.Result
		case *wire.Bundle:
		case nil:
		default:
			err = fmt.Errorf("unexpected answer %T", v)
		}
		describe(&rep, err)
	case "rawsend":
		// A one-way frame (a device envelope) to the peer's sync actor,
		// N times (at least once).
		env := &wire.Envelope{Type: cmd.Type, Cbor: cmd.CBOR}
		for i := 0; i < max(cmd.N, 1); i++ {
			sys.Root.Send(actor.NewPID(cmd.Peer, SyncActorName), env)
		}
		rep.OK = true
	case "bundles":
		// N unauthenticated bundle requests for Device, Parallel at once.
		env, err := wire.EnvelopeOf(&wire.BundleRequest{To: cmd.Device})
		if err != nil {
			describe(&rep, err)
			break
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		next := make(chan struct{}, cmd.N)
		for i := 0; i < cmd.N; i++ {
			next <- struct{}{}
		}
		close(next)
		for w := 0; w < max(cmd.Parallel, 1); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					v, err := sys.Root.RequestFuture(actor.NewPID(cmd.Peer, SyncActorName), env, timeout).Result()
					if e, ok := v.(*wire.Envelope); ok {
						v, _ = e.Deserialize()
					}
					_, ok := v.(*wire.Bundle)
					mu.Lock()
					if err == nil && ok {
						rep.Bundles++
					} else {
						rep.Refusals++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		rep.OK = true
	case "guard":
		rep.Guard, rep.Result, rep.Err = guardProbe(sys, cmd.Peer, timeout)
		rep.OK = rep.Err == ""
	case "bench":
		p := testPush("bench", cmd.Events, cmd.EventBytes)
		before := r.Stats()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		per := cmd.N / max(cmd.Parallel, 1)
		start := time.Now()
		for w := 0; w < max(cmd.Parallel, 1); w++ {
			n := per
			if w == 0 {
				n += cmd.N - per*max(cmd.Parallel, 1)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < n; i++ {
					if _, err := r.Push(context.Background(), name, p); err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		rep.Elapsed = time.Since(start)
		rep.Bytes = r.Stats().PayloadBytesSent - before.PayloadBytesSent
		describe(&rep, firstErr)
	case "addpeer":
		// Bind Name to the node at Peer (its TLS certificate by name).
		describe(&rep, r.AddPeer(cmd.Name, cmd.Peer))
	case "stats":
		rep.OK = true
	default:
		rep.Err = "unknown op " + cmd.Op
	}
	return rep
}

// guardProbe opens its own gRPC stream to the peer, as protoactor's
// endpoint writer does, and sends batches the endpoint reader would crash
// or end the stream on; then, on the same stream, a valid push whose
// answer must come back to a future of this node. It returns the results
// of each step.
func guardProbe(sys *actor.ActorSystem, peer string, timeout time.Duration) ([]string, *messages.PushResult, string) {
	conn, err := grpc.Dial(peer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err.Error()
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return nil, nil, err.Error()
	}
	if err := stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: sys.ID, Address: sys.Address()}},
	}}}); err != nil {
		return nil, nil, err.Error()
	}
	if _, err := stream.Recv(); err != nil {
		return nil, nil, "connect response: " + err.Error()
	}
	target := actor.NewPID(peer, SyncActorName)
	push, _ := wire.EnvelopeOf(&wire.Push{Push: testPush("guard", 3, 8)})
	pushBytes, _ := protoMarshal(push)
	envName := "syncmesh.wire.Envelope"
	batches := map[string]*remote.MessageBatch{
		"unknown protobuf type":  {TypeNames: []string{"no.such.Type"}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, MessageData: []byte{1, 2}}}},
		"type index":             {TypeNames: []string{envName}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 7, Target: 0, MessageData: pushBytes}}},
		"target index":           {TypeNames: []string{envName}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 3, MessageData: pushBytes}}},
		"sender index":           {TypeNames: []string{envName}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 2, MessageData: pushBytes}}},
		"json serializer":        {TypeNames: []string{envName}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, SerializerId: 1, MessageData: []byte("{")}}},
		"bad protobuf":           {TypeNames: []string{envName}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, MessageData: []byte{0x0a, 0xff, 0xff}}}},
		"system Stop":            {TypeNames: []string{"actor.Stop"}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0}}},
		"Terminated without Who": {TypeNames: []string{"actor.Terminated"}, Targets: []*actor.PID{target}, Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0}}},
	}
	var steps []string
	for _, name := range sortedKeys(batches) {
		if err := stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: batches[name]}}); err != nil {
			return steps, nil, name + ": " + err.Error()
		}
		steps = append(steps, name)
	}
	// The valid push, on the same stream, answered to a future here.
	f := actor.NewFuture(sys, timeout)
	valid := &remote.MessageBatch{
		TypeNames: []string{envName}, Targets: []*actor.PID{target}, Senders: []*actor.PID{f.PID()},
		Envelopes: []*remote.MessageEnvelope{{TypeId: 0, Target: 0, Sender: 1, MessageData: pushBytes}},
	}
	if err := stream.Send(&remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: valid}}); err != nil {
		return steps, nil, "valid push: " + err.Error()
	}
	v, err := f.Result()
	if err != nil {
		return steps, nil, "valid push answer: " + err.Error()
	}
	res, ok := v.(*wire.Result)
	if !ok {
		return steps, nil, fmt.Sprintf("valid push answered %T", v)
	}
	return steps, res.Result, ""
}

func protoMarshal(m proto.Message) ([]byte, error) { return proto.Marshal(m) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// childProcess is the parent's side of a child process: this test
// binary run again for one test (a runAsChild body) with env set to the
// child's JSON spec. Commands go to its stdin as JSON lines; its stdout
// lines go to the parent's handler; stop fails the test when the child
// exits non-zero (for example on a race report). The remote tests' and
// the reconciliation tests' children share it.
type childProcess struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	stderr *bytes.Buffer
	done   chan struct{} // closed when the child's stdout ends
}

// startChildProcess starts the child running test with env set to spec;
// onLine gets each stdout line (split at its first space), from one
// goroutine. The child stops when t ends.
func startChildProcess(t testing.TB, name, test, env string, spec any, onLine func(kind, body string)) *childProcess {
	t.Helper()
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+string(raw))
	c := &childProcess{t: t, name: name, cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			kind, body, _ := strings.Cut(sc.Text(), " ")
			onLine(kind, body)
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// send writes cmd to the child as one JSON line.
func (c *childProcess) send(cmd any) {
	c.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatalf("child %s: %v: %s", c.name, err, c.stderr.String())
	}
}

// awaitChild waits for the child's next reply on replies, failing the
// test when the child exits or does not answer what within two minutes.
func awaitChild[R any](c *childProcess, replies <-chan R, what string) R {
	c.t.Helper()
	select {
	case r := <-replies:
		return r
	case <-c.done:
		c.t.Fatalf("child %s exited during %s: %s", c.name, what, c.stderr.String())
	case <-time.After(5 * time.Minute): // generous: costs only a child that hangs
		c.t.Fatalf("child %s did not answer %s: %s", c.name, what, c.stderr.String())
	}
	var zero R
	return zero
}

// stop closes the child's stdin (it closes what it runs and exits) and
// fails the test if it exits non-zero.
func (c *childProcess) stop() {
	if c.in == nil {
		return
	}
	_ = c.in.Close()
	c.in = nil
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
	}
	if err := c.cmd.Wait(); err != nil {
		c.t.Errorf("child %s: %v\n%s", c.name, err, c.stderr.String())
	}
}

// remoteChild is the parent's handle on a child node.
type remoteChild struct {
	*childProcess
	addr    string
	replies chan remoteReply

	mu       sync.Mutex
	undec    []remoteChildUndecodable
	pushed   []map[string]any
	blocking int
}

// startRemoteChild starts a child node and waits for its address.
func startRemoteChild(t testing.TB, name string, spec remoteChildSpec) *remoteChild {
	t.Helper()
	c := &remoteChild{replies: make(chan remoteReply, 1)}
	addr := make(chan string, 1)
	c.childProcess = startChildProcess(t, name, "TestRemoteChild", remoteChildEnv, spec, func(kind, body string) {
		switch kind {
		case "ADDR":
			var a string
			_ = json.Unmarshal([]byte(body), &a)
			addr <- a
		case "UNDECODABLE":
			var u remoteChildUndecodable
			_ = json.Unmarshal([]byte(body), &u)
			c.mu.Lock()
			c.undec = append(c.undec, u)
			c.mu.Unlock()
		case "BLOCKING":
			c.mu.Lock()
			c.blocking++
			c.mu.Unlock()
		case "PUSHED":
			var p map[string]any
			_ = json.Unmarshal([]byte(body), &p)
			c.mu.Lock()
			c.pushed = append(c.pushed, p)
			c.mu.Unlock()
		case "REPLY":
			var r remoteReply
			_ = json.Unmarshal([]byte(body), &r)
			c.replies <- r
		}
	})
	select {
	case c.addr = <-addr:
	case <-c.done:
		t.Fatalf("child %s exited before starting: %s", name, c.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("child %s did not start: %s", name, c.stderr.String())
	}
	return c
}

// call sends cmd and waits for the child's reply.
func (c *remoteChild) call(cmd remoteCmd) remoteReply {
	c.t.Helper()
	c.send(cmd)
	return awaitChild(c.childProcess, c.replies, cmd.Op)
}

func (c *remoteChild) undecodables() []remoteChildUndecodable {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]remoteChildUndecodable(nil), c.undec...)
}

func (c *remoteChild) blocked() []struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return make([]struct{}, c.blocking)
}

func (c *remoteChild) pushes() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]map[string]any(nil), c.pushed...)
}
