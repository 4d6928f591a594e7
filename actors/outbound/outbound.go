// Package outbound reads the delivery plane's pending outbound messages: a
// sent application message is stored (durably, in the transaction of its
// encryption, before it is handed to the transport) and stays pending until
// the recipient's ACK clears it or the application abandons it.
//
// Every write of a recipient's rows is decided by that recipient's peer
// actor (actors/session) and run by the store's committer; this package
// only reads them through read transactions. An opt-in retry schedule
// (RetryPolicy, off by default: the spec has no automatic retry) resends
// due messages with backoff and reports the ones that reached the attempt
// cap.
package outbound

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxPageSize is the largest page of pending sent messages (as inbound).
const MaxPageSize = 100

// RetryPolicy is the opt-in retry schedule. The zero value is off.
type RetryPolicy struct {
	// Interval is how long after an attempt the first retry is due, and
	// how often the schedule looks for due messages; 0: off.
	Interval time.Duration
	// Backoff multiplies the delay after each attempt (≥ 1; 0: 2).
	Backoff float64
	// MaxInterval caps the delay (0: no cap).
	MaxInterval time.Duration
	// MaxAttempts caps the hand-offs, the first send included (0: no
	// cap). A message at the cap stays pending (only the ACK or Abandon
	// removes it) and is reported once to Config.OnExhausted.
	MaxAttempts int
}

// Enabled reports whether the schedule runs.
func (p RetryPolicy) Enabled() bool { return p.Interval > 0 }

// Delay returns how long after its last attempt a message that was
// handed off attempts times is due again: Interval·Backoff^(attempts−1),
// capped at MaxInterval.
func (p RetryPolicy) Delay(attempts int) time.Duration {
	b := p.Backoff
	if b < 1 {
		b = 2
	}
	if attempts < 1 {
		attempts = 1
	}
	d := float64(p.Interval) * math.Pow(b, float64(attempts-1))
	out := time.Duration(math.MaxInt64)
	if d < float64(math.MaxInt64) {
		out = time.Duration(d)
	}
	if p.MaxInterval > 0 && out > p.MaxInterval {
		out = p.MaxInterval
	}
	return out
}

// SentMessage is a pending outbound message.
type SentMessage struct {
	Recipient     messages.DeviceAddress
	ID            messages.LogicalMessageID
	Sequence      uint64
	CreatedAt     time.Time
	Attempts      int
	LastAttemptAt time.Time
	// Body is a copy the caller owns.
	Body []byte
}

// SentPage is one page of pending outbound messages in send order; Next
// is the cursor of the following page, More whether more follow.
type SentPage struct {
	Messages []SentMessage
	Next     uint64
	More     bool
}

// FromStored is the SentMessage of a stored pending outbound row (the
// body copied).
func FromStored(p persistence.PendingOutbound) SentMessage {
	m := SentMessage{Recipient: p.Recipient, ID: p.ID, Sequence: p.Sequence, CreatedAt: time.UnixMilli(p.CreatedAt),
		Attempts: int(p.Attempts), Body: bytes.Clone(p.Body)}
	if m.Body == nil {
		m.Body = []byte{}
	}
	if p.Attempts > 0 {
		m.LastAttemptAt = time.UnixMilli(p.LastAttemptAt)
	}
	return m
}

// Config configures an Outbox. Store is required; Resend is required when
// Retry is enabled.
type Config struct {
	// Store is read (View) for pages, counts and the retry schedule; the
	// Outbox never writes it: the pending rows are written by the session
	// layer's committer, in the transaction of the encryption.
	Store persistence.DeliveryStore
	// Now is the client clock; nil: time.Now.
	Now func() time.Time
	// Retry is the opt-in retry schedule (zero: off).
	Retry RetryPolicy
	// Resend re-sends one due message (a fresh encryption); called by the
	// schedule.
	Resend func(ctx context.Context, m SentMessage) error
	// OnExhausted is told once per process about each message that
	// reached Retry.MaxAttempts.
	OnExhausted func(m SentMessage)
	// Logger; nil discards.
	Logger *slog.Logger
}

// Outbox reads the pending outbound messages and runs the opt-in retry
// schedule; safe for concurrent use.
type Outbox struct {
	cfg Config

	mu        sync.Mutex
	closed    bool
	stop      chan struct{}
	loop      sync.WaitGroup
	exhausted map[msgKey]bool
}

type msgKey struct {
	to messages.DeviceAddress
	id messages.LogicalMessageID
}

// New returns the Outbox (and starts the retry schedule when enabled).
func New(cfg Config) (*Outbox, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	}
	if cfg.Retry.Interval < 0 || cfg.Retry.MaxAttempts < 0 || cfg.Retry.MaxInterval < 0 || cfg.Retry.Backoff < 0 {
		return nil, fmt.Errorf("%w: negative retry policy field", ErrInvalidConfig)
	}
	if cfg.Retry.Enabled() && cfg.Resend == nil {
		return nil, fmt.Errorf("%w: a retry schedule needs Resend", ErrInvalidConfig)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	o := &Outbox{cfg: cfg, stop: make(chan struct{}), exhausted: make(map[msgKey]bool)}
	if cfg.Retry.Enabled() {
		o.loop.Add(1)
		go o.retryLoop()
	}
	return o, nil
}

