// Package inbound is the delivery plane's inbound store: the commit
// boundary (docs/protocol.md). A received message stays pending
// (sealed frame, persistent sequence, receive time) until the application
// commits or discards it; only then is it acknowledged; processed ids are
// kept for duplicate suppression until the application prunes them.
//
// The Store is an actor (docs/architecture.md, "Actor topology": inbound actor):
// receives, commits, discards, pages, counts and prunes of the node go
// through its mailbox, so duplicate receives and racing commits converge
// because the mailbox orders them. It group-commits: it drains the
// requests queued in its mailbox into one persistence.DeliveryTx (one
// bbolt transaction, one fsync) and replies to each only after that
// transaction is durable. The decisions themselves are the pure functions
// of core.go.
package inbound

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxPageSize is the largest page of pending messages
// (docs/protocol.md, commit boundary: PendingReceivedMessagePage.MAX_SIZE = 100).
const MaxPageSize = 100

// DefaultMaxBatch is the default Config.MaxBatch.
const DefaultMaxBatch = 256

// Step is the ratchet step of a received envelope, persisted inside the
// receive transaction (*session.Candidate implements it). Persist writes
// it into tx; after the transaction the Store calls exactly one of
// Committed (the transaction that persisted it committed) or Abort.
type Step interface {
	Persist(tx persistence.DeliveryTx) error
	Committed()
	Abort()
}

// Stats is reported to Config.Observe after every committed batch.
type Stats struct {
	// PendingInbound and PendingOutbound are the counts after the batch.
	PendingInbound, PendingOutbound int
	// Committed, Discarded, Pruned, Cleared count what the batch did:
	// new commits, new discards, pruned processed entries, outbound
	// messages cleared by an ACK.
	Committed, Discarded, Pruned, Cleared int
}

// Config configures a Store. Store is required.
type Config struct {
	// Store is the delivery store (the Store does not close it).
	Store persistence.DeliveryStore
	// Now is the client wall clock; nil: time.Now.
	Now func() time.Time
	// MaxPendingPerSender caps the pending messages of one sender; a new
	// message past it is refused with ErrSenderBacklogFull before its
	// ratchet step is persisted. 0: no cap (the spec's behaviour).
	MaxPendingPerSender int
	// MaxBatch bounds the requests of one group commit; 0: DefaultMaxBatch.
	MaxBatch int
	// Observe, when set, receives the Stats of each committed batch (from
	// the actor: it must not block).
	Observe func(Stats)
	// Logger; nil discards.
	Logger *slog.Logger
	// Mailboxes measures the store actor's mailbox (nil: not measured).
	Mailboxes *mailbox.Depths
}

// ReceivedMessage is a message delivered to the application: pending
// until committed or discarded. Sequence and ReceivedAt are the same on
// every redelivery; Plaintext is a copy the caller owns.
type ReceivedMessage struct {
	Sender     messages.DeviceAddress
	ID         messages.LogicalMessageID
	Sequence   uint64
	ReceivedAt time.Time
	Plaintext  []byte
}

// ReceiveResult is the outcome of one received frame: Delivery (Message
// set; New on first acceptance), AlreadyCommitted or AlreadyDiscarded
// (AckDue: the caller must send the ACK again), or Acknowledgement
// (Cleared: a pending outbound message was cleared).
type ReceiveResult struct {
	Outcome Outcome
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	Message *ReceivedMessage
	New     bool
	Cleared bool
	AckDue  bool
}

// FinalizeResult is the outcome of a commit or discard: COMMITTED,
// DISCARDED, ALREADY_COMMITTED or ALREADY_DISCARDED. AckDue is always true:
// the caller encrypts the ACK and hands it to the transport after the
// transaction.
type FinalizeResult struct {
	Outcome Outcome
	Sender  messages.DeviceAddress
	ID      messages.LogicalMessageID
	AckDue  bool
}

// Page is one page of pending messages in sequence order. Next is the
// cursor for the following page (the last sequence seen; the request's
// cursor when the page is empty); More reports whether more messages
// follow.
type Page struct {
	Messages []ReceivedMessage
	Next     uint64
	More     bool
}

