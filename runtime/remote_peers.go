package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/fxamacker/cbor/v2"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// RemotePeerOption configures a peer in Remote.AddPeer.
type RemotePeerOption func(*remotePeer)

// PinPeerKey binds the peer to one TLS client key: the SHA-256 of its
// certificate's SubjectPublicKeyInfo. Without a pin, the peer is bound by
// name: its client certificate (verified against RemoteConfig.TLS's
// ClientCAs) must carry the peer name as a DNS name or as its CommonName.
func PinPeerKey(spkiSHA256 [32]byte) RemotePeerOption {
	return func(p *remotePeer) { p.pin = spkiSHA256[:] }
}

// SPKIHash is the SHA-256 of a certificate's SubjectPublicKeyInfo, the
// value PinPeerKey takes.
func SPKIHash(cert *x509.Certificate) [32]byte { return sha256.Sum256(cert.RawSubjectPublicKeyInfo) }

// remotePeer is one configured peer: where it is reached, and how its TLS
// client certificate is recognized.
type remotePeer struct {
	addr string
	pin  []byte
}

// matches reports whether cert authenticates peer name.
func (p remotePeer) matches(name string, cert *x509.Certificate) bool {
	if cert == nil {
		return false
	}
	if p.pin != nil {
		h := SPKIHash(cert)
		return bytes.Equal(h[:], p.pin)
	}
	return cert.Subject.CommonName == name || slices.Contains(cert.DNSNames, name)
}

func validPeerAddress(address string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrInvalidPeerAddress, address, err)
	}
	n, err := strconv.Atoi(port)
	if host == "" || err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: %q: need host:port with a port in 1..65535", ErrInvalidPeerAddress, address)
	}
	return nil
}

