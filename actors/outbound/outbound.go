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
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
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
	// MaxAttempts caps the tries, the first send included (0: no cap):
	// every try counts, also one that failed before its encryption was
	// stored (a bundle request or hand-off that failed or timed out). A
	// message at the cap stays pending (only the ACK or Abandon removes
	// it) and is reported once to Config.OnExhausted.
	MaxAttempts int
	// Jitter (0..1) shortens each delay by up to that fraction, drawn per
	// message and attempt (from its recipient, id and attempt count, so a
	// pass that looks again draws the same): the copies of a burst come
	// due spread out instead of all at once. 0: no jitter.
	Jitter float64
	// HeldInterval is how long after its last attempt (or the receiver's
	// held receipt, if later) a message the receiver holds pending its
	// application's commit is sent again: a safety net, since the
	// receipt says the ACK will come once the application commits
	// (docs/protocol.md, "Held receipt"). 0: DefaultHeldInterval.
	HeldInterval time.Duration
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

// DelayOf returns how long after its last attempt m is due again after
// attempts tries: Delay(attempts) shortened by the jitter drawn for m.
func (p RetryPolicy) DelayOf(to messages.DeviceAddress, id messages.LogicalMessageID, attempts int) time.Duration {
	d := p.Delay(attempts)
	if p.Jitter <= 0 {
		return d
	}
	h := fnv.New64a()
	h.Write([]byte(to.User))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(to.Device))
	h.Write(b[:])
	h.Write(id[:])
	binary.BigEndian.PutUint64(b[:], uint64(attempts))
	h.Write(b[:])
	u := float64(h.Sum64()>>11) / float64(1<<53) // [0, 1)
	return d - time.Duration(float64(d)*min(p.Jitter, 1)*u)
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
// schedule: its passes run on a timer that Wake arms (the owner calls it
// once opened, and whenever messages are pending) and that a pass re-arms
// while messages remain pending. Safe for concurrent use.
type Outbox struct {
	cfg Config

	mu        sync.Mutex
	closed    bool
	ctx       context.Context // cancelled by Close: ends the passes' resends
	cancel    context.CancelFunc
	timer     *time.Timer // the next pass, armed only while messages are pending
	armed     bool
	loop      sync.WaitGroup // passes started by the timer
	exhausted map[msgKey]bool
	// busy marks the recipients whose resends run now: a pass skips
	// them, so a recipient that does not answer holds only its own
	// worker, never the schedule of the others.
	busy    map[messages.DeviceAddress]bool
	workers sync.WaitGroup
	// tries are the failed tries the store did not record (the resend
	// failed before its transaction): they count as attempts.
	tries map[msgKey]failedTries
	// held maps the messages whose receiver sent a held receipt to when
	// the last one arrived (held.go).
	held map[msgKey]time.Time
}

// failedTries is what a message's failed, unrecorded tries add to its
// stored attempts.
type failedTries struct {
	n    int
	last time.Time
}

// TryTimeout bounds one scheduled resend (a bundle request or hand-off
// to a host that accepts connections and never answers): past it the
// try counts as a failed attempt and the recipient's next due message
// goes on.
const TryTimeout = 30 * time.Second

type msgKey struct {
	to messages.DeviceAddress
	id messages.LogicalMessageID
}

// New returns the Outbox; its retry schedule runs once Wake was called.
func New(cfg Config) (*Outbox, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	}
	if cfg.Retry.Interval < 0 || cfg.Retry.MaxAttempts < 0 || cfg.Retry.MaxInterval < 0 || cfg.Retry.Backoff < 0 || cfg.Retry.HeldInterval < 0 {
		return nil, fmt.Errorf("%w: negative retry policy field", ErrInvalidConfig)
	}
	if cfg.Retry.Jitter < 0 || cfg.Retry.Jitter > 1 {
		return nil, fmt.Errorf("%w: retry jitter %v outside 0..1", ErrInvalidConfig, cfg.Retry.Jitter)
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
	o := &Outbox{cfg: cfg, exhausted: make(map[msgKey]bool),
		busy: map[messages.DeviceAddress]bool{}, tries: map[msgKey]failedTries{}, held: map[msgKey]time.Time{}}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	return o, nil
}