// Store is the inbound store actor's handle. Its methods are safe for
// concurrent use and honour their context (a request whose context ended
// before the actor reached it is skipped; one already in a transaction
// completes, and its caller gets ctx.Err()).
type Store struct {
	cfg Config
	sys *actor.ActorSystem
	pid *actor.PID

	mu     sync.Mutex
	closed bool
}

// New starts the inbound store actor on sys.
func New(sys *actor.ActorSystem, cfg Config) (*Store, error) {
	if sys == nil || cfg.Store == nil {
		return nil, fmt.Errorf("%w: actor system and Store are required", ErrInvalidConfig)
	}
	if cfg.MaxPendingPerSender < 0 {
		return nil, fmt.Errorf("%w: MaxPendingPerSender %d", ErrInvalidConfig, cfg.MaxPendingPerSender)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, sys: sys}
	s.pid = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &storeActor{s: s} }, cfg.Mailboxes.Option("inbound")))
	return s, nil
}

// Close stops the actor after the requests already queued were committed
// and answered. It does not close the persistence store. Calls after Close
// return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	return s.sys.Root.PoisonFuture(s.pid).Wait()
}

type reqKind uint8

const (
	kindReceive reqKind = iota + 1
	kindFinalize
	kindPage
	kindCount
	kindPrune
)

type request struct {
	kind reqKind
	ctx  context.Context

	sender  messages.DeviceAddress
	id      messages.LogicalMessageID
	payload *messages.SecurePayload
	frame   []byte
	step    Step

	fin    persistence.Finalization
	reason persistence.DiscardReason

	after  uint64
	limit  int
	filter *messages.DeviceAddress

	policy RetentionPolicy

	reply chan response
}

type response struct {
	recv   ReceiveResult
	fin    FinalizeResult
	page   Page
	n      int
	err    error
	commit bool // the step was persisted in the committed transaction
	stats  Stats
}

func (s *Store) call(r *request) (response, error) {
	if err := r.ctx.Err(); err != nil {
		if r.step != nil {
			r.step.Abort()
		}
		return response{}, err
	}
	r.reply = make(chan response, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if r.step != nil {
			r.step.Abort()
		}
		return response{}, ErrClosed
	}
	s.sys.Root.Send(s.pid, r)
	s.mu.Unlock()
	select {
	case res := <-r.reply:
		return res, res.err
	case <-r.ctx.Done():
		return response{}, r.ctx.Err()
	}
}

// Receive runs the receive transaction for one decrypted frame from
// sender (docs/protocol.md, commit boundary, "Transactions", Receive): the decision
// of DecideReceive (or DecideAck for an ACK frame), the ratchet step and
// the pending row in ONE transaction. frame is the encoded payload (stored
// as the pending frame). The Store releases step (Committed or Abort) in
// every case, errors included. Delivery is returned only after the commit;
// it never ACKs by itself (AckDue tells the caller to).
func (s *Store) Receive(ctx context.Context, sender messages.DeviceAddress, payload *messages.SecurePayload, frame []byte, step Step) (ReceiveResult, error) {
	if payload == nil || (payload.Type != messages.PayloadApplicationMessage && payload.Type != messages.PayloadAck) {
		if step != nil {
			step.Abort()
		}
		return ReceiveResult{}, ErrNotApplicationMessage
	}
	if err := sender.Validate(); err != nil {
		if step != nil {
			step.Abort()
		}
		return ReceiveResult{}, fmt.Errorf("inbound: receive: %w", err)
	}
	res, err := s.call(&request{kind: kindReceive, ctx: ctx, sender: sender, id: payload.ID, payload: payload, frame: frame, step: step})
	return res.recv, err
}

// Commit finalizes a pending message as committed (commitReceivedMessage):
// COMMITTED, or ALREADY_COMMITTED / ALREADY_DISCARDED when it was
// finalized before; ErrReceivedMessageNotPending when it is neither.
// Authorization is (sender, id): no plaintext is an input.
func (s *Store) Commit(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID) (FinalizeResult, error) {
	return s.finalize(ctx, sender, id, persistence.FinalizationCommitted, 0)
}

