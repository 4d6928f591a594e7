package wire

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
)

// Registered names of the reconciliation wire types (range-based
// set reconciliation between two peers over the remote).
const (
	// TypeReconcileRequest names a reconciliation request: a range
	// message (messages.Reconcile) or a fetch (messages.ReconcileFetch).
	TypeReconcileRequest = "ssp1.reconcile"
	// TypeReconcileReply names the answer to a TypeReconcileRequest.
	TypeReconcileReply = "ssp1.reconcile_reply"
)

// Limits of the reconciliation wire types: the same for the writer
// (Serialize) and the reader (the registered decoder).
const (
	// MaxReconcileRequestBody bounds a request's body: a range message or
	// a fetch.
	MaxReconcileRequestBody = messages.MaxReconcileBytes
	// MaxReconcileReplyBody bounds a reply's body: a range message or the
	// fetched events.
	MaxReconcileReplyBody = max(messages.MaxReconcileBytes, messages.MaxReconcileEventBytes)
	// maxReconcileName bounds the peer names of a request.
	maxReconcileName = 256
	// reconcileFraming is the CBOR around a body (field names, lengths,
	// names and reason).
	reconcileFraming = 2*maxReconcileName + MaxRejectedReason + 64
)

// ReconcileStatus says how a reconciliation request was answered.
type ReconcileStatus uint8

// Reconciliation reply statuses.
const (
	// ReconcileOK: Body is the answer.
	ReconcileOK ReconcileStatus = iota
	// ReconcileBusy: the responder is already serving a session for this
	// requester (or cannot take one now); try later. Nothing changed.
	ReconcileBusy
	// ReconcileInvalid: the request was malformed, oversized or broke the
	// protocol; it changed nothing at the responder.
	ReconcileInvalid
	// ReconcileFailed: the responder could not answer (closing, storage).
	ReconcileFailed
	reconcileStatuses
)

// ReconcileRequest carries one reconciliation request from peer From to
// peer To. It is a CBOR map whose "from" the stream guard reads, like a
// push's, to bind the request to the TLS-authenticated peer: From is
// never trusted for itself.
type ReconcileRequest struct {
	From string `cbor:"from"`
	To   string `cbor:"to,omitempty"`
	Kind uint8  `cbor:"kind"`
	Body []byte `cbor:"body"`
	// Size is the length of the CBOR it was decoded from; not encoded.
	Size int `cbor:"-"`
}

func (r *ReconcileRequest) validate() error {
	switch {
	case r.From == "" || len(r.From) > maxReconcileName || len(r.To) > maxReconcileName:
		return fmt.Errorf("%w: reconcile request names of %d and %d bytes", messages.ErrMalformed, len(r.From), len(r.To))
	case r.Kind == 0:
		return fmt.Errorf("%w: reconcile request kind 0", messages.ErrMalformed)
	case len(r.Body) == 0:
		return fmt.Errorf("%w: empty reconcile request", messages.ErrMalformed)
	case len(r.Body) > MaxReconcileRequestBody:
		return fmt.Errorf("%w: reconcile request of %d bytes, limit %d", messages.ErrTooLarge, len(r.Body), MaxReconcileRequestBody)
	}
	return nil
}

// Serialize implements remote.RootSerializable.
func (r *ReconcileRequest) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, ErrNilMessage
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	b, err := messages.Marshal(r)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeReconcileRequest, Cbor: b}, nil
}

func decodeReconcileRequest(b []byte) (*ReconcileRequest, error) {
	var r ReconcileRequest
	if err := messages.Unmarshal("reconcile request", b, &r, MaxReconcileRequestBody+reconcileFraming); err != nil {
		return nil, err
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	r.Size = len(b)
	return &r, nil
}

// ReconcileReply answers a ReconcileRequest: Status, and Body (the
// answer) when it is ReconcileOK, or Reason otherwise.
type ReconcileReply struct {
	_      struct{} `cbor:",toarray"`
	Status ReconcileStatus
	Body   []byte
	Reason string
	// Size is the length of the CBOR it was decoded from; not encoded.
	Size int `cbor:"-"`
}

func (r *ReconcileReply) validate() error {
	switch {
	case r.Status >= reconcileStatuses:
		return fmt.Errorf("%w: reconcile reply status %d", messages.ErrMalformed, r.Status)
	case r.Status == ReconcileOK && len(r.Body) == 0:
		return fmt.Errorf("%w: empty reconcile reply", messages.ErrMalformed)
	case r.Status != ReconcileOK && len(r.Body) != 0:
		return fmt.Errorf("%w: reconcile reply with status %d has a body", messages.ErrMalformed, r.Status)
	case len(r.Body) > MaxReconcileReplyBody:
		return fmt.Errorf("%w: reconcile reply of %d bytes, limit %d", messages.ErrTooLarge, len(r.Body), MaxReconcileReplyBody)
	case len(r.Reason) > MaxRejectedReason || !utf8.ValidString(r.Reason):
		return fmt.Errorf("%w: reconcile reply reason of %d bytes", messages.ErrMalformed, len(r.Reason))
	}
	return nil
}

// Serialize implements remote.RootSerializable. An over-long reason is
// cut to MaxRejectedReason bytes, invalid UTF-8 in it replaced.
func (r *ReconcileReply) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, ErrNilMessage
	}
	out := *r
	if len(out.Reason) > MaxRejectedReason {
		out.Reason = out.Reason[:MaxRejectedReason]
	}
	// Cutting may split a rune; replacing never grows past the cut by
	// more than a replacement character, so cut again.
	for !utf8.ValidString(out.Reason) || len(out.Reason) > MaxRejectedReason {
		out.Reason = strings.ToValidUTF8(out.Reason, "?")
		if len(out.Reason) > MaxRejectedReason {
			out.Reason = out.Reason[:MaxRejectedReason]
		}
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	b, err := messages.Marshal(&out)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeReconcileReply, Cbor: b}, nil
}

func decodeReconcileReply(b []byte) (*ReconcileReply, error) {
	var r ReconcileReply
	if err := messages.Unmarshal("reconcile reply", b, &r, MaxReconcileReplyBody+reconcileFraming); err != nil {
		return nil, err
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	r.Size = len(b)
	return &r, nil
}

func init() {
	for _, err := range []error{
		Register(TypeReconcileRequest, decodeReconcileRequest),
		Register(TypeReconcileReply, decodeReconcileReply),
	} {
		if err != nil {
			panic(err) // static names; cannot fail
		}
	}
}
