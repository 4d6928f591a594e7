package wire

import (
	"fmt"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
)

// Registered names of the sync plane's wire types (SSP/1 §14).
const (
	// TypeSyncPush names an envelope holding a messages.SyncPush.
	TypeSyncPush = "ssp1.push"
	// TypePushResult names an envelope holding a messages.PushResult.
	TypePushResult = "ssp1.result"
	// TypeRejected names an envelope holding a Rejected answer.
	TypeRejected = "syncmesh.rejected"
)

// MaxRejectedReason bounds the reason of a Rejected answer.
const MaxRejectedReason = 1024

func init() {
	for _, err := range []error{
		Register(TypeSyncPush, decodePush),
		Register(TypePushResult, decodeResult),
		Register(TypeRejected, decodeRejected),
	} {
		if err != nil {
			panic(err) // static names; cannot fail
		}
	}
}

// Push carries a messages.SyncPush across the remote.
type Push struct {
	Push *messages.SyncPush
	// Size is the length of the CBOR it was decoded from (0 when built
	// locally).
	Size int
}

// Serialize implements remote.RootSerializable: the push, validated and
// encoded deterministically, in an Envelope of type TypeSyncPush.
func (p *Push) Serialize() (remote.RootSerialized, error) {
	if p == nil || p.Push == nil {
		return nil, ErrNilMessage
	}
	b, err := messages.EncodeSyncPush(p.Push)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeSyncPush, Cbor: b}, nil
}

func decodePush(b []byte) (*Push, error) {
	p, err := messages.DecodeSyncPush(b)
	if err != nil {
		return nil, err
	}
	return &Push{Push: p, Size: len(b)}, nil
}

// Result carries a messages.PushResult across the remote.
type Result struct {
	Result *messages.PushResult
	// Size is the length of the CBOR it was decoded from (0 when built
	// locally).
	Size int
}

// Serialize implements remote.RootSerializable: the result, validated and
// encoded deterministically, in an Envelope of type TypePushResult.
func (r *Result) Serialize() (remote.RootSerialized, error) {
	if r == nil || r.Result == nil {
		return nil, ErrNilMessage
	}
	b, err := messages.EncodePushResult(r.Result)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypePushResult, Cbor: b}, nil
}

func decodeResult(b []byte) (*Result, error) {
	r, err := messages.DecodePushResult(b)
	if err != nil {
		return nil, err
	}
	return &Result{Result: r, Size: len(b)}, nil
}

// Rejected answers a request the receiver did not process: the request was
// undecodable, the receiver has no handler, or the handler failed. The
// requester knows the request was not applied.
type Rejected struct {
	_      struct{} `cbor:",toarray"`
	Reason string
	// Size is the length of the CBOR it was decoded from (0 when built
	// locally); not encoded.
	Size int `cbor:"-"`
}

// Serialize implements remote.RootSerializable. An over-long reason is
// cut to MaxRejectedReason bytes.
func (r *Rejected) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, ErrNilMessage
	}
	reason := r.Reason
	if len(reason) > MaxRejectedReason {
		reason = reason[:MaxRejectedReason]
	}
	if !utf8.ValidString(reason) {
		reason = fmt.Sprintf("%q", reason)
		if len(reason) > MaxRejectedReason {
			reason = reason[:MaxRejectedReason-1] + "\""
		}
	}
	b, err := messages.Marshal(&Rejected{Reason: reason})
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeRejected, Cbor: b}, nil
}

func decodeRejected(b []byte) (*Rejected, error) {
	var r Rejected
	if err := messages.Unmarshal("rejected", b, &r, MaxRejectedReason+16); err != nil {
		return nil, err
	}
	if len(r.Reason) > MaxRejectedReason {
		return nil, fmt.Errorf("%w: reason of %d bytes", messages.ErrMalformed, len(r.Reason))
	}
	r.Size = len(b)
	return &r, nil
}
