package runtime

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/syncmesh/syncmesh/messages/wire"
)

// The stream guard. protoactor's endpoint reader (pinned version) ends the
// whole inbound stream on a frame it cannot deserialize, and crashes the
// process on an out-of-range index or an unknown protobuf type name. The
// guard runs inside gRPC, between the wire and the reader, and drops such
// envelopes from each batch before the reader sees them, surfacing each
// as undecodable; the rest of the batch and the stream go on. Frames that
// pass the guard but do not decode as CBOR become *wire.Undecodable in
// Envelope.Deserialize.

// errGuard marks envelopes dropped by the stream guard.
var errGuard = errors.New("runtime: frame dropped by the stream guard")

// guardLabel is the Undecodable.Type of frames dropped by the guard.
const guardLabel = "protobuf"

var envelopeName = string((&wire.Envelope{}).ProtoReflect().Descriptor().FullName())

// allowedProtoTypes is the set of protobuf types accepted from peers: the
// envelope, the system messages protoactor's remote exchanges by itself,
// and extra.
func allowedProtoTypes(extra []string) map[string]bool {
	m := map[string]bool{envelopeName: true}
	for _, t := range []proto.Message{&actor.DeadLetterResponse{}, &actor.Terminated{}, &actor.Watch{}, &actor.Unwatch{}} {
		m[string(t.ProtoReflect().Descriptor().FullName())] = true
	}
	for _, t := range extra {
		m[t] = true
	}
	return m
}

// guardStream is the gRPC stream interceptor installed on the server: it
// counts inbound streams and sanitizes every message protoactor receives.
func (r *Remote) guardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	r.streams.Add(1)
	cert := streamCert(ss.Context())
	defer r.trackStream(cert)()
	gs := &guardedStream{ServerStream: ss, r: r, cert: cert}
	defer r.readers.release(&gs.held) // the reader makes no read after its handler returned
	return handler(srv, gs)
}

type guardedStream struct {
	grpc.ServerStream
	r    *Remote
	cert *x509.Certificate // the verified TLS client certificate (nil without TLS)
	// pending is what is left of the last batch read: envelopes admitted
	// but not handed to protoactor yet, each with the inbound pool it
	// needs a token of (remote_inbound.go).
	pending *remote.MessageBatch
	pools   []*inPool
	// held: the last message returned holds the remote's readerGate
	// (remote_readergate.go) until the next RecvMsg.
	held bool
	// reached is closed when protoactor's endpoint manager, stopping,
	// reached this stream (SendMsg; closingErr).
	reachedInit, reachedClose sync.Once
	reached                   chan struct{}
}

// RecvMsg implements grpc.ServerStream. It hands protoactor's reader a
// batch in parts, each as long as the envelopes' pools have tokens for:
// blocking for the first envelope's token stops this stream's reads (gRPC
// flow control pushes back on the sender), and the envelopes handed over
// before are already in the sync actor's mailbox, so their tokens come
// back and the stream goes on.
func (g *guardedStream) RecvMsg(m any) error {
	// protoactor's reader read its suspended flag for the message returned
	// last before calling again: that read is done.
	if g.r.readers.release(&g.held) {
		return g.closingErr(errRemoteClosing)
	}
	if err := g.recvMsg(m); err != nil {
		// On an error the reader returns and closes its disconnect
		// channel, which the manager's stop sends on: that close holds
		// the gate until the handler returned (guardStream), or, once
		// closing began, waits for the manager (closingErr).
		if !g.r.readers.hold(&g.held) {
			return g.closingErr(err)
		}
		return err
	}
	if !g.r.readers.hold(&g.held) {
		return g.closingErr(errRemoteClosing) // closing began while this call waited
	}
	return nil
}

