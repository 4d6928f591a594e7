package hosting

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// Member transport security. Members talk gRPC (protoactor's remote)
// with mutual TLS by default, with certificates from the mesh's own CA
// (runtime/meshtls, `sspctl tls`): a member's identity is the node name
// its certificate carries (meshtls.NodeName), and every request a member
// receives is attributed to the certificate of the connection that
// carried it (Request.Caller is set from it, whatever the sender wrote).
// Plaintext is an explicit choice (ClusterConfig.Plaintext), logged at
// every start: it authenticates nothing.

// MemberTLS loads the member certificate name from dir (<name>.pem,
// <name>.key and the CA's ca.pem, as `sspctl tls` writes them) into the
// server and client configurations ClusterConfig.TLS and
// ClusterConfig.ClientTLS take.
func MemberTLS(dir, name string) (server, client *tls.Config, err error) {
	return meshtls.LoadNodeTLS(dir, name)
}

var envelopeName = string((&wire.Envelope{}).ProtoReflect().Descriptor().FullName())

// memberIdentity checks the TLS settings of a member and returns the
// name its certificate carries.
func (c *ClusterConfig) memberIdentity() (string, error) {
	switch {
	case c.TLS == nil && !c.Plaintext:
		return "", fmt.Errorf("%w: TLS (mutual, from runtime/meshtls) is required unless Plaintext is set explicitly", ErrInvalidConfig)
	case c.TLS != nil && c.Plaintext:
		return "", fmt.Errorf("%w: Plaintext set together with TLS", ErrInvalidConfig)
	case c.Plaintext:
		name := c.MemberName
		if name == "" {
			name = "member"
		}
		if err := meshtls.ValidateName(name); err != nil {
			return "", fmt.Errorf("%w: MemberName: %w", ErrInvalidConfig, err)
		}
		return name, nil
	case c.TLS.ClientAuth != tls.RequireAndVerifyClientCert:
		return "", fmt.Errorf("%w: TLS.ClientAuth must be tls.RequireAndVerifyClientCert (mutual TLS)", ErrInvalidConfig)
	case len(c.TLS.Certificates) == 0 || len(c.TLS.Certificates[0].Certificate) == 0:
		return "", fmt.Errorf("%w: TLS has no member certificate", ErrInvalidConfig)
	case c.ClientTLS == nil || len(c.ClientTLS.Certificates) == 0 || len(c.ClientTLS.Certificates[0].Certificate) == 0:
		return "", fmt.Errorf("%w: ClientTLS with the member's client certificate is required with TLS", ErrInvalidConfig)
	}
	name, err := certName(c.TLS.Certificates[0])
	if err != nil {
		return "", err
	}
	cname, err := certName(c.ClientTLS.Certificates[0])
	if err != nil {
		return "", err
	}
	if cname != name {
		return "", fmt.Errorf("%w: server certificate names %q, client certificate %q", ErrInvalidConfig, name, cname)
	}
	if c.MemberName != "" && c.MemberName != name {
		return "", fmt.Errorf("%w: MemberName %q is not the certificate's %q", ErrInvalidConfig, c.MemberName, name)
	}
	return name, nil
}

func certName(c tls.Certificate) (string, error) {
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return "", fmt.Errorf("%w: member certificate: %w", ErrInvalidConfig, err)
		}
	}
	name, err := meshtls.NodeName(leaf)
	if err != nil {
		return "", fmt.Errorf("%w: member certificate: %w", ErrInvalidConfig, err)
	}
	return name, nil
}

// maxMemberMessage bounds one gRPC message a member receives from
// another: one protoactor batch of envelopes, so room for four full
// frames (MaxFrame) and slack. gRPC's own default (4 MiB) is below one
// frame: a request or reply the codec writes would be refused by its
// receiver. A larger batch is refused by gRPC, which resets that
// connection; its requests are retried.
const maxMemberMessage = 4*MaxFrame + 1<<20

// remoteSecurity returns the remote options of the member's transport:
// TLS credentials both ways (or explicit plaintext), the stream
// interceptor attributing requests to their connection's certificate and
// the inbound message bound (maxMemberMessage).
func (c *ClusterConfig) remoteSecurity() []remote.ConfigOption {
	server := []grpc.ServerOption{grpc.ChainStreamInterceptor(attributeStream), grpc.MaxRecvMsgSize(maxMemberMessage)}
	dial := insecure.NewCredentials()
	if c.TLS != nil {
		server = append(server, grpc.Creds(credentials.NewTLS(c.TLS.Clone())))
		dial = credentials.NewTLS(c.ClientTLS.Clone())
	}
	return []remote.ConfigOption{remote.WithServerOptions(server...), remote.WithDialOptions(grpc.WithTransportCredentials(dial))}
}

// memberIDOf is the member identity a cluster member id carries
// (identity@incarnation).
func memberIDOf(id string) string {
	name, _, ok := strings.Cut(id, "@")
	if !ok {
		return ""
	}
	return name
}

// attributeStream is the members' gRPC stream interceptor: every hosting
// Request in every batch received is stamped with the name of the
// certificate the stream was authenticated with ("" without TLS: the
// sender's word then stands, an explicit plaintext choice).
func attributeStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	name, tlsOn := streamName(ss)
	return handler(srv, &attributedStream{ServerStream: ss, name: name, tls: tlsOn})
}

// streamName returns the member name of the stream's verified client
// certificate (tls false: no TLS on the stream).
func streamName(ss grpc.ServerStream) (name string, tlsOn bool) {
	pr, ok := grpcpeer.FromContext(ss.Context())
	if !ok || pr.AuthInfo == nil {
		return "", false
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	if len(ti.State.PeerCertificates) == 0 {
		return "", true
	}
	n, err := meshtls.NodeName(ti.State.PeerCertificates[0])
	if err != nil {
		return "", true
	}
	return n, true
}

type attributedStream struct {
	grpc.ServerStream
	name string
	tls  bool
}

// RecvMsg implements grpc.ServerStream.
func (s *attributedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok || rm.GetMessageBatch() == nil || !s.tls {
		return nil
	}
	b := rm.GetMessageBatch()
	for _, e := range b.Envelopes {
		if e == nil || int(e.TypeId) >= len(b.TypeNames) || b.TypeNames[e.TypeId] != envelopeName {
			continue
		}
		e.MessageData = stampCaller(e.MessageData, s.name)
	}
	return nil
}

// stampCaller sets Caller of the hosting Request inside a wire envelope
// to name. Anything else, or a request that does not decode, is returned
// unchanged (the grain answers an undecodable request as a bad request;
// it never runs).
func stampCaller(data []byte, name string) []byte {
	var env wire.Envelope
	if err := proto.Unmarshal(data, &env); err != nil || env.Type != TypeRequest {
		return data
	}
	req, err := DecodeRequest(env.Cbor)
	if err != nil {
		return data
	}
	req.Caller = name
	out, err := req.Serialize()
	if err != nil {
		return data
	}
	b, err := proto.Marshal(out.(*wire.Envelope))
	if err != nil {
		return data
	}
	return b
}
