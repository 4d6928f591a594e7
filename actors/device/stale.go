package device

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Messages pending too long (so a failed delivery is never silent).
// A received message the application neither committed nor discarded, or
// a sent message no ACK cleared, StaleAfter after it was received or sent
// is reported once per process: to Config.OnStale (the peer named) and in
// syncmesh_delivery_stale_pending_total{side, reason} (no peer label: the
// series cannot grow with addresses). The reason says what is known:

// Reasons of a StalePending (a closed set: the metric's label values).
const (
	// StaleUncommitted: received, still pending in the application.
	StaleUncommitted = "uncommitted"
	// StaleUnacknowledged: sent on an answered session and not
	// acknowledged: the recipient is away, has not committed it, or its
	// ACK was lost (with Retry off nothing sends it again: Resend).
	StaleUnacknowledged = "unacknowledged"
	// StaleUnansweredInitiation: sent on a session this device initiated
	// that the recipient never answered (its initiation may name prekeys
	// the recipient no longer holds). Under Config.Retry the device
	// re-initiates: it resets the session and resends, so the next
	// envelope carries a new initiation from a fresh bundle. Without Retry
	// it only reports (the spec has no automatic retry by default).
	StaleUnansweredInitiation = "unanswered_initiation"
	// StalePeerIdentityChanged: sent, unacknowledged, and the recipient's
	// current bundle names another identity than the one pinned: it was
	// reinstalled, and cannot decrypt anything sent on the old session.
	// Nothing is re-sent: the application decides (AcceptIdentity, then
	// Resend, or Abandon).
	StalePeerIdentityChanged = "peer_identity_changed"
)

// DefaultStaleAfter is Config.StaleAfter's default.
const DefaultStaleAfter = time.Hour

// StalePending is one message pending longer than Config.StaleAfter.
type StalePending struct {
	// Sent: a sent message (Peer is its recipient); else a received one
	// (Peer is its authenticated sender).
	Sent   bool
	Peer   messages.DeviceAddress
	ID     messages.LogicalMessageID
	Since  time.Time // when it was received or sent
	Reason string    // Stale*
	// Reinitiated: the device reset the session and resent (Retry on,
	// StaleUnansweredInitiation).
	Reinitiated bool
}

type staleKey struct {
	sent bool
	peer messages.DeviceAddress
	id   messages.LogicalMessageID
}

func (d *Device) staleAfter() time.Duration {
	if d.cfg.StaleAfter == 0 {
		return DefaultStaleAfter
	}
	return d.cfg.StaleAfter
}

