package hosting

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// Page limits of the reading operations. Every page is a list in one
// Reply, so none is longer than the decoder reads
// (messages.MaxArrayElements), and a page also ends early, with More set,
// before its items pass MaxPageBytes: a reply the host writes is one
// DecodeReply reads.
const (
	// MaxScanRows bounds the rows of one OpScan reply.
	MaxScanRows = 1000
	// MaxEventIDs bounds the ids of one OpEvents reply: the longest list
	// DecodeReply accepts (Client.EventIDs pages through larger logs).
	MaxEventIDs = messages.MaxArrayElements
	// MaxPendingPage bounds the messages of one OpPending or OpPendingSent
	// reply (the runtime's own page limit).
	MaxPendingPage = 100
	// MaxChanges bounds the changes of one OpChanges reply.
	MaxChanges = 1000
	// MaxChangesWait bounds how long one OpChanges waits for a change.
	MaxChangesWait = 10 * time.Second
	// MaxPageBytes bounds the encoded items (rows, changes, messages) of
	// one page: a page stops before the item that would pass it, so the
	// reply stays within MaxFrame with room for its other fields. A page
	// always holds at least one item; one item larger than a frame is
	// refused with messages.ErrTooLarge when the reply is framed.
	MaxPageBytes = MaxFrame - 1<<20
)

// pageByteLimit is MaxPageBytes; tests lower it to page small data.
var pageByteLimit = MaxPageBytes

// pageBytes charges the items of one page against MaxPageBytes.
type pageBytes int

// fits reports whether item, encoded, still fits the page after the n
// items already in it (the first always does) and charges it if so.
func (p *pageBytes) fits(n int, item any) bool {
	b, err := messages.Marshal(item)
	size := len(b)
	if err != nil {
		size = pageByteLimit // unencodable: alone on its page, where framing reports it
	}
	if n > 0 && int(*p)+size > pageByteLimit {
		return false
	}
	*p += pageBytes(size)
	return true
}

// changesLinger is how long OpChanges keeps collecting after a change
// when no next one follows at once (the rest of a page comes without a
// pause; a pause means it caught up).
const changesLinger = 20 * time.Millisecond

// serve runs req on the open unit u and answers it. An error on a unit
// closed meanwhile (its member stopping or the grain passivated) is
// CodeUnavailable: the caller retries and reaches the unit's next host.
//
// gate, when set, must allow serving before the operation and again
// after it (the member still owns the unit and its registration still
// holds); a success is reported only if the second check passed, and
// Reply.ServedAt is taken before it, so every successful reply was
// produced inside its activation (before the unit was closed here and
// before any other member could have activated it). A refused one is
// CodeUnavailable: the effect may have happened (every operation is
// idempotent) and the caller repeats it on the unit's next host.
func (h *host) serve(ctx context.Context, u *unit, req *Request, gate func() error) *Reply {
	if req == nil {
		return h.fail(fmt.Errorf("%w: nil request", ErrBadRequest))
	}
	if u.closed.Load() {
		return h.fail(fmt.Errorf("%w: %s %q is closing on %s", ErrUnavailable, u.key.kind, u.key.identity, h.member()))
	}
	if gate != nil {
		if err := gate(); err != nil {
			return h.fail(err)
		}
	}
	rep, err := h.dispatch(ctx, u, req)
	if err != nil && h.repl != nil && h.repl.deposed(err) {
		// A write refused by the partition's log (this member no longer
		// leads it, or lost it mid-way): the unit's state here may be
		// behind its log; close it, the caller retries on the leader.
		_ = h.release(u)
		err = h.replErr(err)
	}
	if err != nil {
		if u.closed.Load() && !errors.Is(err, ErrBadRequest) {
			err = fmt.Errorf("%w: %s %q closed on %s: %w", ErrUnavailable, u.key.kind, u.key.identity, h.member(), err)
		} else if gate != nil && !errors.Is(err, ErrBadRequest) {
			// The operation ran into the end of the member's right to
			// serve the unit (its context ends at the registration's
			// ValidUntil): the caller retries on the unit's next host.
			if gerr := gate(); gerr != nil {
				err = fmt.Errorf("%w: %w", gerr, err)
			}
		}
		return h.fail(fmt.Errorf("%s %s %q: %w", req.Op, u.key.kind, u.key.identity, err))
	}
	servedAt := time.Now()
	if gate != nil {
		if err := gate(); err != nil {
			return h.fail(fmt.Errorf("%s %s %q: done, but %w", req.Op, u.key.kind, u.key.identity, err))
		}
	}
	if h.repl != nil {
		// The fence by term: the reply is current only if a quorum still
		// follows this member in the term it led when the activation
		// began, so no successor can have served in between (a write was
		// already committed by a quorum before it returned; a lead lost
		// and won again is another term and refuses too).
		p := h.repl.partitionOf(unitPath(u.key.kind, u.key.identity))
		if err := h.repl.checkTerm(ctx, p, u.term); err != nil {
			_ = h.release(u)
			return h.fail(fmt.Errorf("%s %s %q: done, but %w: fence of term %d: %w", req.Op, u.key.kind, u.key.identity, ErrNotOwner, u.term, err))
		}
		rep.Term = u.term
	}
	if u.closed.Load() {
		return h.fail(fmt.Errorf("%w: %s %q closed on %s during %s", ErrUnavailable, u.key.kind, u.key.identity, h.member(), req.Op))
	}
	rep.Member, rep.MemberID = h.member(), h.memberID()
	rep.Epoch, rep.ActivatedAt, rep.ServedAt = u.epoch, u.activatedAt.UnixNano(), servedAt.UnixNano()
	return rep
}

