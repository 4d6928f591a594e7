package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/histcheck"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

// Failpoints of the history client (SYNCMESH_FAILPOINT), bugs planted on
// purpose so a test can show the history checker catches them. The
// client is a router-only member: the cluster's front end, which every
// request of the test crosses.
const (
	// fpStaleRead answers every other events read of a group from the
	// first reply it got (a read served from stale state).
	fpStaleRead = "stale-read"
	// fpAckEarly acknowledges every fifth group apply without waiting
	// for (or even sending) it: an acknowledgement before the effect is
	// durable.
	fpAckEarly = "ack-early"
)

// historyClient drives operations on groups and devices and records
// each one with its call and return times and its result (histcheck.Op,
// one JSON line each).
type historyClient struct {
	o        opts
	p        hosting.Placement
	w        *scenario.Writer
	fp       string
	stop     chan struct{}
	wg       sync.WaitGroup
	ops      chan histcheck.Op
	clientID sync.Mutex
	nextID   int

	mu     sync.Mutex
	events map[string]map[messages.EventID]int // group → event id → its number
	sent   map[string]int                      // pair → messages whose send was called
	stale  map[string][]int                    // fpStaleRead: the first read of each group
}

// history is -mode history.
func history(o opts) error {
	c, prov, err := open(o, true)
	if err != nil {
		return err
	}
	defer prov.Close()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	ctx = hosting.WithPrincipal(ctx, driverTenant)
	for len(c.Members()) < o.members+o.routers {
		if ctx.Err() != nil {
			return fmt.Errorf("members: %v", c.Members())
		}
		time.Sleep(50 * time.Millisecond)
	}
	f, err := os.Create(o.out)
	if err != nil {
		return err
	}
	defer f.Close()
	h := &historyClient{o: o, p: c, fp: os.Getenv("SYNCMESH_FAILPOINT"), stop: make(chan struct{}), ops: make(chan histcheck.Op, 1024),
		events: map[string]map[messages.EventID]int{}, sent: map[string]int{}, stale: map[string][]int{}}
	if h.w, err = scenario.NewWriter(ctx, mesh); err != nil {
		return err
	}
	defer h.w.Close()
	written := make(chan struct{})
	go func() {
		enc := json.NewEncoder(f) // unbuffered: a killed test still has every line written
		for op := range h.ops {
			_ = enc.Encode(op)
		}
		close(written)
	}()

	cl := hosting.Client{P: c}
	where := map[string]string{}
	groups := make([]string, o.groups)
	for i := range groups {
		groups[i] = fmt.Sprintf("h%s%02d", o.tag, i)
		h.events[groups[i]] = map[messages.EventID]int{}
		if err := h.setup(ctx, func() error { _, err := cl.Create(ctx, hosting.KindGroup, groups[i]); return err }); err != nil {
			return err
		}
		if err := h.setup(ctx, func() error { return cl.Trust(ctx, groups[i], h.w.Key()) }); err != nil {
			return err
		}
		if err := h.setup(ctx, func() error { return cl.DefineTable(ctx, groups[i], scenario.Table) }); err != nil {
			return err
		}
		var m string
		if err := h.setup(ctx, func() (err error) { m, err = cl.Info(ctx, hosting.KindGroup, groups[i]); return err }); err != nil {
			return err
		}
		where[hosting.KindGroup+"/"+groups[i]] = m
	}
	devices := make([]messages.DeviceAddress, o.devices)
	for i := range devices {
		devices[i] = messages.DeviceAddress{User: fmt.Sprintf("h%s%02d", o.tag, i), Device: 1}
		id := hosting.DeviceIdentity(devices[i])
		if err := h.setup(ctx, func() error { _, err := cl.Create(ctx, hosting.KindDevice, id); return err }); err != nil {
			return err
		}
		var m string
		if err := h.setup(ctx, func() (err error) { m, err = cl.Info(ctx, hosting.KindDevice, id); return err }); err != nil {
			return err
		}
		where[hosting.KindDevice+"/"+id] = m
	}
	emit(Event{Ev: "ready", Where: where, At: time.Now().UnixNano()})

	for _, g := range groups {
		h.wg.Add(2)
		go h.applyLoop(ctx, h.id(), g)
		go h.readGroupLoop(ctx, h.id(), g)
	}
	for i := range devices {
		from, to := devices[i], devices[(i+1)%len(devices)]
		h.wg.Add(2)
		go h.pairLoop(ctx, h.id(), i, from, to)
		go h.readPairLoop(ctx, h.id(), from, to)
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "stop" {
			break
		}
	}
	close(h.stop)
	h.wg.Wait()
	fctx, fcancel := context.WithTimeout(ctx, o.finalTimeout)
	defer fcancel()
	h.final(fctx, groups, devices)
	close(h.ops)
	<-written
	emit(Event{Ev: "report", Report: &Report{}, At: time.Now().UnixNano()})
	return nil
}