// SendMsg implements grpc.ServerStream. protoactor's endpoint manager,
// stopping in Shutdown, sends on the disconnect channel of every reader it
// holds, and that reader's goroutine answers by sending a DisconnectRequest
// on the stream: seeing it here means the manager is done with this
// stream's channel.
func (g *guardedStream) SendMsg(m any) error {
	if rm, ok := m.(*remote.RemoteMessage); ok && rm.GetDisconnectRequest() != nil {
		ch := g.reachedChan()
		g.reachedClose.Do(func() { close(ch) })
	}
	return g.ServerStream.SendMsg(m)
}

func (g *guardedStream) reachedChan() chan struct{} {
	g.reachedInit.Do(func() { g.reached = make(chan struct{}) })
	return g.reached
}

// closingErr returns err once Close began, after protoactor's endpoint
// manager reached this stream: the pinned protoactor-go's Shutdown sends
// on each reader's disconnect channel without synchronization with the
// reader, which closes that channel when its stream ends (a data race, and
// a send on a closed channel). A stream that does not end before the
// manager is done with it leaves the two ordered. Bounded by
// readerGateTimeout and the stream's context (gRPC's Stop cancels it).
func (g *guardedStream) closingErr(err error) error {
	t := time.NewTimer(readerGateTimeout)
	defer t.Stop()
	select {
	case <-g.reachedChan():
	case <-g.Context().Done():
	case <-t.C:
	}
	return err
}

func (g *guardedStream) recvMsg(m any) error {
	rm, ok := m.(*remote.RemoteMessage)
	if ok && g.pending != nil {
		return g.next(rm)
	}
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !ok || rm.GetMessageBatch() == nil {
		return nil
	}
	b := rm.GetMessageBatch()
	for _, u := range sanitizeBatch(b, g.r.allowed) {
		g.r.surface(u, "stream guard")
	}
	g.pending, g.pools = b, g.r.admit(b, g.cert)
	return g.next(rm)
}

// next sets rm to the next part of the pending batch.
func (g *guardedStream) next(rm *remote.RemoteMessage) error {
	b := g.pending
	n := 0
	for ; n < len(b.Envelopes); n++ {
		p := g.pools[n]
		if p == nil {
			continue
		}
		e := b.Envelopes[n]
		var sender *actor.PID
		if e.Sender > 0 {
			sender = cloneSender(b.Senders[e.Sender-1], e.SenderRequestId)
		}
		ok, err := g.r.in.take(g.Context(), g.r.baseCtx, p, sender, n == 0)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
	}
	part := &remote.MessageBatch{TypeNames: b.TypeNames, Targets: b.Targets, Senders: b.Senders, Envelopes: b.Envelopes[:n:n]}
	if n == len(b.Envelopes) {
		g.pending, g.pools = nil, nil
	} else {
		g.pending = &remote.MessageBatch{TypeNames: b.TypeNames, Targets: b.Targets, Senders: b.Senders, Envelopes: b.Envelopes[n:]}
		g.pools = g.pools[n:]
	}
	rm.MessageType = &remote.RemoteMessage_MessageBatch{MessageBatch: part}
	return nil
}

// cloneSender is the sender PID protoactor's reader gives the envelope
// (with its request id).
func cloneSender(pid *actor.PID, requestID uint32) *actor.PID {
	if pid == nil || requestID == 0 {
		return pid
	}
	return &actor.PID{Address: pid.Address, Id: pid.Id, RequestId: requestID}
}

// rejectUnary answers protoactor's unary RPCs (ListProcesses,
// GetProcessDiagnostics), which panic at the pinned version.
func rejectUnary(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
	return nil, status.Error(codes.Unimplemented, "not served")
}

// sanitizeBatch removes from b, in place, every envelope protoactor's
// endpoint reader would crash or end the stream on, and returns them as
// undecodable frames.
func sanitizeBatch(b *remote.MessageBatch, allowed map[string]bool) []*wire.Undecodable {
	if b == nil {
		return nil
	}
	var dropped []*wire.Undecodable
	kept := b.Envelopes[:0]
	for _, e := range b.Envelopes {
		if err := checkEnvelope(b, e, allowed); err != nil {
			dropped = append(dropped, &wire.Undecodable{Type: guardLabel, Size: len(e.GetMessageData()), Err: fmt.Errorf("%w: %w", errGuard, err)})
			continue
		}
		kept = append(kept, e)
	}
	for i := len(kept); i < len(b.Envelopes); i++ {
		b.Envelopes[i] = nil
	}
	b.Envelopes = kept
	return dropped
}

