package session

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/idle"
	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/persistence"
)

// The committer is the delivery store's one writer (docs/architecture.md, "One writer
// per store"). Peer actors decide; the committer runs their effects: it
// drains its mailbox into ONE read-write transaction and has each item's
// done called only after that transaction is durable (or failed), so
// concurrent peers and consecutive operations of one peer share an fsync.
// It never decides anything and never blocks on another actor.
//
// The dones run on the committer's replier (a goroutine of a pool shared
// by the process, only while answers are queued), in commit order,
// while the committer goes on with its next transaction: what the answers
// set off (the hand-off of envelopes and ACKs, deliveries, the callers'
// next requests) no longer waits behind them, and the next transaction no
// longer waits for them (they were about 7 % of the committer's time at
// 64 messages in flight).

// DefaultMaxBatch is the default Config.MaxBatch.
const DefaultMaxBatch = 256

// item is one unit of work for the committer: the writes of one decision.
type item struct {
	// chain links the items of one peer actor computed on top of each
	// other (nil for items that do not depend on a peer's speculative
	// state). Once one of them fails, the later ones must not be written.
	chain *chain
	// apply runs the writes inside the shared transaction. An error means
	// a write failed (storage error, or a consumed one-time prekey): the
	// transaction is retried without the item.
	apply func(tx persistence.DeliveryTx, st *Stats) error
	// writes are the peer decision's effects that apply runs (nil for
	// items of no peer): the committer drops the session record writes a
	// later item of the same transaction supersedes (supersede).
	writes *writes
	// done is called once, from the committer's replier goroutine in
	// commit order: err nil after the transaction is durable, else the
	// item's or the commit's error. It must not block (replies go to
	// buffered channels).
	done func(err error)
}

// chain is a peer actor's run of speculative items. broken is read and
// written by the committer's goroutine only.
type chain struct{ broken bool }

// Stats is reported to Config.Observe after every committed transaction.
type Stats struct {
	// PendingInbound and PendingOutbound are the counts after it.
	PendingInbound, PendingOutbound int
	// OutboundChanged reports that pending outbound rows changed; then
	// OldestOutbound is the creation time of the oldest one (zero: none).
	OutboundChanged bool
	OldestOutbound  time.Time
	// Committed, Discarded, Pruned, Cleared count what the transaction
	// did: new commits, new discards, pruned processed entries, outbound
	// messages cleared by an ACK.
	Committed, Discarded, Pruned, Cleared int
	// SkippedKeys is the number of skipped message keys the device stores
	// after it (all peers); SkippedEvicted lists the keys the device-wide
	// cap (Config.MaxSkippedKeysPerDevice) evicted in it, per peer.
	SkippedKeys    int
	SkippedEvicted []persistence.SkippedEviction
}

type committer struct {
	store    persistence.DeliveryStore
	maxBatch int
	observe  func(Stats)
	logger   interface {
		Warn(msg string, args ...any)
	}
	// maxSkipped is the device-wide cap on stored skipped keys (0: none);
	// capped reports that the last transaction evicted (one notice per
	// episode at the cap, not one per step).
	maxSkipped int
	capped     bool

	pending []*item
	queued  bool
	yielded bool

	// cache is what items keep between transactions (the manager's
	// decoded prekey store). It is dropped once the committer has had no
	// message for cacheIdle (defaultCacheIdle when zero), so an idle
	// device holds only its records.
	cache     committerCache
	cacheIdle time.Duration
	idle      *idle.Timer // built on first use (cacheIdle is set by the spawner)
	// replyQ holds the answers of each commit, in order, for the replier
	// (drainReplies), which runs on replyPool only while there are any
	// (an idle device costs no goroutine); drained, when set, is closed
	// once the queue is empty (Stopping waits for it: every caller is
	// answered before the committer stops).
	replyMu  sync.Mutex
	replyQ   [][]reply
	replying bool
	drained  chan struct{}
}

// reply is one call of an item's done.
type reply struct {
	it  *item
	err error
}