func (h *historyClient) id() int {
	h.clientID.Lock()
	defer h.clientID.Unlock()
	h.nextID++
	return h.o.client*1000 + h.nextID
}

// setup retries a set-up step while its unit is unavailable.
func (h *historyClient) setup(ctx context.Context, step func() error) error {
	for {
		err := step()
		if err == nil || !errors.Is(err, hosting.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *historyClient) stopped() bool {
	select {
	case <-h.stop:
		return true
	default:
		return false
	}
}

func (h *historyClient) pause(d time.Duration) {
	select {
	case <-h.stop:
	case <-time.After(d):
	}
}

// do sends req until it is answered or fails for good (every operation
// is idempotent): it retries while the unit is unavailable, and while
// retry(reply, err) says so, until the client stops (then the operation
// stays without a result: it may or may not have taken effect). Each
// successful reply's activation information is appended to op.
func (h *historyClient) do(ctx context.Context, op *histcheck.Op, kind, identity string, req *hosting.Request, retry func(*hosting.Reply, error) bool) (*hosting.Reply, error) {
	req.Principal = &driverTenant
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rep, err := h.p.Request(rctx, kind, identity, req)
		cancel()
		if err == nil {
			op.Replies = append(op.Replies, histcheck.Reply{Target: kind + "/" + identity, Member: rep.Member, MemberID: rep.MemberID,
				Epoch: rep.Epoch, Activated: rep.ActivatedAt, Served: rep.ServedAt})
		}
		again := errors.Is(err, hosting.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
		if retry != nil {
			again = retry(rep, err)
		}
		if !again {
			return rep, err
		}
		if h.stopped() || ctx.Err() != nil {
			return nil, fmt.Errorf("stopped: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// record finishes op: OK and Return when err is nil, Err otherwise (an
// operation cut short by the client's stop has neither: it may or may not
// have taken effect).
func (h *historyClient) record(op histcheck.Op, err error) {
	if err == nil {
		op.OK, op.Return = true, time.Now().UnixNano()
	} else if !strings.HasPrefix(err.Error(), "stopped:") {
		op.Err = err.Error()
	}
	h.ops <- op
}

// recordFinal records a final read: a failed one always with its error.
func (h *historyClient) recordFinal(op histcheck.Op, err error) {
	if err != nil {
		op.Err = err.Error()
	}
	h.record(op, err)
}

func (h *historyClient) applyLoop(ctx context.Context, client int, g string) {
	defer h.wg.Done()
	for k := 0; !h.stopped(); k++ {
		evs, err := h.w.Sign(g, 1)
		if err != nil {
			fmt.Fprintln(os.Stderr, "history: sign:", err)
			return
		}
		id := eventid.Of(evs[0])
		h.mu.Lock()
		h.events[g][id] = k
		h.mu.Unlock()
		op := histcheck.Op{Kind: histcheck.KApply, Unit: g, Client: client, K: k, Call: time.Now().UnixNano()}
		if h.fp == fpAckEarly && k%5 == 4 {
			h.record(op, nil) // planted bug: acknowledged, never applied
			h.w.Record(g, evs)
			continue
		}
		rep, err := h.do(ctx, &op, hosting.KindGroup, g, &hosting.Request{Op: hosting.OpApply, Events: evs}, nil)
		if err == nil && (len(rep.Outcomes) != 1 || (rep.Outcomes[0].Kind != uint8(messages.Applied) && rep.Outcomes[0].Kind != uint8(messages.Duplicate))) {
			err = fmt.Errorf("apply outcome %+v", rep.Outcomes)
		}
		h.record(op, err)
		h.w.Record(g, evs)
		if errors.Is(err, hosting.ErrNotProvisioned) {
			return // the unit is gone (its files deleted)
		}
		h.pause(20 * time.Millisecond)
	}
}

// eventsPage is the page size of the history client's event reads.
const eventsPage = 2000

// readEvents reads the group's retained events: the numbers of this
// client's events and how many were listed twice.
func (h *historyClient) readEvents(ctx context.Context, op *histcheck.Op, g string) (ids []int, dups int, err error) {
	seen := map[int]bool{}
	var seq uint64
	for {
		// Pages of eventsPage ids (within hosting.MaxEventIDs).
		rep, err := h.do(ctx, op, hosting.KindGroup, g, &hosting.Request{Op: hosting.OpEvents, Seq: seq, Limit: eventsPage}, nil)
		if err != nil {
			return nil, 0, err
		}
		h.mu.Lock()
		for _, b := range rep.IDs {
			var id messages.EventID
			copy(id[:], b)
			k, ok := h.events[g][id]
			switch {
			case !ok:
			case seen[k]:
				dups++
			default:
				seen[k] = true
				ids = append(ids, k)
			}
		}
		h.mu.Unlock()
		// The log is append-only: pages read one after the other are the
		// log as of the last page.
		if !rep.More || rep.Next <= seq {
			return ids, dups, nil
		}
		seq = rep.Next
	}
}

// readRow reads the row event number k of group g writes: [k] when it
// exists.
func (h *historyClient) readRow(ctx context.Context, op *histcheck.Op, g string, k int) ([]int, error) {
	key, err := messages.NewValue(int64(k))
	if err != nil {
		return nil, err
	}
	rep, err := h.do(ctx, op, hosting.KindGroup, g, &hosting.Request{Op: hosting.OpGet, Schema: scenario.Table.Schema,
		TableName: scenario.Table.Table, RowKey: messages.Columns{"id": key}}, nil)
	if err != nil {
		return nil, err
	}
	if rep.Found && len(rep.Rows) == 1 && rep.Rows[0].Exists {
		return []int{k}, nil
	}
	return nil, nil
}

func (h *historyClient) readGroupLoop(ctx context.Context, client int, g string) {
	defer h.wg.Done()
	for n := 0; !h.stopped(); n++ {
		if n%3 == 2 {
			// A row read: of the event being applied now (or the one
			// before), so reads race with the applies they observe.
			h.mu.Lock()
			k := len(h.events[g]) - 1 - n%2
			h.mu.Unlock()
			op := histcheck.Op{Kind: histcheck.KRow, Unit: g, Client: client, K: max(k, 0), Call: time.Now().UnixNano()}
			ids, err := h.readRow(ctx, &op, g, op.K)
			op.IDs = ids
			h.record(op, err)
			if errors.Is(err, hosting.ErrNotProvisioned) {
				return
			}
			h.pause(30 * time.Millisecond)
			continue
		}
		op := histcheck.Op{Kind: histcheck.KEvents, Unit: g, Client: client, Call: time.Now().UnixNano()}
		ids, dups, err := h.readEvents(ctx, &op, g)
		if h.fp == fpStaleRead && err == nil {
			h.mu.Lock()
			if first, ok := h.stale[g]; !ok {
				h.stale[g] = ids
			} else if n%2 == 1 {
				ids, dups = first, 0 // planted bug: a reply from stale state
			}
			h.mu.Unlock()
		}
		op.IDs, op.Dups = ids, dups
		h.record(op, err)
		if errors.Is(err, hosting.ErrNotProvisioned) {
			return
		}
		h.pause(30 * time.Millisecond)
	}
}

// msgID is the logical id of message k from device number i.
func (h *historyClient) msgID(i, k int) messages.LogicalMessageID {
	var id messages.LogicalMessageID
	copy(id[:], "hist")
	id[4], id[5] = byte(h.o.client), byte(i)
	id[8], id[9], id[10], id[11] = byte(k>>24), byte(k>>16), byte(k>>8), byte(k)
	return id
}

// msgK returns the number of a message of this client from device i
// (false: someone else's).
func (h *historyClient) msgK(i int, b []byte) (int, bool) {
	if len(b) != 16 || string(b[:4]) != "hist" || b[4] != byte(h.o.client) || b[5] != byte(i) {
		return 0, false
	}
	return int(b[8])<<24 | int(b[9])<<16 | int(b[10])<<8 | int(b[11]), true
}

func (h *historyClient) pairLoop(ctx context.Context, client, i int, from, to messages.DeviceAddress) {
	defer h.wg.Done()
	pair := histcheck.Pair(hosting.DeviceIdentity(from), hosting.DeviceIdentity(to))
	for k := 0; !h.stopped(); k++ {
		id := h.msgID(i, k)
		h.mu.Lock()
		h.sent[pair] = k + 1
		h.mu.Unlock()
		op := histcheck.Op{Kind: histcheck.KSend, Unit: pair, Client: client, K: k, Call: time.Now().UnixNano()}
		peer := to
		_, err := h.do(ctx, &op, hosting.KindDevice, hosting.DeviceIdentity(from), &hosting.Request{Op: hosting.OpSend, Peer: &peer, ID: id[:], Body: []byte("history")},
			func(_ *hosting.Reply, err error) bool {
				// Not handed off: pending at the sender; send it again.
				return errors.Is(err, hosting.ErrUnavailable) || errors.Is(err, runtime.ErrNotHandedOff) || errors.Is(err, context.DeadlineExceeded)
			})
		h.record(op, err)
		if err != nil {
			if errors.Is(err, hosting.ErrNotProvisioned) {
				return
			}
			continue
		}
		// Every fourth message is discarded, the others committed.
		discard := k%4 == 3
		op = histcheck.Op{Kind: histcheck.KFinalize, Unit: pair, Client: client, K: k, Discard: discard, Call: time.Now().UnixNano()}
		sender := from
		req := &hosting.Request{Op: hosting.OpCommit, Peer: &sender, ID: id[:]}
		if discard {
			req = &hosting.Request{Op: hosting.OpDiscard, Peer: &sender, ID: id[:], Reason: uint8(persistence.DiscardRejectedByPolicy)}
		}
		_, err = h.do(ctx, &op, hosting.KindDevice, hosting.DeviceIdentity(to), req, func(rep *hosting.Reply, err error) bool {
			if err != nil {
				return errors.Is(err, hosting.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
			}
			// The ACK did not reach the sender's host: finalize again.
			return len(rep.Messages) != 1 || !rep.Messages[0].AckSent
		})
		h.record(op, err)
		if errors.Is(err, hosting.ErrNotProvisioned) {
			return
		}
		h.pause(30 * time.Millisecond)
	}
}

// pendingOf reads every page of dev's pending received (op OpPending) or
// sent (OpPendingSent) messages exchanged with peer: the numbers of this
// client's messages from device i and how many were listed twice.
func (h *historyClient) pendingOf(ctx context.Context, op *histcheck.Op, o hosting.Op, dev, peer messages.DeviceAddress, i int) (ids []int, dups int, err error) {
	seen := map[int]bool{}
	var seq uint64
	for {
		p := peer
		rep, err := h.do(ctx, op, hosting.KindDevice, hosting.DeviceIdentity(dev), &hosting.Request{Op: o, Seq: seq, Limit: hosting.MaxPendingPage, Peer: &p}, nil)
		if err != nil {
			return nil, 0, err
		}
		for _, m := range rep.Messages {
			if m.Peer != peer {
				continue
			}
			k, ok := h.msgK(i, m.ID)
			switch {
			case !ok:
			case seen[k]:
				dups++
			default:
				seen[k] = true
				ids = append(ids, k)
			}
		}
		if !rep.More || rep.Next <= seq {
			return ids, dups, nil
		}
		seq = rep.Next
	}
}

func (h *historyClient) readPairLoop(ctx context.Context, client int, from, to messages.DeviceAddress) {
	defer h.wg.Done()
	pair := histcheck.Pair(hosting.DeviceIdentity(from), hosting.DeviceIdentity(to))
	i := h.deviceIndex(from)
	for n := 0; !h.stopped(); n++ {
		op := histcheck.Op{Kind: histcheck.KInbound, Unit: pair, Client: client, Call: time.Now().UnixNano()}
		var err error
		if n%2 == 0 {
			op.IDs, op.Dups, err = h.pendingOf(ctx, &op, hosting.OpPending, to, from, i)
		} else {
			op.Kind = histcheck.KOutbound
			op.IDs, op.Dups, err = h.pendingOf(ctx, &op, hosting.OpPendingSent, from, to, i)
		}
		h.record(op, err)
		if errors.Is(err, hosting.ErrNotProvisioned) {
			return
		}
		h.pause(30 * time.Millisecond)
	}
}

// deviceIndex is the number of the client's device dev.
func (h *historyClient) deviceIndex(dev messages.DeviceAddress) int {
	var i int
	_, _ = fmt.Sscanf(strings.TrimPrefix(dev.User, "h"+h.o.tag), "%d", &i)
	return i
}

// final records the final reads, after the load stopped and every fault
// was healed: each group's events, and each message's state.
func (h *historyClient) final(ctx context.Context, groups []string, devices []messages.DeviceAddress) {
	read := func(ctx context.Context, op *histcheck.Op, step func() error) error {
		for {
			err := step()
			if err == nil || ctx.Err() != nil || !(errors.Is(err, hosting.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || strings.HasPrefix(err.Error(), "stopped:")) {
				return err
			}
			op.Replies = nil
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The retry loop of do ends at once (the client has stopped): final
	// reads retry here, until the final deadline.
	for _, g := range groups {
		op := histcheck.Op{Kind: histcheck.KFinalEvents, Unit: g, Call: time.Now().UnixNano()}
		err := read(ctx, &op, func() (err error) {
			op.IDs, op.Dups, err = h.readEvents(ctx, &op, g)
			return err
		})
		h.recordFinal(op, err)
	}
	// One pair at a time would take minutes after a long run (one
	// processed read per message): the pairs are read in parallel.
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.finalPair(ctx, read, i, devices)
		}()
	}
}

// finalPair records the final state of every message of pair i.
func (h *historyClient) finalPair(ctx context.Context, read func(context.Context, *histcheck.Op, func() error) error, i int, devices []messages.DeviceAddress) {
	from, to := devices[i], devices[(i+1)%len(devices)]
	pair := histcheck.Pair(hosting.DeviceIdentity(from), hosting.DeviceIdentity(to))
	var in, out []int
	op := histcheck.Op{Call: time.Now().UnixNano()}
	errIn := read(ctx, &op, func() (err error) { in, _, err = h.pendingOf(ctx, &op, hosting.OpPending, to, from, i); return err })
	errOut := read(ctx, &op, func() (err error) {
		out, _, err = h.pendingOf(ctx, &op, hosting.OpPendingSent, from, to, i)
		return err
	})
	h.mu.Lock()
	n := h.sent[pair]
	h.mu.Unlock()
	for k := 0; k < n; k++ {
		op := histcheck.Op{Kind: histcheck.KFinalMessage, Unit: pair, K: k, Call: time.Now().UnixNano()}
		id := h.msgID(i, k)
		var processed string
		err := errors.Join(errIn, errOut)
		if err == nil {
			err = read(ctx, &op, func() error {
				sender := from
				rep, err := h.do(ctx, &op, hosting.KindDevice, hosting.DeviceIdentity(to), &hosting.Request{Op: hosting.OpProcessed, Peer: &sender, ID: id[:]}, nil)
				if err != nil {
					return err
				}
				processed = ""
				if rep.Found && len(rep.Messages) == 1 {
					switch persistence.Finalization(rep.Messages[0].Status) {
					case persistence.FinalizationCommitted:
						processed = "committed"
					case persistence.FinalizationDiscarded:
						processed = "discarded"
					default:
						processed = fmt.Sprintf("finalization %d", rep.Messages[0].Status)
					}
				}
				return nil
			})
		}
		switch {
		case err != nil:
		case processed != "":
			op.State = processed
			if contains(in, k) {
				op.Dups = 1 // finalized and pending at once
			}
		case contains(in, k):
			op.State = "pending"
		case contains(out, k):
			op.State = "sent-only"
		default:
			op.State = "absent"
		}
		h.recordFinal(op, err)
	}
}

func contains(s []int, k int) bool {
	for _, v := range s {
		if v == k {
			return true
		}
	}
	return false
}
