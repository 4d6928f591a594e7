package hosting

import (
	"context"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// Placement routes a request to the unit (kind, identity) wherever it is
// hosted, activating it there if needed. It is our seam over the cluster
// layer: NewCluster places units with protoactor-go's cluster, NewLocal
// hosts them all in this process, and another implementation (another
// cluster library, a static sharding) can replace either without touching
// the callers.
//
// Delivery is at least once: a request may reach its unit more than once
// (cluster retries, the caller's retries after ErrUnavailable), which is
// safe because every mutating Op is idempotent. A nil error means the
// reply came from the unit's host; a failure it reported is a
// *ReplyError (also returned by Reply.Err).
type Placement interface {
	// Request runs req on the unit (kind, identity) and returns its
	// reply. It retries while the unit is unavailable, until ctx ends.
	Request(ctx context.Context, kind, identity string, req *Request) (*Reply, error)
	// Member names this member (what Reply.Member holds for units it
	// hosts).
	Member() string
	// Hosted lists the units currently open on this member.
	Hosted() []Unit
	// Close stops hosting: units open here are closed (their state stays
	// in the shared root, where their next host reopens it).
	Close() error
}

// Locator is implemented by a Placement that can name the member a unit
// is placed on (by the member's identity: its certificate's name), as
// seen from here. Hosts use it to attribute device-to-device requests: a
// delivery as device d is accepted only from the member d is placed on.
type Locator interface {
	MemberOf(kind, identity string) string
}

// retryBackoff is the pause between attempts while a unit is unavailable.
func retryBackoff(attempt int) time.Duration {
	d := 20 * time.Millisecond << min(attempt, 5)
	return min(d, 500*time.Millisecond)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// placedTransport is the delivery-plane transport of hosted devices: a
// peer device is reached through the Placement (its bundle by OpBundle,
// envelopes by OpDeliver), wherever it is hosted.
type placedTransport struct {
	p    Placement
	self messages.DeviceAddress
	// ident names the member sending (Request.Caller; a remote receiver
	// replaces it with the name its certificate carries).
	ident func() string
	// timeout bounds one hand-off when the caller's context has no
	// deadline.
	timeout time.Duration
}

var _ runtime.DeviceTransport = (*placedTransport)(nil)

func (t *placedTransport) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, t.timeout)
}

// FetchBundle implements session.Transport.
func (t *placedTransport) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	ctx, cancel := t.ctx(ctx)
	defer cancel()
	self := t.self
	rep, err := t.p.Request(ctx, KindDevice, DeviceIdentity(peer), &Request{Op: OpBundle, Peer: &self, Caller: t.ident()})
	if err != nil {
		return nil, fmt.Errorf("%w: bundle of %s: %w", runtime.ErrUnreachable, peer, err)
	}
	return messages.DecodePrekeyBundle(rep.Bundle)
}

// Send implements session.Transport: it returns once the recipient's host
// processed the envelope (at least once: a retried hand-off may reach it
// twice, and the ratchet or the inbound store recognizes the copy).
func (t *placedTransport) Send(ctx context.Context, peer messages.DeviceAddress, envelope []byte) error {
	ctx, cancel := t.ctx(ctx)
	defer cancel()
	self := t.self
	if _, err := t.p.Request(ctx, KindDevice, DeviceIdentity(peer), &Request{Op: OpDeliver, Peer: &self, Envelope: envelope, Caller: t.ident()}); err != nil {
		return fmt.Errorf("%w: envelope to %s: %w", runtime.ErrUnreachable, peer, err)
	}
	return nil
}