// replyPool runs the committers' repliers: its parked workers are shared
// by every Manager of the process, so a hosted device adds no goroutine.
var replyPool = mailbox.NewPool(2*runtime.GOMAXPROCS(0), 0)

// queueReplies hands one commit's answers to the replier, starting it
// when it is not running.
func (c *committer) queueReplies(out []reply) {
	c.replyMu.Lock()
	c.replyQ = append(c.replyQ, out)
	start := !c.replying
	c.replying = true
	c.replyMu.Unlock()
	if start {
		replyPool.Schedule(c.drainReplies)
	}
}

// drainReplies runs the queued answers in order until none is left.
func (c *committer) drainReplies() {
	for {
		c.replyMu.Lock()
		if len(c.replyQ) == 0 {
			c.replyQ, c.replying = nil, false
			if c.drained != nil {
				close(c.drained)
				c.drained = nil
			}
			c.replyMu.Unlock()
			return
		}
		batch := c.replyQ[0]
		c.replyQ[0] = nil
		c.replyQ = c.replyQ[1:]
		c.replyMu.Unlock()
		for _, r := range batch {
			r.it.done(r.err)
		}
	}
}

// waitReplies returns once every queued answer ran.
func (c *committer) waitReplies() {
	c.replyMu.Lock()
	if !c.replying {
		c.replyMu.Unlock()
		return
	}
	ch := make(chan struct{})
	c.drained = ch
	c.replyMu.Unlock()
	<-ch
}

// committerCache is state the committer's items keep on its goroutine
// between transactions.
type committerCache interface {
	held() bool
	drop()
}

// defaultCacheIdle is how long the committer keeps its cache without a
// message: long enough for a run of requests (a bundle flood decodes the
// prekey store once), short next to the time a device stays idle.
const defaultCacheIdle = 250 * time.Millisecond

type flushMsg struct{}

// IgnoreDeadLetterLogging implements actor.IgnoreDeadLetterLogging (a
// flush queued behind the PoisonPill reaches a stopped committer).
func (flushMsg) IgnoreDeadLetterLogging() {}

func (c *committer) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *item:
		c.pending = append(c.pending, m)
		if len(c.pending) >= c.maxBatch {
			c.commit()
		} else if !c.queued {
			c.queued = true
			ctx.Send(ctx.Self(), flushMsg{})
		}
	case flushMsg:
		if len(c.pending) == 0 {
			c.queued, c.yielded = false, false
			return
		}
		if !c.yielded {
			// Let the goroutines that are ready — other callers about to
			// hand over their items — reach the mailbox first: they land
			// ahead of the flush sent again here and join this
			// transaction (as the sync plane's committer does).
			c.yielded = true
			runtime.Gosched()
			ctx.Send(ctx.Self(), flushMsg{})
			return
		}
		c.queued, c.yielded = false, false
		c.commit()
	case *idle.Tick:
		if c.idle.Fired(ctx, m) && c.cache != nil {
			c.cache.drop()
		}
		return
	case *actor.Stopping:
		if c.idle != nil {
			c.idle.Stop()
		}
		c.commit()
		c.waitReplies()
		return
	}
	if c.cache != nil && c.cache.held() {
		// Every message restarts the idle period; the timer is armed
		// while there is something to drop.
		if c.idle == nil {
			d := c.cacheIdle
			if d <= 0 {
				d = defaultCacheIdle
			}
			c.idle = idle.New(d)
		}
		c.idle.Touch(ctx)
	}
}

// errPoisoned aborts a transaction after a write of one item failed (its
// partial writes must not commit).
var errPoisoned = errors.New("session: item failed after writing")

// errStale answers an item decided on top of a failed write.
var errStale = fmt.Errorf("%w: an earlier write of this peer failed", ErrStaleState)