// AddPeer makes peer reachable at address (host:port), replacing a
// previous entry, and binds it (with TLS) to its client certificate: a
// push arriving over a connection whose certificate is not peer's, or
// whose reply address is not address, is refused before it reaches the
// node (ErrSenderMismatch, counted in RemoteStats.RefusedPushes). An
// address that is not host:port is ErrInvalidPeerAddress and changes
// nothing.
func (r *Remote) AddPeer(peer, address string, opts ...RemotePeerOption) error {
	if peer == "" {
		return fmt.Errorf("runtime: AddPeer needs a peer name")
	}
	if err := validPeerAddress(address); err != nil {
		return err
	}
	p := remotePeer{addr: address}
	for _, o := range opts {
		o(&p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.peers[peer] = address
	if r.bound == nil {
		r.bound = map[string]remotePeer{}
	}
	r.bound[peer] = p
	return nil
}

// streamCert returns the verified TLS client certificate of an inbound
// stream (nil without TLS).
func streamCert(ctx context.Context) *x509.Certificate {
	pr, ok := grpcpeer.FromContext(ctx)
	if !ok || pr.AuthInfo == nil {
		return nil
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	return ti.State.PeerCertificates[0]
}

// pushFrom reads only the From of a push's CBOR (the full decode happens
// once, in the endpoint reader).
func pushFrom(b []byte) (string, error) {
	var p struct {
		From string `cbor:"from"`
	}
	if err := cbor.Unmarshal(b, &p); err != nil {
		return "", err
	}
	return p.From, nil
}

// authorize decides whether a push claiming to be from name, over a
// stream authenticated by cert, answered at replyAddr, is the configured
// peer it says it is. With TLS the certificate must be that peer's and
// the reply address its configured address (answers go to the
// authenticated peer only). Plaintext authenticates nothing: the push is
// let through and attributed by the node to its From (an explicit
// choice, RemoteConfig.Plaintext).
func (r *Remote) authorize(name string, cert *x509.Certificate, replyAddr string) error {
	if r.cfg.TLS == nil {
		return nil
	}
	r.mu.RLock()
	p, ok := r.bound[name]
	r.mu.RUnlock()
	switch {
	case !ok:
		return fmt.Errorf("%w: %q is not a configured peer", replicate.ErrUnknownSender, truncateName(name))
	case !p.matches(name, cert):
		who := "no certificate"
		if cert != nil {
			who = "certificate of " + truncateName(cert.Subject.CommonName)
		}
		return fmt.Errorf("%w: push as %q over a connection with the %s", replicate.ErrSenderMismatch, truncateName(name), who)
	case replyAddr != "" && replyAddr != p.addr:
		return fmt.Errorf("%w: push as %q asks for its answer at %s, not the peer's address %s", replicate.ErrSenderMismatch, truncateName(name), truncateName(replyAddr), p.addr)
	}
	return nil
}

// admit runs after sanitizeBatch on every inbound batch: it refuses the
// pushes authorize refuses (answering the authenticated peer, if the
// reply address is its own), and returns for every envelope it keeps the
// inbound pool it will take a token of (nil: not for the sync actor).
func (r *Remote) admit(b *remote.MessageBatch, cert *x509.Certificate) []*inPool {
	if b == nil {
		return nil
	}
	kept := b.Envelopes[:0]
	var pools []*inPool
	for _, e := range b.Envelopes {
		target := b.Targets[e.Target]
		if b.TypeNames[e.TypeId] != envelopeName || target.Id != SyncActorName {
			// Not for the sync actor's Receive (protoactor's own system
			// messages are handled by the endpoint manager): no token.
			kept = append(kept, e)
			pools = append(pools, nil)
			continue
		}
		pool := r.in.shared
		env, perr := viewEnvelope(e.MessageData)
		if perr == nil && (env.Type == wire.TypeDeviceEnvelope || env.Type == wire.TypeBundleRequest) {
			// The delivery plane's binding (remote_device.go).
			if r.admitDevice(env, b, e, cert) {
				// No inbound token: a batch of one-way envelopes can
				// exceed the token pool and would block on tokens that
				// only its own delivery gives back. They are bounded by
				// the per-link queues, bundle requests by their budget.
				kept = append(kept, e)
				pools = append(pools, nil)
			}
			continue
		}
		// A reconciliation request is bound like a push (remote_reconcile.go).
		if perr == nil && (env.Type == wire.TypeSyncPush || env.Type == wire.TypeReconcileRequest) {
			replyAddr := ""
			if e.Sender > 0 {
				replyAddr = b.Senders[e.Sender-1].Address
			}
			from, err := pushFrom(env.Cbor)
			switch {
			case err != nil && r.cfg.TLS == nil:
				// Plaintext: the endpoint reader surfaces it as
				// undecodable and answers with a rejection.
				err = nil
			case err != nil:
				err = fmt.Errorf("%w: push without a readable sender: %v", replicate.ErrSenderMismatch, err)
			default:
				err = r.authorize(from, cert, replyAddr)
			}
			if err != nil {
				r.refused.Add(1)
				r.metrics.refused.Inc()
				r.log.Warn("push refused by the stream guard", "error", err)
				if e.Sender > 0 && r.replyAllowed(cert, replyAddr) {
					r.reply(b.Senders[e.Sender-1], &wire.Rejected{Reason: err.Error()})
				}
				continue
			}
			r.mu.RLock()
			_, configured := r.bound[from]
			r.mu.RUnlock()
			// A push nobody can be answered for shares the common pool
			// (the sync actor finds an envelope's pool by its sender).
			pool = r.in.pool(from, configured && e.Sender > 0)
		}
		kept = append(kept, e)
		pools = append(pools, pool)
	}
	for i := len(kept); i < len(b.Envelopes); i++ {
		b.Envelopes[i] = nil
	}
	b.Envelopes = kept
	return pools
}

// replyAllowed reports whether a refusal may be answered at replyAddr:
// only when it is the configured address of the peer cert authenticates
// (never to an address a pusher chose).
func (r *Remote) replyAllowed(cert *x509.Certificate, replyAddr string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name, p := range r.bound {
		if p.addr == replyAddr && p.matches(name, cert) {
			return true
		}
	}
	return false
}