// Wake arms the retry schedule's next pass, Interval from now, unless one
// is armed already: the owner calls it when messages are pending. The
// schedule runs on a timer only while messages are pending, so an idle
// Outbox holds no goroutine.
func (o *Outbox) Wake() {
	if !o.cfg.Retry.Enabled() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.armed {
		return
	}
	o.armed = true
	if o.timer == nil {
		o.timer = time.AfterFunc(o.cfg.Retry.Interval, o.tick)
	} else {
		o.timer.Reset(o.cfg.Retry.Interval)
	}
}

// tick runs one scheduled pass (not waiting for its workers: a busy
// recipient is skipped by the next) and re-arms while messages remain
// pending.
func (o *Outbox) tick() {
	o.mu.Lock()
	o.armed = false
	if o.closed {
		o.mu.Unlock()
		return
	}
	o.loop.Add(1)
	o.mu.Unlock()
	defer o.loop.Done()
	var n atomic.Int64
	var wg sync.WaitGroup
	_, live, err := o.pass(o.ctx, &wg, &n)
	if err != nil && o.ctx.Err() == nil {
		o.cfg.Logger.Warn("outbound: retry pass failed", "err", err)
	}
	if live > 0 || err != nil {
		o.Wake()
	}
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
	if o.timer != nil {
		o.timer.Stop()
	}
	o.cancel()
	o.mu.Unlock()
	o.loop.Wait()
	o.workers.Wait()
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
	delete(o.tries, msgKey{to, id})
	delete(o.held, msgKey{to, id})
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

// RetryDue runs one pass of the retry schedule now and waits for it:
// every pending message whose delay (RetryPolicy.DelayOf) has passed and
// that is below the attempt cap is resent through Config.Resend; each one
// at the cap is reported (once per process) to Config.OnExhausted and
// returned. Recipients are resent to side by side, each one's due
// messages in order by a worker of its own (each try bounded by
// TryTimeout), so one that does not answer delays only its own messages;
// a recipient whose worker of an earlier pass still runs is skipped.
// Without a schedule it does nothing.
func (o *Outbox) RetryDue(ctx context.Context) (resent int, exhausted []SentMessage, err error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	exhausted, _, err = o.pass(ctx, &wg, &n)
	wg.Wait()
	return int(n.Load()), exhausted, err
}

// pass starts the workers of one pass (each counted in wg; each resend
// that was handed off counted in resent) and returns the messages that
// reached the cap and how many pending messages are below it.
func (o *Outbox) pass(ctx context.Context, wg *sync.WaitGroup, resent *atomic.Int64) (exhausted []SentMessage, live int, err error) {
	if err := o.checkOpen(); err != nil {
		return nil, 0, err
	}
	p := o.cfg.Retry
	if !p.Enabled() {
		return nil, 0, nil
	}
	now := o.cfg.Now()
	due := map[messages.DeviceAddress][]SentMessage{}
	var order []messages.DeviceAddress
	var after uint64
	o.mu.Lock()
	var seen map[msgKey]bool // to forget the tries and marks of messages no longer pending
	if len(o.tries) > 0 || len(o.held) > 0 {
		seen = map[msgKey]bool{}
	}
	o.mu.Unlock()
	for {
		page, err := o.Pending(ctx, after, MaxPageSize, nil)
		if err != nil {
			o.start(ctx, due, order, wg, resent)
			return exhausted, live, err
		}
		for _, m := range page.Messages {
			k := msgKey{m.Recipient, m.ID}
			if seen != nil {
				seen[k] = true
			}
			o.mu.Lock()
			busy := o.busy[m.Recipient]
			t := o.tries[k]
			heldAt := o.held[k]
			o.mu.Unlock()
			attempts, last := m.Attempts+t.n, m.LastAttemptAt
			if t.last.After(last) {
				last = t.last
			}
			if last.After(now) || heldAt.After(now) {
				// Stored by a clock later than today's: the wall clock
				// stepped back (a restart with it set back). Waiting for
				// the old clock's time would stall the message by the
				// step; it is due now, and its resend stores today's.
				last, heldAt = time.Time{}, time.Time{}
			}
			if p.MaxAttempts > 0 && attempts >= p.MaxAttempts {
				o.mu.Lock()
				first := !o.exhausted[k]
				o.exhausted[k] = true
				o.mu.Unlock()
				if first {
					m.Attempts = attempts
					exhausted = append(exhausted, m)
					if o.cfg.OnExhausted != nil {
						o.cfg.OnExhausted(m)
					}
				}
				continue
			}
			live++
			if busy || now.Before(p.NextDue(m.Recipient, m.ID, attempts, last, heldAt)) {
				continue
			}
			if due[m.Recipient] == nil {
				order = append(order, m.Recipient)
			}
			due[m.Recipient] = append(due[m.Recipient], m)
		}
		if !page.More {
			if seen != nil {
				o.mu.Lock()
				for k := range o.tries {
					if !seen[k] {
						delete(o.tries, k)
					}
				}
				for k := range o.held {
					if !seen[k] {
						delete(o.held, k)
					}
				}
				o.mu.Unlock()
			}
			o.start(ctx, due, order, wg, resent)
			return exhausted, live, nil
		}
		after = page.Next
	}
}

// start runs one worker per recipient with due messages.
func (o *Outbox) start(ctx context.Context, due map[messages.DeviceAddress][]SentMessage, order []messages.DeviceAddress, wg *sync.WaitGroup, resent *atomic.Int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	for _, to := range order {
		if o.busy[to] {
			continue
		}
		o.busy[to] = true
		o.workers.Add(1)
		wg.Add(1)
		go func(ms []SentMessage) {
			defer func() {
				o.mu.Lock()
				delete(o.busy, to)
				o.mu.Unlock()
				wg.Done()
				o.workers.Done()
			}()
			for _, m := range ms {
				if ctx.Err() != nil {
					return
				}
				handed, failed := o.try(ctx, m)
				if handed {
					resent.Add(1)
				}
				if failed {
					// The recipient is unreachable: its other due
					// messages wait for a later pass (they were not
					// tried, so they count no attempt).
					return
				}
			}
		}(due[to])
	}
}

// try resends m once (bounded by TryTimeout) and reports whether it was
// handed off, or failed. A failed try the store did not record counts as
// an attempt here.
func (o *Outbox) try(ctx context.Context, m SentMessage) (handed, failed bool) {
	k := msgKey{m.Recipient, m.ID}
	tctx, cancel := context.WithTimeout(ctx, TryTimeout)
	err := o.cfg.Resend(tctx, m)
	cancel()
	if err == nil {
		o.mu.Lock()
		delete(o.tries, k)
		o.mu.Unlock()
		return true, false
	}
	if errors.Is(err, ErrNotPending) {
		o.mu.Lock()
		delete(o.tries, k)
		o.mu.Unlock()
		return false, false
	}
	if ctx.Err() != nil {
		return false, true
	}
	o.cfg.Logger.Warn("outbound: scheduled resend failed", "to", m.Recipient.String(), "id", m.ID.String(), "err", err)
	// A resend that failed after its transaction (the hand-off) recorded
	// its attempt in the store; one that failed before did not.
	cur, ok, gerr := o.Get(ctx, m.Recipient, m.ID)
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case gerr == nil && !ok:
		delete(o.tries, k)
	case gerr == nil && cur.Attempts > m.Attempts:
		// Recorded by the store.
	default:
		t := o.tries[k]
		o.tries[k] = failedTries{n: t.n + 1, last: o.cfg.Now()}
	}
	return false, true
}
