package hosting

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// Client is the typed API over a Placement: each method is one Request to
// a unit, wherever it is hosted. Every mutating method is idempotent, so
// after an error (ErrUnavailable, a timeout) it is safe to call it again
// with the same arguments.
//
// Every call acts for the principal its context carries (WithPrincipal);
// the unit's host asks its Authorizer (by default: a unit is its owner
// tenant's alone) and refuses anything else with ErrForbidden, changing
// nothing. A unit exists only once created (Create); any other call on
// an address nobody created is ErrNotProvisioned.
type Client struct {
	P Placement // where requests go
}

// do sends req, carrying ctx's principal, to the unit (kind, identity).
func (c Client) do(ctx context.Context, kind, identity string, req *Request) (*Reply, error) {
	if p, ok := PrincipalFrom(ctx); ok {
		req.Principal = &p
	}
	return c.P.Request(ctx, kind, identity, req)
}

// Create provisions the unit (kind, identity) for the principal's tenant,
// which owns it from then on, and returns the member hosting it. It is
// idempotent for the owner; another tenant's unit is ErrForbidden, and a
// tenant past its quota gets ErrQuota.
func (c Client) Create(ctx context.Context, kind, identity string) (string, error) {
	rep, err := c.do(ctx, kind, identity, &Request{Op: OpCreate})
	if err != nil {
		return "", err
	}
	return rep.Member, nil
}

// Delete closes the unit and removes its files (its owner only;
// idempotent: deleting a deleted unit is ErrNotProvisioned).
func (c Client) Delete(ctx context.Context, kind, identity string) error {
	_, err := c.do(ctx, kind, identity, &Request{Op: OpDelete})
	return err
}

// Discard finalizes the message (sender, id) received by dev without
// applying it (runtime.Node.DiscardReceivedMessage): it leaves the
// pending list and the sender gets its ACK.
func (c Client) Discard(ctx context.Context, dev, sender messages.DeviceAddress, id messages.LogicalMessageID, reason runtime.DiscardReason) (Message, error) {
	rep, err := c.do(ctx, KindDevice, DeviceIdentity(dev), &Request{Op: OpDiscard, Peer: &sender, ID: id[:], Reason: uint8(reason)})
	if err != nil {
		return Message{}, err
	}
	return first(rep)
}

// Prune removes dev's processed records finalized at least maxAge ago
// and returns how many it removed (runtime.Node.PruneProcessedMessages).
func (c Client) Prune(ctx context.Context, dev messages.DeviceAddress, maxAge time.Duration) (int, error) {
	rep, err := c.do(ctx, KindDevice, DeviceIdentity(dev), &Request{Op: OpPrune, MaxAge: int64(maxAge)})
	if err != nil {
		return 0, err
	}
	return int(rep.Count), nil
}

// Info activates the unit and returns the member hosting it.
func (c Client) Info(ctx context.Context, kind, identity string) (string, error) {
	rep, err := c.do(ctx, kind, identity, &Request{Op: OpInfo})
	if err != nil {
		return "", err
	}
	return rep.Member, nil
}

// DefineTable defines def on the group (a no-op when already defined the
// same way).
func (c Client) DefineTable(ctx context.Context, group string, def runtime.TableDef) error {
	_, err := c.do(ctx, KindGroup, group, &Request{Op: OpDefineTable, Table: &Table{Schema: def.Schema, Table: def.Table, KeyColumns: def.KeyColumns, Columns: def.Columns}})
	return err
}

// Trust adds or replaces a trusted signer of the group.
func (c Client) Trust(ctx context.Context, group string, k runtime.PeerKey) error {
	_, err := c.do(ctx, KindGroup, group, &Request{Op: OpTrust, Signer: &Signer{Kid: k.Kid, Site: k.Site[:], PublicKey: k.PublicKey, Cutoff: uint64(k.Cutoff)}})
	return err
}