// Discard finalizes a pending message as discarded with reason (stored
// with the entry, readable locally, never sent): DISCARDED, or
// ALREADY_DISCARDED / ALREADY_COMMITTED; ErrReceivedMessageNotPending when
// it is neither pending nor finalized; ErrInvalidDiscardReason for a
// reason outside the closed set.
func (s *Store) Discard(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID, reason persistence.DiscardReason) (FinalizeResult, error) {
	if !reason.Valid() {
		return FinalizeResult{}, fmt.Errorf("%w: %s", ErrInvalidDiscardReason, reason)
	}
	return s.finalize(ctx, sender, id, persistence.FinalizationDiscarded, reason)
}

func (s *Store) finalize(ctx context.Context, sender messages.DeviceAddress, id messages.LogicalMessageID, f persistence.Finalization, reason persistence.DiscardReason) (FinalizeResult, error) {
	if err := sender.Validate(); err != nil {
		return FinalizeResult{}, fmt.Errorf("inbound: finalize: %w", err)
	}
	res, err := s.call(&request{kind: kindFinalize, ctx: ctx, sender: sender, id: id, fin: f, reason: reason})
	return res.fin, err
}

// Pending returns up to limit (1..MaxPageSize) pending messages with a
// sequence greater than after (0: from the first), in sequence order, only
// those of *sender when sender is not nil.
func (s *Store) Pending(ctx context.Context, after uint64, limit int, sender *messages.DeviceAddress) (Page, error) {
	if limit < 1 || limit > MaxPageSize {
		return Page{}, fmt.Errorf("%w: %d (1..%d)", ErrInvalidLimit, limit, MaxPageSize)
	}
	if sender != nil {
		if err := sender.Validate(); err != nil {
			return Page{}, fmt.Errorf("inbound: pending: %w", err)
		}
		c := *sender
		sender = &c
	}
	res, err := s.call(&request{kind: kindPage, ctx: ctx, after: after, limit: limit, filter: sender})
	return res.page, err
}

// PendingCount returns how many messages are pending (of *sender when
// sender is not nil).
func (s *Store) PendingCount(ctx context.Context, sender *messages.DeviceAddress) (int, error) {
	if sender != nil {
		if err := sender.Validate(); err != nil {
			return 0, fmt.Errorf("inbound: pending count: %w", err)
		}
		c := *sender
		sender = &c
	}
	res, err := s.call(&request{kind: kindCount, ctx: ctx, filter: sender})
	return res.n, err
}

// Prune removes the processed entries older than policy allows
// (PruneCutoff) and returns how many it removed. Pending messages are
// never pruned; nothing prunes implicitly.
func (s *Store) Prune(ctx context.Context, policy RetentionPolicy) (int, error) {
	if _, _, err := PruneCutoff(0, policy); err != nil {
		return 0, err
	}
	res, err := s.call(&request{kind: kindPrune, ctx: ctx, policy: policy})
	return res.n, err
}

// storeActor is the actor: it queues requests and commits them in groups.
type storeActor struct {
	s         *Store
	batch     []*request
	scheduled bool
}

// flushMsg tells the actor to commit its batch. One queued behind a
// PoisonPill reaches a stopped actor (the batch was flushed on Stopping):
// it is not worth a dead-letter log line.
type flushMsg struct{}

// IgnoreDeadLetterLogging implements actor.IgnoreDeadLetterLogging.
func (flushMsg) IgnoreDeadLetterLogging() {}

func (a *storeActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *request:
		a.batch = append(a.batch, m)
		if len(a.batch) >= a.s.cfg.MaxBatch {
			a.flush()
		} else if !a.scheduled {
			// The flush message queues behind every request already in the
			// mailbox: the batch is what was queued when it started.
			a.scheduled = true
			c.Send(c.Self(), flushMsg{})
		}
	case flushMsg:
		a.scheduled = false
		a.flush()
	case *actor.Stopping:
		a.flush()
	}
}

