package hosting

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
)

// Registered wire names of the hosting messages. They travel as CBOR
// inside messages/wire's one protobuf Envelope (docs/architecture.md, "protoactor-go
// at the pinned version": remote serialization).
const (
	// TypeRequest names an envelope holding a *Request.
	TypeRequest = "syncmesh.hosting.request"
	// TypeReply names an envelope holding a *Reply.
	TypeReply = "syncmesh.hosting.reply"
)

// MaxFrame bounds the CBOR of one Request or Reply: a full apply batch
// (messages.MaxPushEvents signed events) fits comfortably.
const MaxFrame = 16 << 20

func init() {
	for _, err := range []error{
		wire.Register(TypeRequest, DecodeRequest),
		wire.Register(TypeReply, DecodeReply),
	} {
		if err != nil {
			panic(err) // static names; cannot fail
		}
	}
}

// Op is the operation of a Request.
type Op uint8

// Operations. The numbers are part of the wire format. Every mutating
// operation is idempotent, because a request may be delivered more than
// once (cluster requests are retried on timeout; callers retry on
// ErrUnavailable).
const (
	// OpInfo reports the member hosting the unit (any kind); it activates
	// the unit.
	OpInfo Op = 1
	// OpCreate provisions the unit for the principal's tenant (its owner),
	// within the tenant's quota (idempotent: the owner creating it again
	// changes nothing). No other operation makes a unit.
	OpCreate Op = 2
	// OpDelete closes the unit and removes its files (idempotent: a
	// deleted unit is not provisioned).
	OpDelete Op = 3

	// OpDefineTable defines Table on a group (idempotent: same definition).
	OpDefineTable Op = 10
	// OpTrust adds or replaces the signer Signer on a group (idempotent).
	OpTrust Op = 11
	// OpApply applies the signed events Events on a group (idempotent by
	// event id: a repeat is a Duplicate outcome).
	OpApply Op = 12
	// OpGet reads the row RowKey of Schema.TableName on a group.
	OpGet Op = 13
	// OpScan reads up to Limit rows of Schema.TableName after the encoded
	// key After.
	OpScan Op = 14
	// OpEvents lists up to Limit retained event ids after the log sequence
	// Seq.
	OpEvents Op = 15
	// OpDigest summarizes a group's retained events (count and a hash of
	// the sorted ids).
	OpDigest Op = 16
	// OpChanges pages the row changes of Schema.TableName on a group after
	// the change sequence Seq (up to Limit), waiting up to Wait for the
	// first one (a long poll: the group's change feed).
	OpChanges Op = 17

	// OpSend stores Body as a pending sent message to Peer under the
	// caller's logical id ID and hands it off (idempotent: when (Peer, ID)
	// is already pending, it is re-encrypted and handed off again).
	OpSend Op = 20
	// OpDeliver hands the envelope Envelope from the device Peer to a
	// device (what the hosted devices' transport sends).
	OpDeliver Op = 21
	// OpBundle issues a prekey bundle of a device.
	OpBundle Op = 22
	// OpCommit commits the received message (Peer, ID) (idempotent:
	// ALREADY_COMMITTED).
	OpCommit Op = 23
	// OpPending pages pending received messages after the sequence Seq.
	OpPending Op = 24
	// OpPendingSent pages pending sent messages after the sequence Seq.
	OpPendingSent Op = 25
	// OpProcessed reads the processed record of the message (Peer, ID).
	OpProcessed Op = 26
	// OpDiscard finalizes the received message (Peer, ID) without applying
	// it, with the discard reason Reason (idempotent).
	OpDiscard Op = 27
	// OpPrune removes processed records finalized at least MaxAge ago.
	OpPrune Op = 28
)