// Close stops the schedule. It does not close the store. Other calls
// after Close return ErrClosed; Close itself is idempotent (a second call
// returns nil).
func (o *Outbox) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.closed = true
	close(o.stop)
	o.mu.Unlock()
	o.loop.Wait()
	return nil
}

// checkOpen returns ErrClosed once Close was called.
func (o *Outbox) checkOpen() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return ErrClosed
	}
	return nil
}

// Forget drops what the schedule remembers about (to, id) (it was
// abandoned: a later message under the same id is reported again).
func (o *Outbox) Forget(to messages.DeviceAddress, id messages.LogicalMessageID) {
	o.mu.Lock()
	delete(o.exhausted, msgKey{to, id})
	o.mu.Unlock()
}

// Get returns one pending message.
func (o *Outbox) Get(ctx context.Context, to messages.DeviceAddress, id messages.LogicalMessageID) (SentMessage, bool, error) {
	if err := o.checkOpen(); err != nil {
		return SentMessage{}, false, err
	}
	var out persistence.PendingOutbound
	var ok bool
	err := o.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		out, ok, err = r.PendingOutbound(to, id)
		return err
	})
	if err != nil || !ok {
		return SentMessage{}, false, err
	}
	return FromStored(out), true, nil
}

// Pending returns up to limit (1..MaxPageSize) pending messages sent after
// cursor after (0: from the first), of *recipient when not nil.
func (o *Outbox) Pending(ctx context.Context, after uint64, limit int, recipient *messages.DeviceAddress) (SentPage, error) {
	if err := o.checkOpen(); err != nil {
		return SentPage{}, err
	}
	if limit < 1 || limit > MaxPageSize {
		return SentPage{}, fmt.Errorf("%w: %d (1..%d)", ErrInvalidLimit, limit, MaxPageSize)
	}
	page := SentPage{Next: after}
	err := o.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		return r.PendingOutboundAfter(after, recipient, func(p persistence.PendingOutbound) (bool, error) {
			if len(page.Messages) == limit {
				page.More = true
				return false, nil
			}
			page.Messages = append(page.Messages, FromStored(p))
			page.Next = p.Sequence
			return true, nil
		})
	})
	if err != nil {
		return SentPage{}, fmt.Errorf("outbound: pending: %w", err)
	}
	return page, nil
}

// Count returns how many messages are pending.
func (o *Outbox) Count(ctx context.Context) (int, error) {
	if err := o.checkOpen(); err != nil {
		return 0, err
	}
	var n int
	err := o.cfg.Store.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		n, err = r.PendingOutboundCount()
		return err
	})
	return n, err
}

// RetryDue runs one pass of the retry schedule now: every pending message
// whose delay (RetryPolicy.Delay) has passed and that is below the attempt
// cap is resent through Config.Resend; each one at the cap is reported
// (once per process) to Config.OnExhausted and returned. It is what the
// schedule runs every Interval; without a schedule it does nothing.
func (o *Outbox) RetryDue(ctx context.Context) (resent int, exhausted []SentMessage, err error) {
	if err := o.checkOpen(); err != nil {
		return 0, nil, err
	}
	p := o.cfg.Retry
	if !p.Enabled() {
		return 0, nil, nil
	}
	now := o.cfg.Now()
	var after uint64
	for {
		page, err := o.Pending(ctx, after, MaxPageSize, nil)
		if err != nil {
			return resent, exhausted, err
		}
		for _, m := range page.Messages {
			if p.MaxAttempts > 0 && m.Attempts >= p.MaxAttempts {
				k := msgKey{m.Recipient, m.ID}
				o.mu.Lock()
				first := !o.exhausted[k]
				o.exhausted[k] = true
				o.mu.Unlock()
				if first {
					exhausted = append(exhausted, m)
					if o.cfg.OnExhausted != nil {
						o.cfg.OnExhausted(m)
					}
				}
				continue
			}
			if now.Before(m.LastAttemptAt.Add(p.Delay(m.Attempts))) {
				continue
			}
			if err := o.cfg.Resend(ctx, m); err != nil {
				if errors.Is(err, ErrNotPending) {
					continue
				}
				o.cfg.Logger.Warn("outbound: scheduled resend failed", "to", m.Recipient.String(), "id", m.ID.String(), "err", err)
				continue
			}
			resent++
		}
		if !page.More {
			return resent, exhausted, nil
		}
		after = page.Next
	}
}

func (o *Outbox) retryLoop() {
	defer o.loop.Done()
	t := time.NewTicker(o.cfg.Retry.Interval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-o.stop
		cancel()
	}()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
			if _, _, err := o.RetryDue(ctx); err != nil && ctx.Err() == nil {
				o.cfg.Logger.Warn("outbound: retry pass failed", "err", err)
			}
		}
	}
}