// CheckPending looks for messages pending longer than Config.StaleAfter
// and returns those it found for the first time in this process (each is
// also told to Config.OnStale and counted); under Config.Retry it
// re-initiates the sessions whose initiation was never answered. The
// schedule (Config.StaleCheckInterval) calls it; an application may too.
// With StaleAfter < 0 it does nothing.
func (d *Device) CheckPending(ctx context.Context) ([]StalePending, error) {
	if d.isClosed() {
		return nil, ErrClosed
	}
	if d.staleAfter() < 0 {
		return nil, nil
	}
	cutoff := d.cfg.Now().Add(-d.staleAfter())
	var found []StalePending
	seen := map[staleKey]bool{}
	// Received and not finalized.
	for after := uint64(0); ; {
		page, err := d.PendingReceivedMessages(ctx, after, MaxPageSize, nil)
		if err != nil {
			return nil, err
		}
		for _, m := range page.Messages {
			if !m.ReceivedAt.After(cutoff) {
				found = append(found, StalePending{Peer: m.Sender, ID: m.ID, Since: m.ReceivedAt, Reason: StaleUncommitted})
			}
		}
		if !page.More {
			break
		}
		after = page.Next
	}
	// Sent and not acknowledged, classified once per recipient.
	reasons := map[messages.DeviceAddress]string{}
	for after := uint64(0); ; {
		page, err := d.out.Pending(ctx, after, MaxPageSize, nil)
		if err != nil {
			return nil, err
		}
		for _, m := range page.Messages {
			if m.CreatedAt.After(cutoff) {
				continue
			}
			k := staleKey{true, m.Recipient, m.ID}
			if d.wasStale(k) {
				seen[k] = true
				continue
			}
			r, ok := reasons[m.Recipient]
			if !ok {
				if r, err = d.classifySent(ctx, m.Recipient); err != nil {
					return nil, err
				}
				reasons[m.Recipient] = r
			}
			found = append(found, StalePending{Sent: true, Peer: m.Recipient, ID: m.ID, Since: m.CreatedAt, Reason: r})
		}
		if !page.More {
			break
		}
		after = page.Next
	}
	var out []StalePending
	for _, s := range found {
		k := staleKey{s.Sent, s.Peer, s.ID}
		seen[k] = true
		if d.wasStale(k) {
			continue
		}
		out = append(out, s)
	}
	// Re-initiate (Retry only) once per recipient, then resend what is
	// pending for it that is stale.
	if d.cfg.Retry.Enabled() {
		reset := map[messages.DeviceAddress]error{}
		for i, s := range out {
			if !s.Sent || s.Reason != StaleUnansweredInitiation {
				continue
			}
			err, done := reset[s.Peer]
			if !done {
				err = d.sessions.ResetSession(ctx, s.Peer)
				reset[s.Peer] = err
			}
			if err == nil {
				err = d.Resend(ctx, s.Peer, s.ID)
			}
			if err != nil && !errors.Is(err, outbound.ErrNotPending) {
				d.cfg.Logger.Warn("device: re-initiation failed", "to", s.Peer.String(), "id", s.ID.String(), "err", err)
				continue
			}
			out[i].Reinitiated = err == nil
		}
	}
	d.staleMu.Lock()
	for k := range d.stale {
		if !seen[k] {
			delete(d.stale, k) // no longer pending: a later one is new
		}
	}
	for _, s := range out {
		d.stale[staleKey{s.Sent, s.Peer, s.ID}] = true
	}
	d.staleMu.Unlock()
	for _, s := range out {
		side := "received"
		if s.Sent {
			side = "sent"
		}
		d.metrics.stale.WithLabelValues(side, s.Reason).Inc()
		if d.cfg.OnStale != nil {
			d.cfg.OnStale(s)
		}
	}
	return out, nil
}

func (d *Device) wasStale(k staleKey) bool {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	return d.stale[k]
}

// classifySent says why messages to peer stay unacknowledged: an
// unanswered initiation of ours, a reinstalled peer (its bundle names
// another identity than the pin; fetched once per recipient and pass, only
// for a stale message), or nothing known.
func (d *Device) classifySent(ctx context.Context, peer messages.DeviceAddress) (string, error) {
	var rec []byte
	var pin messages.IdentityKey
	var hasRec, pinned bool
	if err := d.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		if rec, hasRec, err = r.Session(peer); err != nil {
			return err
		}
		pin, pinned, err = r.Pin(peer)
		return err
	}); err != nil {
		return "", fmt.Errorf("device: check pending: %w", err)
	}
	if hasRec {
		state, err := ratchet.UnmarshalState(rec)
		if err != nil {
			return "", fmt.Errorf("device: check pending: session of %s: %w: %w", peer, persistence.ErrCorrupt, err)
		}
		if cur, ok := state.Current(); ok && cur.Initiator && !cur.Acknowledged {
			return StaleUnansweredInitiation, nil
		}
	}
	if pinned {
		if b, err := d.cfg.Transport.FetchBundle(ctx, peer); err == nil && b.Identity != pin {
			return StalePeerIdentityChanged, nil
		}
	}
	return StaleUnacknowledged, nil
}

// armStale runs CheckPending after interval, and again after each
// interval until Close: a timer, not a goroutine per device (an idle
// device costs none).
func (d *Device) armStale(interval time.Duration) {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	if d.isClosed() {
		return
	}
	d.staleTimer = time.AfterFunc(interval, func() {
		// Counted in loops under staleMu: Close, having marked the
		// device closed, takes staleMu (stopStale) before it waits.
		d.staleMu.Lock()
		if d.isClosed() {
			d.staleMu.Unlock()
			return
		}
		d.loops.Add(1)
		d.staleMu.Unlock()
		defer d.loops.Done()
		if _, err := d.CheckPending(d.ctx); err != nil && !errors.Is(err, ErrClosed) && d.ctx.Err() == nil {
			d.cfg.Logger.Warn("device: pending check failed", "err", err)
		}
		d.armStale(interval)
	})
}

func (d *Device) stopStale() {
	d.staleMu.Lock()
	defer d.staleMu.Unlock()
	if d.staleTimer != nil {
		d.staleTimer.Stop()
	}
}