// dispatch serves req on unit u through the operation table: an unknown
// operation, or one of the other kind of unit, is ErrBadRequest.
func (h *host) dispatch(ctx context.Context, u *unit, req *Request) (*Reply, error) {
	if req.Op == OpInfo || req.Op == OpCreate {
		return &Reply{}, nil
	}
	op, ok := handlers[req.Op]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: unknown operation %s", ErrBadRequest, req.Op)
	case op.kind != u.key.kind:
		return nil, fmt.Errorf("%w: %s is not an operation of a %s", ErrBadRequest, req.Op, u.key.kind)
	}
	return op.run(ctx, u.node, req)
}

// opHandler runs one operation on a unit's node: the kind of unit it
// belongs to and the function that serves it (validation of the request,
// the node call, the reply).
type opHandler struct {
	kind string
	run  func(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error)
}

// handlers is the operation table: one entry per Op but OpInfo (answered
// by every unit). Group operations serve the sync plane, device operations
// the delivery plane.
var handlers = map[Op]opHandler{
	OpDefineTable: {KindGroup, handleDefineTable},
	OpTrust:       {KindGroup, handleTrust},
	OpApply:       {KindGroup, handleApply},
	OpGet:         {KindGroup, handleGet},
	OpScan:        {KindGroup, handleScan},
	OpEvents:      {KindGroup, handleEvents},
	OpDigest:      {KindGroup, handleDigest},
	OpChanges:     {KindGroup, handleChanges},
	OpSend:        {KindDevice, handleSend},
	OpDeliver:     {KindDevice, handleDeliver},
	OpBundle:      {KindDevice, handleBundle},
	OpCommit:      {KindDevice, handleCommit},
	OpPending:     {KindDevice, handlePending},
	OpPendingSent: {KindDevice, handlePendingSent},
	OpProcessed:   {KindDevice, handleProcessed},
	OpDiscard:     {KindDevice, handleDiscard},
	OpPrune:       {KindDevice, handlePrune},
}

func handleDefineTable(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	if req.Table == nil {
		return nil, fmt.Errorf("%w: no table", ErrBadRequest)
	}
	t := req.Table
	return &Reply{}, n.DefineTable(ctx, runtime.TableDef{Schema: t.Schema, Table: t.Table, KeyColumns: t.KeyColumns, Columns: t.Columns})
}

func handleTrust(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	s := req.Signer
	if s == nil || len(s.Site) != len(messages.SiteID{}) {
		return nil, fmt.Errorf("%w: no signer or a bad site id", ErrBadRequest)
	}
	k := runtime.PeerKey{Kid: s.Kid, PublicKey: s.PublicKey, Cutoff: messages.HLC(s.Cutoff)}
	copy(k.Site[:], s.Site)
	return &Reply{}, n.Trust(ctx, k)
}

func handleApply(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	if len(req.Events) == 0 || len(req.Events) > messages.MaxPushEvents {
		return nil, fmt.Errorf("%w: 1..%d events per apply", ErrBadRequest, messages.MaxPushEvents)
	}
	outs, err := n.ApplySignedBatch(ctx, req.Events)
	if err != nil {
		return nil, err
	}
	rep := &Reply{Outcomes: make([]Outcome, len(outs))}
	for i, o := range outs {
		rep.Outcomes[i] = Outcome{Kind: uint8(o.Kind), Reason: uint8(o.Reason), ID: append([]byte(nil), o.ID[:]...)}
	}
	return rep, nil
}