// String returns the operation's name.
func (o Op) String() string {
	switch o {
	case OpInfo:
		return "info"
	case OpCreate:
		return "create"
	case OpDelete:
		return "delete"
	case OpDiscard:
		return "discard"
	case OpPrune:
		return "prune"
	case OpDefineTable:
		return "define-table"
	case OpTrust:
		return "trust"
	case OpApply:
		return "apply"
	case OpGet:
		return "get"
	case OpScan:
		return "scan"
	case OpEvents:
		return "events"
	case OpDigest:
		return "digest"
	case OpChanges:
		return "changes"
	case OpSend:
		return "send"
	case OpDeliver:
		return "deliver"
	case OpBundle:
		return "bundle"
	case OpCommit:
		return "commit"
	case OpPending:
		return "pending"
	case OpPendingSent:
		return "pending-sent"
	case OpProcessed:
		return "processed"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Table is a table definition on the wire.
type Table struct {
	Schema     string   `cbor:"1,keyasint"`           // schema name
	Table      string   `cbor:"2,keyasint"`           // table name
	KeyColumns []string `cbor:"3,keyasint"`           // key columns, in order
	Columns    []string `cbor:"4,keyasint,omitempty"` // value columns
}

// Signer is a trusted signer on the wire (runtime.PeerKey).
type Signer struct {
	Kid       []byte `cbor:"1,keyasint"`           // key id (empty: derived from PublicKey)
	Site      []byte `cbor:"2,keyasint"`           // 16-byte site id
	PublicKey []byte `cbor:"3,keyasint"`           // Ed25519 public key
	Cutoff    uint64 `cbor:"4,keyasint,omitempty"` // retirement cutoff HLC (0: none)
}

// Request is one operation on a hosted unit. Which fields matter depends
// on Op (see the Op constants).
type Request struct {
	Op        Op                      `cbor:"1,keyasint"`            // the operation
	Events    [][]byte                `cbor:"2,keyasint,omitempty"`  // OpApply: signed events (COSE_Sign1)
	Table     *Table                  `cbor:"3,keyasint,omitempty"`  // OpDefineTable
	Signer    *Signer                 `cbor:"4,keyasint,omitempty"`  // OpTrust
	Schema    string                  `cbor:"5,keyasint,omitempty"`  // OpGet, OpScan
	TableName string                  `cbor:"6,keyasint,omitempty"`  // OpGet, OpScan
	RowKey    messages.Columns        `cbor:"7,keyasint,omitempty"`  // OpGet: the row's key columns
	After     []byte                  `cbor:"8,keyasint,omitempty"`  // OpScan: resume after this encoded key
	Seq       uint64                  `cbor:"9,keyasint,omitempty"`  // OpEvents, OpPending, OpPendingSent: cursor
	Limit     int                     `cbor:"10,keyasint,omitempty"` // page size (0: the maximum)
	Peer      *messages.DeviceAddress `cbor:"11,keyasint,omitempty"` // the other device: recipient, sender or filter
	ID        []byte                  `cbor:"12,keyasint,omitempty"` // 16-byte logical message id
	Body      []byte                  `cbor:"13,keyasint,omitempty"` // OpSend: the message body
	Envelope  []byte                  `cbor:"14,keyasint,omitempty"` // OpDeliver: a ratchet envelope
	// Principal is who the call acts for (Client: from its context,
	// WithPrincipal), vouched for by the calling member.
	Principal *Principal `cbor:"15,keyasint,omitempty"`
	// Caller is the member that sent the request: its certificate's
	// name. The receiving member sets it from the authenticated
	// connection; whatever a remote caller put here is replaced.
	Caller string `cbor:"16,keyasint,omitempty"`
	// Reason is OpDiscard's discard reason (runtime.DiscardReason).
	Reason uint8 `cbor:"17,keyasint,omitempty"`
	// MaxAge is OpPrune's retention (nanoseconds, > 0).
	MaxAge int64 `cbor:"18,keyasint,omitempty"`
	// Wait is how long OpChanges waits for a first change (nanoseconds;
	// at most MaxChangesWait).
	Wait int64 `cbor:"19,keyasint,omitempty"`
}

// Serialize implements remote.RootSerializable: the request in an
// Envelope of type TypeRequest.
func (r *Request) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, wire.ErrNilMessage
	}
	return frame(TypeRequest, "request", r)
}

// DecodeRequest decodes a Request with the strict codec; it never panics.
func DecodeRequest(b []byte) (*Request, error) {
	var r Request
	if err := messages.Unmarshal("hosting request", b, &r, MaxFrame); err != nil {
		return nil, err
	}
	if r.Op == 0 {
		return nil, fmt.Errorf("%w: hosting request without op", messages.ErrMalformed)
	}
	return &r, nil
}

// Code classifies a failed Reply.
type Code uint8