func checkEnvelope(b *remote.MessageBatch, e *remote.MessageEnvelope, allowed map[string]bool) error {
	if e == nil {
		return errors.New("nil envelope")
	}
	if e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames) {
		return fmt.Errorf("type index %d of %d", e.TypeId, len(b.TypeNames))
	}
	if e.Target < 0 || int(e.Target) >= len(b.Targets) || b.Targets[e.Target] == nil {
		return fmt.Errorf("target index %d of %d", e.Target, len(b.Targets))
	}
	if e.Sender < 0 || int(e.Sender) > len(b.Senders) || (e.Sender > 0 && b.Senders[e.Sender-1] == nil) {
		return fmt.Errorf("sender index %d of %d", e.Sender, len(b.Senders))
	}
	if e.SerializerId != 0 {
		return fmt.Errorf("serializer %d (only protobuf, 0, is accepted)", e.SerializerId)
	}
	name := b.TypeNames[e.TypeId]
	if !allowed[name] {
		return fmt.Errorf("protobuf type %q not accepted", truncateName(name))
	}
	if name == envelopeName {
		// The reader unmarshals it the same way (viewEnvelope's verdict
		// is protobuf's), into its own copy; read in place here.
		if _, err := viewEnvelope(e.MessageData); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return fmt.Errorf("protobuf type %q not linked in: %w", truncateName(name), err)
	}
	// The reader unmarshals the same way; a failure there ends the stream.
	m := mt.New().Interface()
	if err := proto.Unmarshal(e.MessageData, m); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// Fields protoactor dereferences without checking.
	switch x := m.(type) {
	case *actor.Terminated:
		if x.Who == nil {
			return errors.New("actor.Terminated without Who")
		}
	case *actor.Watch:
		if x.Watcher == nil {
			return errors.New("actor.Watch without Watcher")
		}
	case *actor.Unwatch:
		if x.Watcher == nil {
			return errors.New("actor.Unwatch without Watcher")
		}
	}
	return nil
}

func truncateName(s string) string {
	if len(s) > wire.MaxTypeName {
		return s[:wire.MaxTypeName] + "..."
	}
	return s
}

// envelopeView is an inbound wire.Envelope read in place: Cbor aliases
// the received message and is only looked at (protoactor's reader
// decodes the message again, into a copy of its own, for the sync actor).
type envelopeView struct {
	Type string
	Cbor []byte
}

// viewEnvelope reads data as proto.Unmarshal reads a wire.Envelope,
// without copying the CBOR: the stream guard and admit looked at every
// push through two full decodes, two copies of each push the reader
// then copied a third time, garbage at once. Only the encoding
// syncmesh's senders produce is read here: fields 1 (type) and 2
// (cbor), length-delimited, a valid UTF-8 type (proto3 strings). Any
// other input (unknown fields, other wire types, truncation) is decoded
// by proto.Unmarshal itself, so what is accepted, and every error, is
// protobuf's (FuzzViewEnvelope).
func viewEnvelope(data []byte) (envelopeView, error) {
	var v envelopeView
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return unmarshalEnvelope(data)
		}
		val, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return unmarshalEnvelope(data)
		}
		if num == 1 {
			if !utf8.Valid(val) {
				return unmarshalEnvelope(data)
			}
			v.Type = string(val)
		} else {
			v.Cbor = val
		}
		b = b[n+m:]
	}
	return v, nil
}

func unmarshalEnvelope(data []byte) (envelopeView, error) {
	var e wire.Envelope
	if err := proto.Unmarshal(data, &e); err != nil {
		return envelopeView{}, err
	}
	return envelopeView{Type: e.Type, Cbor: e.Cbor}, nil
}