// commit runs the queued items in one transaction. An item whose writes
// fail is answered with its error, its chain is broken, and the
// transaction is retried without it (and without the later items of its
// chain); a failed commit fails every item and breaks every chain.
func (c *committer) commit() {
	if len(c.pending) == 0 {
		return
	}
	out := make([]reply, 0, len(c.pending))
	c.run(&out)
	c.queueReplies(out)
}

// run commits c.pending and appends every item's answer to out.
func (c *committer) run(out *[]reply) {
	answer := func(it *item, err error) { *out = append(*out, reply{it, err}) }
	// Items of a chain broken by an earlier transaction were decided on
	// top of a failed write: refuse them.
	live := make([]*item, 0, len(c.pending))
	for _, it := range c.pending {
		if it.chain != nil && it.chain.broken {
			answer(it, errStale)
			continue
		}
		live = append(live, it)
	}
	c.pending = nil
	for len(live) > 0 {
		kept := live
		failed := -1
		var itemErr error
		var st Stats
		supersede(kept)
		err := c.store.Update(context.Background(), func(tx persistence.DeliveryTx) error {
			st = Stats{}
			for i, it := range kept {
				if err := it.apply(tx, &st); err != nil {
					failed, itemErr = i, err
					return errPoisoned
				}
			}
			if c.maxSkipped > 0 {
				// The device-wide cap, once per transaction after every
				// item's keys: the largest holders lose their oldest keys.
				ev, err := tx.EvictSkippedKeys(c.maxSkipped)
				if err != nil {
					return err
				}
				st.SkippedEvicted = ev
			}
			return readStats(tx, &st)
		})
		if err == nil {
			c.noticeSkipped(st)
			if c.observe != nil {
				c.observe(st)
			}
			for _, it := range kept {
				answer(it, nil)
			}
			return
		}
		if failed >= 0 && errors.Is(err, errPoisoned) {
			bad := kept[failed]
			if bad.chain != nil {
				bad.chain.broken = true
			}
			answer(bad, itemErr)
			// Retry without it and without the later items of its chain;
			// the earlier ones did not depend on it.
			live = append([]*item(nil), kept[:failed]...)
			for _, it := range kept[failed+1:] {
				if bad.chain != nil && it.chain == bad.chain {
					answer(it, errStale)
					continue
				}
				live = append(live, it)
			}
			continue
		}
		c.logger.Warn("session: delivery commit failed", "items", len(kept), "err", err)
		for _, it := range kept {
			if it.chain != nil {
				it.chain.broken = true
			}
		}
		for _, it := range kept {
			answer(it, fmt.Errorf("session: commit: %w", err))
		}
		return
	}
}

// noticeSkipped logs the device-wide skipped-key cap once per episode: when
// a transaction first evicts, naming the peers that lost keys (they hold
// the most, so a flooding peer names itself), and again only after a
// transaction ended under the cap.
func (c *committer) noticeSkipped(st Stats) {
	if len(st.SkippedEvicted) == 0 {
		if st.SkippedKeys < c.maxSkipped {
			c.capped = false
		}
		return
	}
	if c.capped {
		return
	}
	c.capped = true
	args := []any{"limit", c.maxSkipped}
	for _, e := range st.SkippedEvicted {
		args = append(args, e.Peer.String(), e.Count)
	}
	c.logger.Warn("session: device-wide skipped key cap reached; the largest holders' oldest keys were evicted", args...)
}

func readStats(tx persistence.DeliveryTx, st *Stats) error {
	var err error
	if st.SkippedKeys, err = tx.SkippedKeyCount(nil); err != nil {
		return err
	}
	if st.PendingInbound, err = tx.PendingInboundCount(nil); err != nil {
		return err
	}
	if st.PendingOutbound, err = tx.PendingOutboundCount(); err != nil {
		return err
	}
	if !st.OutboundChanged || st.PendingOutbound == 0 {
		return nil
	}
	// In send order: the first is the oldest.
	return tx.PendingOutboundAfter(0, nil, func(p persistence.PendingOutbound) (bool, error) {
		st.OldestOutbound = time.UnixMilli(p.CreatedAt)
		return false, nil
	})
}