// Reply codes. The numbers are part of the wire format.
const (
	// CodeOK: the operation succeeded.
	CodeOK Code = 0
	// CodeUnavailable: the unit is not available here now (its member is
	// stopping, its storage is still locked by a previous host, or it is
	// closing); nothing was done and the request may be retried.
	CodeUnavailable Code = 1
	// CodeBadRequest: the request is malformed or does not fit the kind.
	CodeBadRequest Code = 2
	// CodeFailed: the operation failed; Error says why.
	CodeFailed Code = 3
	// CodeNotHandedOff: a Send stored the message as pending but could not
	// hand it to the recipient (it stays pending; send it again later).
	CodeNotHandedOff Code = 4
	// CodeNotPending: the sent message is not pending.
	CodeNotPending Code = 5
	// CodeUnknownTable: the table is not defined on the group.
	CodeUnknownTable Code = 6
	// CodeForbidden: the caller may not do this (ErrForbidden).
	CodeForbidden Code = 7
	// CodeNotProvisioned: the unit does not exist (ErrNotProvisioned).
	CodeNotProvisioned Code = 8
	// CodeQuota: the tenant's unit quota is reached (ErrQuota).
	CodeQuota Code = 9
	// CodeLagged: a change feed's cursor fell behind the retained change
	// log (runtime.ErrWatchLagged).
	CodeLagged Code = 10
	// CodeRestored: a change feed's cursor names a change of a history
	// the group's store lost to a restore from an older copy
	// (runtime.ErrWatchRestored).
	CodeRestored Code = 11
)

// Outcome is one event's apply outcome on the wire (messages.Outcome).
type Outcome struct {
	Kind   uint8  `cbor:"1,keyasint"`           // messages.OutcomeKind
	Reason uint8  `cbor:"2,keyasint,omitempty"` // messages.Reason
	ID     []byte `cbor:"3,keyasint,omitempty"` // the event id
}

// Cell is one column of a row on the wire: State is a runtime.CellState,
// Value the column's encoded CBOR value (a messages.Value; empty when
// Unmaterialized), carried as a byte string.
type Cell struct {
	State uint8  `cbor:"1,keyasint"`           // runtime.CellState
	Value []byte `cbor:"2,keyasint,omitempty"` // encoded messages.Value
}

// Decode decodes the cell's value into out (see messages.Value.Decode).
func (c Cell) Decode(out any) error {
	if len(c.Value) == 0 {
		return fmt.Errorf("%w: cell has no value (state %d)", messages.ErrMalformed, c.State)
	}
	return messages.Value(c.Value).Decode(out)
}

// Row is a materialized row on the wire.
type Row struct {
	Key    messages.Columns `cbor:"1,keyasint"`           // key columns
	Exists bool             `cbor:"2,keyasint,omitempty"` // false: tombstoned
	Cells  map[string]Cell  `cbor:"3,keyasint,omitempty"` // one per value column
}

// Change is one row change of a group's change feed on the wire
// (runtime.Change).
type Change struct {
	Seq    uint64           `cbor:"1,keyasint"`           // change sequence (resume after it)
	Key    messages.Columns `cbor:"2,keyasint"`           // the row's key columns
	Exists bool             `cbor:"3,keyasint,omitempty"` // false: tombstoned
	Cells  map[string]Cell  `cbor:"4,keyasint,omitempty"` // the columns the change touched
	Cause  uint8            `cbor:"5,keyasint,omitempty"` // runtime.ChangeCause
}

// Message is a pending received or sent message, or a processed record,
// on the wire.
type Message struct {
	Peer      messages.DeviceAddress `cbor:"1,keyasint"`           // sender (received) or recipient (sent)
	ID        []byte                 `cbor:"2,keyasint"`           // 16-byte logical id
	Seq       uint64                 `cbor:"3,keyasint,omitempty"` // receive or send sequence
	Body      []byte                 `cbor:"4,keyasint,omitempty"` // plaintext
	Status    uint8                  `cbor:"5,keyasint,omitempty"` // OpCommit, OpDiscard: runtime outcome; OpProcessed: persistence.Finalization
	AckSent   bool                   `cbor:"6,keyasint,omitempty"` // OpCommit: the ACK was handed off
	Duplicate bool                   `cbor:"7,keyasint,omitempty"` // OpSend: a repeat of a pending message
}