// errPoisoned aborts a batch transaction after a write of one request
// failed (its partial writes must not commit).
var errPoisoned = errors.New("inbound: batch item failed after writing")

// flush runs the queued requests in one transaction. A request whose
// writes fail is answered with its error and the transaction is retried
// without it; a failed commit fails every request of the batch.
func (a *storeActor) flush() {
	live := a.batch
	a.batch = nil
	for len(live) > 0 {
		outs := make([]response, len(live))
		poisoned := -1
		var stats Stats
		err := a.s.cfg.Store.Update(context.Background(), func(tx persistence.DeliveryTx) error {
			stats = Stats{}
			for i, r := range live {
				outs[i] = response{}
				if err := r.ctx.Err(); err != nil {
					outs[i].err = err
					continue
				}
				if fatal := a.apply(tx, r, &outs[i], &stats); fatal != nil {
					poisoned = i
					outs[i] = response{err: fatal}
					return errPoisoned
				}
			}
			var err error
			if stats.PendingInbound, err = tx.PendingInboundCount(nil); err != nil {
				return err
			}
			stats.PendingOutbound, err = tx.PendingOutboundCount()
			return err
		})
		if err == nil {
			// Observe first, so a caller that got its reply sees the
			// batch in the metrics.
			if a.s.cfg.Observe != nil {
				a.s.cfg.Observe(stats)
			}
			for i, r := range live {
				a.answer(r, outs[i])
			}
			return
		}
		if poisoned >= 0 && errors.Is(err, errPoisoned) {
			a.answer(live[poisoned], outs[poisoned])
			live = append(live[:poisoned:poisoned], live[poisoned+1:]...)
			continue
		}
		a.s.cfg.Logger.Warn("inbound: batch commit failed", "requests", len(live), "err", err)
		for _, r := range live {
			a.answer(r, response{err: fmt.Errorf("inbound: commit: %w", err)})
		}
		return
	}
}

// answer releases the request's ratchet step and replies.
func (a *storeActor) answer(r *request, res response) {
	if r.step != nil {
		if res.commit && res.err == nil {
			r.step.Committed()
		} else {
			r.step.Abort()
		}
	}
	r.reply <- res
}

// apply runs one request inside tx. A decision error or a failed read is
// the request's own result (nothing was written); the returned error means
// a write failed and the transaction must not commit.
func (a *storeActor) apply(tx persistence.DeliveryTx, r *request, out *response, stats *Stats) error {
	switch r.kind {
	case kindReceive:
		return a.applyReceive(tx, r, out, stats)
	case kindFinalize:
		return a.applyFinalize(tx, r, out, stats)
	case kindPage:
		out.page, out.err = readPage(tx, r.after, r.limit, r.filter)
	case kindCount:
		out.n, out.err = tx.PendingInboundCount(r.filter)
	case kindPrune:
		cutoff, prune, err := PruneCutoff(persistence.UnixMilli(a.s.cfg.Now()), r.policy)
		if err != nil || !prune {
			out.err = err
			return nil
		}
		n, err := tx.PruneProcessedInbound(cutoff)
		if err != nil {
			return err
		}
		out.n = n
		stats.Pruned += n
	}
	return nil
}

// readState reads what the store holds for (sender, id).
func readState(tx persistence.DeliveryReader, sender messages.DeviceAddress, id messages.LogicalMessageID) (State, error) {
	var st State
	pr, ok, err := tx.ProcessedInbound(sender, id)
	if err != nil {
		return st, err
	}
	if ok {
		st.Processed = &pr
	}
	p, ok, err := tx.PendingInbound(sender, id)
	if err != nil {
		return st, err
	}
	if ok {
		st.Pending = &p
	}
	return st, nil
}