func handleGet(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	key := make(map[string]any, len(req.RowKey))
	for c, v := range req.RowKey {
		key[c] = v
	}
	row, found, err := n.Get(ctx, req.Schema, req.TableName, key)
	if err != nil {
		return nil, err
	}
	rep := &Reply{Found: found}
	if row.Key != nil {
		rep.Rows = []Row{rowOf(row)}
	}
	return rep, nil
}

func handleScan(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	limit := req.Limit
	if limit <= 0 || limit > MaxScanRows {
		limit = MaxScanRows
	}
	rep := &Reply{}
	var size pageBytes
	for r, err := range n.Rows(ctx, req.Schema, req.TableName, runtime.ScanOptions{After: req.After}) {
		if err != nil {
			return rep, err
		}
		row := rowOf(r)
		if len(rep.Rows) == limit || !size.fits(len(rep.Rows), row) {
			rep.More = true
			break
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

func handleEvents(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	limit := req.Limit
	if limit <= 0 || limit > MaxEventIDs {
		limit = MaxEventIDs
	}
	rep := &Reply{Next: req.Seq}
	for e, err := range n.LogEntries(ctx, req.Seq) {
		if err != nil {
			return nil, err
		}
		if len(rep.IDs) == limit {
			rep.More = true
			break
		}
		rep.IDs = append(rep.IDs, e.ID[:])
		rep.Next = e.Seq
	}
	return rep, nil
}

func handleDigest(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	var ids [][]byte
	for e, err := range n.LogEntries(ctx, 0) {
		if err != nil {
			return nil, err
		}
		ids = append(ids, e.ID[:])
	}
	return &Reply{Count: uint64(len(ids)), Hash: digestOf(ids)}, nil
}

func handleChanges(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	limit := req.Limit
	if limit <= 0 || limit > MaxChanges {
		limit = MaxChanges
	}
	wait := min(max(time.Duration(req.Wait), changesLinger), MaxChangesWait)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type item struct {
		c   runtime.Change
		err error
	}
	ch := make(chan item)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c, err := range n.Watch(wctx, req.Schema, req.TableName, req.Seq) {
			select {
			case ch <- item{c, err}:
			case <-wctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() { cancel(); <-done }()
	rep := &Reply{Next: req.Seq}
	var size pageBytes
	t := time.NewTimer(wait)
	defer t.Stop()
	for len(rep.Changes) < limit {
		select {
		case it := <-ch:
			if it.err != nil {
				if errors.Is(it.err, context.Canceled) && ctx.Err() == nil {
					return rep, nil
				}
				return nil, it.err
			}
			c := it.c
			w := Change{Seq: c.Seq, Key: c.Key, Exists: c.Exists, Cause: uint8(c.Cause), Cells: make(map[string]Cell, len(c.Cells))}
			for col, v := range c.Cells {
				w.Cells[col] = Cell{State: uint8(v.State), Value: []byte(v.Value)}
			}
			if !size.fits(len(rep.Changes), w) {
				// The change is not consumed: the next page resumes
				// after rep.Next and starts with it.
				rep.More = true
				return rep, nil
			}
			rep.Changes, rep.Next = append(rep.Changes, w), c.Seq
			t.Reset(changesLinger)
		case <-t.C:
			return rep, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	rep.More = true
	return rep, nil
}

func handleSend(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	to, id, err := peerAndID(req)
	if err != nil {
		return nil, err
	}
	sm, err := n.SendWithID(ctx, to, id, req.Body)
	dup := false
	if errors.Is(err, runtime.ErrAlreadyPending) {
		// A repeat of this request (cluster retry, caller retry): the
		// message is stored; hand it off again (a fresh encryption
		// the recipient recognizes by its logical id).
		dup = true
		err = n.Resend(ctx, to, id)
		if errors.Is(err, runtime.ErrNotPending) {
			err = nil // acknowledged meanwhile
		}
	}
	if err != nil {
		return nil, err
	}
	return &Reply{Messages: []Message{{Peer: to, ID: id[:], Seq: sm.Sequence, Duplicate: dup}}}, nil
}

func handleDeliver(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	if req.Peer == nil || len(req.Envelope) == 0 {
		return nil, fmt.Errorf("%w: deliver needs a peer and an envelope", ErrBadRequest)
	}
	res, err := n.ReceiveEnvelope(ctx, *req.Peer, req.Envelope)
	if err != nil {
		return nil, err
	}
	return &Reply{Kind: uint8(res.Kind)}, nil
}

func handleBundle(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	b, err := n.Bundle(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := messages.EncodePrekeyBundle(b)
	if err != nil {
		return nil, err
	}
	return &Reply{Bundle: raw}, nil
}

func handleCommit(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	from, id, err := peerAndID(req)
	if err != nil {
		return nil, err
	}
	res, err := n.CommitReceivedMessage(ctx, from, id)
	if err != nil {
		return nil, err
	}
	return &Reply{Messages: []Message{{Peer: from, ID: id[:], Status: uint8(res.Status), AckSent: res.AckSent}}}, nil
}

func handlePending(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	limit := pageLimit(req.Limit)
	rep := &Reply{Next: req.Seq}
	var size pageBytes
	for m, err := range n.PendingReceived(ctx, req.Seq, req.Peer) {
		if err != nil {
			return nil, err
		}
		msg := Message{Peer: m.Sender, ID: bytesOf(m.ID), Seq: m.Sequence, Body: m.Plaintext}
		if len(rep.Messages) == limit || !size.fits(len(rep.Messages), msg) {
			rep.More = true
			break
		}
		rep.Messages = append(rep.Messages, msg)
		rep.Next = m.Sequence
	}
	return rep, nil
}

func handlePendingSent(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	limit := pageLimit(req.Limit)
	rep := &Reply{Next: req.Seq}
	var size pageBytes
	for m, err := range n.PendingSent(ctx, req.Seq, req.Peer) {
		if err != nil {
			return nil, err
		}
		msg := Message{Peer: m.Recipient, ID: bytesOf(m.ID), Seq: m.Sequence, Body: m.Body}
		if len(rep.Messages) == limit || !size.fits(len(rep.Messages), msg) {
			rep.More = true
			break
		}
		rep.Messages = append(rep.Messages, msg)
		rep.Next = m.Sequence
	}
	return rep, nil
}

func handleProcessed(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	from, id, err := peerAndID(req)
	if err != nil {
		return nil, err
	}
	p, ok, err := n.ProcessedMessage(ctx, from, id)
	if err != nil {
		return nil, err
	}
	rep := &Reply{Found: ok}
	if ok {
		rep.Messages = []Message{{Peer: p.Sender, ID: bytesOf(p.ID), Status: uint8(p.Finalization)}}
	}
	return rep, nil
}

func handleDiscard(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	from, id, err := peerAndID(req)
	if err != nil {
		return nil, err
	}
	res, err := n.DiscardReceivedMessage(ctx, from, id, runtime.DiscardReason(req.Reason))
	if errors.Is(err, runtime.ErrInvalidDiscardReason) {
		err = fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if err != nil {
		return nil, err
	}
	return &Reply{Messages: []Message{{Peer: from, ID: id[:], Status: uint8(res.Status), AckSent: res.AckSent}}}, nil
}

func handlePrune(ctx context.Context, n *runtime.Node, req *Request) (*Reply, error) {
	if req.MaxAge <= 0 {
		return nil, fmt.Errorf("%w: prune needs a positive MaxAge", ErrBadRequest)
	}
	k, err := n.PruneProcessedMessages(ctx, runtime.RetentionPolicy{MaxAge: time.Duration(req.MaxAge)})
	if err != nil {
		return nil, err
	}
	return &Reply{Count: uint64(k)}, nil
}

func bytesOf(id messages.LogicalMessageID) []byte { return append([]byte(nil), id[:]...) }

func pageLimit(l int) int {
	if l <= 0 || l > MaxPendingPage {
		return MaxPendingPage
	}
	return l
}

func peerAndID(req *Request) (messages.DeviceAddress, messages.LogicalMessageID, error) {
	var id messages.LogicalMessageID
	if req.Peer == nil || len(req.ID) != len(id) {
		return messages.DeviceAddress{}, id, fmt.Errorf("%w: needs a peer and a %d-byte message id", ErrBadRequest, len(id))
	}
	if err := req.Peer.Validate(); err != nil {
		return messages.DeviceAddress{}, id, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	copy(id[:], req.ID)
	return *req.Peer, id, nil
}

func rowOf(r runtime.Row) Row {
	out := Row{Key: r.Key, Exists: r.Exists, Cells: make(map[string]Cell, len(r.Cells))}
	for c, v := range r.Cells {
		out.Cells[c] = Cell{State: uint8(v.State), Value: []byte(v.Value)}
	}
	return out
}

// digestOf is SHA-256 over the sorted 32-byte event ids: equal sets of
// retained events give equal digests whatever their log order.
func digestOf(ids [][]byte) []byte {
	s := slices.Clone(ids)
	slices.SortFunc(s, func(a, b []byte) int { return slices.Compare(a, b) })
	h := sha256.New()
	for _, id := range s {
		h.Write(id)
	}
	return h.Sum(nil)
}