// Apply applies signed events on the group and returns one outcome per
// event (idempotent by event id: a repeat is messages.Duplicate) and the
// member that applied them. A nil error means every Applied or Duplicate
// outcome is durable.
func (c Client) Apply(ctx context.Context, group string, events [][]byte) ([]messages.Outcome, string, error) {
	rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpApply, Events: events})
	if err != nil {
		return nil, "", err
	}
	if len(rep.Outcomes) != len(events) {
		return nil, rep.Member, fmt.Errorf("%w: %d outcomes for %d events", ErrFailed, len(rep.Outcomes), len(events))
	}
	out := make([]messages.Outcome, len(rep.Outcomes))
	for i, o := range rep.Outcomes {
		out[i] = messages.Outcome{Kind: messages.OutcomeKind(o.Kind), Reason: messages.Reason(o.Reason)}
		if len(o.ID) == len(out[i].ID) {
			copy(out[i].ID[:], o.ID)
		}
	}
	return out, rep.Member, nil
}

// Get reads one row of the group (found is false for a missing or deleted
// row; the Row is still returned for a deleted one).
func (c Client) Get(ctx context.Context, group, schema, table string, key map[string]any) (Row, bool, error) {
	cols := make(messages.Columns, len(key))
	for k, v := range key {
		enc, err := messages.NewValue(v)
		if err != nil {
			return Row{}, false, fmt.Errorf("%w: key column %q: %w", ErrBadRequest, k, err)
		}
		cols[k] = enc
	}
	rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpGet, Schema: schema, TableName: table, RowKey: cols})
	if err != nil {
		return Row{}, false, err
	}
	var r Row
	if len(rep.Rows) > 0 {
		r = rep.Rows[0]
	}
	return r, rep.Found, nil
}

// Scan reads up to limit live rows of the group's table after the encoded
// key after (nil: from the first); more reports whether more follow.
func (c Client) Scan(ctx context.Context, group, schema, table string, after []byte, limit int) (rows []Row, more bool, err error) {
	rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpScan, Schema: schema, TableName: table, After: after, Limit: limit})
	if err != nil {
		return nil, false, err
	}
	return rep.Rows, rep.More, nil
}

// Rows returns the live rows of the group's table after the encoded key
// after (nil: from the first), in the table's key order, one Scan of
// MaxScanRows per request: the runtime.Node.Rows of a hosted group. A
// row's position is its key: resume after the last one's Key.Encode().
// The iteration ends after yielding a non-nil error.
func (c Client) Rows(ctx context.Context, group, schema, table string, after []byte) iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		for {
			rows, more, err := c.Scan(ctx, group, schema, table, after, MaxScanRows)
			if err != nil {
				yield(Row{}, err)
				return
			}
			for _, r := range rows {
				if !yield(r, nil) {
					return
				}
			}
			if !more || len(rows) == 0 {
				return
			}
			after = rows[len(rows)-1].Key.Encode()
		}
	}
}

// Changes returns the group's row changes of schema.table after the
// change sequence after (at most limit; 0: MaxChanges), waiting up to
// wait for a first one, and the sequence to resume after: the group's
// change feed (runtime.Node.Watch), one long poll per call. An error
// matching runtime.ErrWatchLagged means changes after after were trimmed,
// and one matching runtime.ErrWatchRestored means after names a change of
// a history the group's store lost to a restore from an older copy: in
// both cases re-read the table (Scan) and resume from its last change.
// Sequences are not dense: they jump at each activation of the group
// (runtime.Change.Seq).
func (c Client) Changes(ctx context.Context, group, schema, table string, after uint64, limit int, wait time.Duration) ([]Change, uint64, error) {
	rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpChanges, Schema: schema, TableName: table, Seq: after, Limit: limit, Wait: int64(wait)})
	if err != nil {
		return nil, after, err
	}
	return rep.Changes, rep.Next, nil
}