func (a *storeActor) applyReceive(tx persistence.DeliveryTx, r *request, out *response, stats *Stats) error {
	out.recv = ReceiveResult{Sender: r.sender, ID: r.id}
	if r.payload.Type == messages.PayloadAck {
		_, has, err := tx.PendingOutbound(r.sender, r.id)
		if err != nil {
			out.err = err
			return nil
		}
		d := DecideAck(has)
		if r.step != nil {
			if err := r.step.Persist(tx); err != nil {
				return err
			}
		}
		if d.Effects.DeleteOutbound {
			if _, err := tx.DeletePendingOutbound(r.sender, r.id); err != nil {
				return err
			}
			stats.Cleared++
		}
		out.commit = true
		out.recv.Outcome, out.recv.Cleared = d.Outcome, d.Cleared
		return nil
	}
	st, err := readState(tx, r.sender, r.id)
	if err != nil {
		out.err = err
		return nil
	}
	cap := a.s.cfg.MaxPendingPerSender
	if cap > 0 && st.Pending == nil && st.Processed == nil {
		if st.SenderPending, err = tx.PendingInboundCount(&r.sender); err != nil {
			out.err = err
			return nil
		}
	}
	d := DecideReceive(st, ReceiveInput{Sender: r.sender, ID: r.id, Body: r.payload.Body, Frame: r.frame,
		Now: persistence.UnixMilli(a.s.cfg.Now()), MaxPendingPerSender: cap})
	if d.Err != nil {
		out.err = d.Err
		return nil
	}
	if d.Effects.PersistStep && r.step != nil {
		if err := r.step.Persist(tx); err != nil {
			return err
		}
	}
	p := d.Pending
	if d.Effects.PutPending != nil {
		seq, err := tx.PutPendingInbound(*d.Effects.PutPending)
		if err != nil {
			return err
		}
		np := *d.Effects.PutPending
		np.Sequence = seq
		p = &np
	}
	out.commit = true
	out.recv.Outcome, out.recv.New, out.recv.AckDue = d.Outcome, d.New, d.Effects.Ack
	if d.Outcome == OutcomeDelivery {
		out.recv.Message = &ReceivedMessage{Sender: r.sender, ID: r.id, Sequence: p.Sequence,
			ReceivedAt: time.UnixMilli(p.ReceivedAt), Plaintext: bytes.Clone(nonNil(d.Plaintext))}
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (a *storeActor) applyFinalize(tx persistence.DeliveryTx, r *request, out *response, stats *Stats) error {
	out.fin = FinalizeResult{Sender: r.sender, ID: r.id}
	st, err := readState(tx, r.sender, r.id)
	if err != nil {
		out.err = err
		return nil
	}
	d := DecideFinalize(st, FinalizeInput{Sender: r.sender, ID: r.id, Finalization: r.fin, Reason: r.reason,
		Now: persistence.UnixMilli(a.s.cfg.Now())})
	if d.Err != nil {
		out.err = d.Err
		return nil
	}
	if d.Effects.DeletePending {
		if _, err := tx.DeletePendingInbound(r.sender, r.id); err != nil {
			return err
		}
	}
	if d.Effects.PutProcessed != nil {
		if err := tx.PutProcessedInbound(*d.Effects.PutProcessed); err != nil {
			return err
		}
	}
	switch d.Outcome {
	case OutcomeCommitted:
		stats.Committed++
	case OutcomeDiscarded:
		stats.Discarded++
	}
	out.fin.Outcome, out.fin.AckDue = d.Outcome, d.Effects.Ack
	return nil
}

// readPage reads one page (limit+1 entries to know whether more follow).
func readPage(tx persistence.DeliveryReader, after uint64, limit int, sender *messages.DeviceAddress) (Page, error) {
	page := Page{Next: after}
	err := tx.PendingInboundAfter(after, sender, func(p persistence.PendingInbound) (bool, error) {
		if len(page.Messages) == limit {
			page.More = true
			return false, nil
		}
		body, err := StoredBody(&p)
		if err != nil {
			return false, err
		}
		page.Messages = append(page.Messages, ReceivedMessage{Sender: p.Sender, ID: p.ID, Sequence: p.Sequence,
			ReceivedAt: time.UnixMilli(p.ReceivedAt), Plaintext: bytes.Clone(nonNil(body))})
		page.Next = p.Sequence
		return true, nil
	})
	if err != nil {
		return Page{}, err
	}
	return page, nil
}