// Reply answers a Request. Member names the member that served it (the
// unit's current host).
type Reply struct {
	Member   string    `cbor:"1,keyasint"`            // the member that served the request
	Code     Code      `cbor:"2,keyasint,omitempty"`  // CodeOK or why it failed
	Error    string    `cbor:"3,keyasint,omitempty"`  // the failure, readable
	Outcomes []Outcome `cbor:"4,keyasint,omitempty"`  // OpApply: one per event
	Found    bool      `cbor:"5,keyasint,omitempty"`  // OpGet, OpProcessed
	Rows     []Row     `cbor:"6,keyasint,omitempty"`  // OpGet, OpScan
	IDs      [][]byte  `cbor:"7,keyasint,omitempty"`  // OpEvents: event ids in log order
	Next     uint64    `cbor:"8,keyasint,omitempty"`  // paging cursor
	More     bool      `cbor:"9,keyasint,omitempty"`  // more pages follow
	Count    uint64    `cbor:"10,keyasint,omitempty"` // OpDigest: retained events
	Hash     []byte    `cbor:"11,keyasint,omitempty"` // OpDigest: SHA-256 of the sorted ids
	Bundle   []byte    `cbor:"12,keyasint,omitempty"` // OpBundle: encoded prekey bundle
	Messages []Message `cbor:"13,keyasint,omitempty"` // device operations
	Kind     uint8     `cbor:"14,keyasint,omitempty"` // OpDeliver: the runtime receive outcome
	// MemberID is the incarnation of the member that served the request
	// (its cluster member id: a member that fenced itself rejoins under a
	// new one).
	MemberID string `cbor:"15,keyasint,omitempty"`
	// Epoch is the activation epoch of the unit that served it (unique
	// and increasing per unit, persisted with the unit's files).
	Epoch uint64 `cbor:"16,keyasint,omitempty"`
	// ActivatedAt is when that activation began serving (Unix ns).
	ActivatedAt int64 `cbor:"17,keyasint,omitempty"`
	// ServedAt is when the operation completed, inside the activation
	// (Unix ns): every successful reply of an activation has ActivatedAt
	// ≤ ServedAt < the next activation's ActivatedAt.
	ServedAt int64 `cbor:"18,keyasint,omitempty"`
	// Changes is OpChanges' page (Next: the sequence to resume after).
	Changes []Change `cbor:"19,keyasint,omitempty"`
	// Term is, for a replicated unit, the consensus term of its
	// partition the reply was served and fenced in (0: not replicated):
	// its member led the partition in that term from the activation's
	// start to the reply.
	Term uint64 `cbor:"20,keyasint,omitempty"`
}

// Serialize implements remote.RootSerializable: the reply in an Envelope
// of type TypeReply.
func (r *Reply) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, wire.ErrNilMessage
	}
	return frame(TypeReply, "reply", r)
}

// frame encodes v into an Envelope of type typ, refusing what
// DecodeRequest or DecodeReply would refuse: more than MaxFrame bytes, or
// an array or map past the strict decoder's bounds (the writer checks the
// reader's limits, so a frame sent is a frame read).
func frame(typ, what string, v any) (remote.RootSerialized, error) {
	b, err := messages.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFrame {
		return nil, fmt.Errorf("%w: %s of %d bytes, limit %d", messages.ErrTooLarge, what, len(b), MaxFrame)
	}
	if err := messages.CheckReadable("hosting "+what, b); err != nil {
		return nil, err
	}
	return &wire.Envelope{Type: typ, Cbor: b}, nil
}

// DecodeReply decodes a Reply with the strict codec; it never panics.
func DecodeReply(b []byte) (*Reply, error) {
	var r Reply
	if err := messages.Unmarshal("hosting reply", b, &r, MaxFrame); err != nil {
		return nil, err
	}
	return &r, nil
}

// Err returns the reply's error (nil for CodeOK) as a *ReplyError.
func (r *Reply) Err() error {
	if r == nil {
		return &ReplyError{Code: CodeFailed, Message: "nil reply"}
	}
	if r.Code == CodeOK {
		return nil
	}
	return &ReplyError{Code: r.Code, Member: r.Member, Message: r.Error}
}