// EventIDs lists every event id retained by the group.
func (c Client) EventIDs(ctx context.Context, group string) ([]messages.EventID, error) {
	var out []messages.EventID
	var seq uint64
	for {
		rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpEvents, Seq: seq})
		if err != nil {
			return nil, err
		}
		for _, b := range rep.IDs {
			var id messages.EventID
			if len(b) != len(id) {
				return nil, fmt.Errorf("%w: event id of %d bytes", ErrFailed, len(b))
			}
			copy(id[:], b)
			out = append(out, id)
		}
		if !rep.More {
			return out, nil
		}
		seq = rep.Next
	}
}

// Digest summarizes the group's retained events: their count and SHA-256
// over the sorted ids (equal sets, equal digests).
func (c Client) Digest(ctx context.Context, group string) (count uint64, hash []byte, member string, err error) {
	rep, err := c.do(ctx, KindGroup, group, &Request{Op: OpDigest})
	if err != nil {
		return 0, nil, "", err
	}
	return rep.Count, rep.Hash, rep.Member, nil
}

// Send sends body from the device from to the device to under the
// caller's logical id. It is idempotent: a repeat while (to, id) is
// pending hands the stored message off again (Message.Duplicate). An
// error matching device.ErrNotHandedOff means the message is pending but
// did not reach to's host: call Send again later.
func (c Client) Send(ctx context.Context, from, to messages.DeviceAddress, id messages.LogicalMessageID, body []byte) (Message, error) {
	rep, err := c.do(ctx, KindDevice, DeviceIdentity(from), &Request{Op: OpSend, Peer: &to, ID: id[:], Body: body})
	if err != nil {
		return Message{}, err
	}
	return first(rep)
}

// Commit commits the message (sender, id) received by the device dev
// (idempotent: a repeat reports runtime.AlreadyCommitted in Status).
func (c Client) Commit(ctx context.Context, dev, sender messages.DeviceAddress, id messages.LogicalMessageID) (Message, error) {
	rep, err := c.do(ctx, KindDevice, DeviceIdentity(dev), &Request{Op: OpCommit, Peer: &sender, ID: id[:]})
	if err != nil {
		return Message{}, err
	}
	return first(rep)
}

// Pending lists every received message of dev waiting for a commit.
func (c Client) Pending(ctx context.Context, dev messages.DeviceAddress) ([]Message, error) {
	return c.pages(ctx, dev, OpPending)
}

// PendingSent lists every message dev sent that is waiting for its ACK.
func (c Client) PendingSent(ctx context.Context, dev messages.DeviceAddress) ([]Message, error) {
	return c.pages(ctx, dev, OpPendingSent)
}

func (c Client) pages(ctx context.Context, dev messages.DeviceAddress, op Op) ([]Message, error) {
	var out []Message
	var seq uint64
	for {
		rep, err := c.do(ctx, KindDevice, DeviceIdentity(dev), &Request{Op: op, Seq: seq, Limit: MaxPendingPage})
		if err != nil {
			return nil, err
		}
		out = append(out, rep.Messages...)
		if !rep.More || rep.Next <= seq {
			return out, nil
		}
		seq = rep.Next
	}
}

// Processed returns dev's processed record of (sender, id): Status is a
// persistence.Finalization (1 committed, 2 discarded).
func (c Client) Processed(ctx context.Context, dev, sender messages.DeviceAddress, id messages.LogicalMessageID) (Message, bool, error) {
	rep, err := c.do(ctx, KindDevice, DeviceIdentity(dev), &Request{Op: OpProcessed, Peer: &sender, ID: id[:]})
	if err != nil {
		return Message{}, false, err
	}
	if !rep.Found {
		return Message{}, false, nil
	}
	m, err := first(rep)
	return m, err == nil, err
}

func first(rep *Reply) (Message, error) {
	if len(rep.Messages) != 1 {
		return Message{}, fmt.Errorf("%w: %d messages in reply", ErrFailed, len(rep.Messages))
	}
	return rep.Messages[0], nil
}
