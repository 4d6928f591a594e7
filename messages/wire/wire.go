// Package wire carries syncmesh messages across protoactor-go's remote
// (gRPC) transport.
//
// At the pinned protoactor-go version a custom serializer is never selected
// and a protobuf type unknown to the receiver crashes it, so exactly one
// protobuf message crosses the wire: Envelope{type, cbor}. Each wire type
// implements remote.RootSerializable (Serialize returns its Envelope) and
// the Envelope implements remote.RootSerialized: Deserialize looks the type
// name up in a registry and decodes the CBOR with the strict codec of
// package messages (docs/architecture.md, "protoactor-go at the pinned version").
//
// Deserialize never returns an error, because an error there tears down
// the whole inbound gRPC stream and loses the rest of its batch: a frame
// that does not decode becomes an *Undecodable value delivered to the
// target actor, which surfaces it.
//
// wire.pb.go is generated from wire.proto by `make proto` and committed, so
// builds need no protoc.
package wire

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/remote"
)

// MaxTypeName bounds a registered type name. Names of received envelopes
// longer than this are truncated in Undecodable.Type.
const MaxTypeName = 128

// decodeFunc is the type-erased form of a registered decoder.
type decodeFunc func([]byte) (remote.RootSerializable, error)

var (
	regMu    sync.RWMutex
	registry = map[string]decodeFunc{}
)

// Register adds a wire type: envelopes whose type is name are decoded by
// decode. The decoded value must be a remote.RootSerializable (protoactor
// requires it of RootSerialized.Deserialize's result), so the type
// parameter makes that a compile-time check. decode must reject bad input
// with an error, never panic (a panic is recovered and surfaced as
// ErrDecoderPanic). Register is safe for concurrent use; it is meant to be
// called from init functions. Errors match ErrInvalidName or
// ErrDuplicateType.
func Register[T remote.RootSerializable](name string, decode func([]byte) (T, error)) error {
	if name == "" || len(name) > MaxTypeName || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q", ErrInvalidName, truncate(name))
	}
	if decode == nil {
		return fmt.Errorf("%w: nil decoder for %q", ErrInvalidName, name)
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, ok := registry[name]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateType, name)
	}
	registry[name] = func(b []byte) (remote.RootSerializable, error) {
		v, err := decode(b)
		if err != nil {
			return nil, err
		}
		if isNil(v) {
			return nil, ErrNilMessage
		}
		return v, nil
	}
	return nil
}

// Registered reports whether name is a registered wire type.
func Registered(name string) bool {
	regMu.RLock()
	defer regMu.RUnlock()
	_, ok := registry[name]
	return ok
}

func lookup(name string) decodeFunc {
	regMu.RLock()
	defer regMu.RUnlock()
	return registry[name]
}

// Undecodable is what Envelope.Deserialize yields for a frame it cannot
// decode: an unregistered type, CBOR the type's decoder rejects, or a
// decoder panic. It reaches the target actor (or the requester's future)
// in place of the message, so the stream behind it keeps working and the
// receiver can count, log and answer it.
type Undecodable struct {
	// Type is the envelope's type name as received, truncated to
	// MaxTypeName bytes. It is chosen by the sender: do not use it as a
	// metric label unless Known.
	Type string
	// Known reports whether Type is a registered wire type.
	Known bool
	// Size is the length of the envelope's CBOR payload.
	Size int
	// Err says why the frame did not decode; it matches ErrUnknownType,
	// ErrDecoderPanic, ErrNilMessage or a messages decode error.
	Err error
}

// Error implements the error interface.
func (u *Undecodable) Error() string {
	return fmt.Sprintf("wire: undecodable %q frame of %d bytes: %v", u.Type, u.Size, u.Err)
}

// Unwrap returns the cause.
func (u *Undecodable) Unwrap() error { return u.Err }

// Serialize implements remote.RootSerializable; an undecodable frame is
// never sent on, so it always fails with ErrNotSendable.
func (u *Undecodable) Serialize() (remote.RootSerialized, error) {
	return nil, ErrNotSendable
}

// Deserialize implements remote.RootSerialized. It never returns an error:
// a frame that does not decode yields an *Undecodable (see the package
// documentation).
func (e *Envelope) Deserialize() (remote.RootSerializable, error) {
	if e == nil {
		return &Undecodable{Err: ErrNilMessage}, nil
	}
	name := e.GetType()
	data := e.GetCbor()
	decode := lookup(name)
	if decode == nil {
		return &Undecodable{Type: truncate(name), Size: len(data), Err: fmt.Errorf("%w: %q", ErrUnknownType, truncate(name))}, nil
	}
	v, err := safeDecode(decode, data)
	if err == nil && v == nil {
		err = ErrNilMessage
	}
	if err != nil {
		return &Undecodable{Type: name, Known: true, Size: len(data), Err: err}, nil
	}
	return v, nil
}

func safeDecode(decode decodeFunc, data []byte) (v remote.RootSerializable, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("%w: %v", ErrDecoderPanic, p)
		}
	}()
	return decode(data)
}

// EnvelopeOf serializes m eagerly into its envelope, so encoding errors
// reach the caller instead of being logged and dropped inside protoactor's
// endpoint writer.
func EnvelopeOf(m remote.RootSerializable) (*Envelope, error) {
	if m == nil {
		return nil, ErrNilMessage
	}
	s, err := m.Serialize()
	if err != nil {
		return nil, err
	}
	env, ok := s.(*Envelope)
	if !ok || env == nil {
		return nil, fmt.Errorf("wire: %T serializes to %T, not *wire.Envelope", m, s)
	}
	return env, nil
}

// isNil reports whether v is nil or a typed nil (a nil pointer, map, ...
// in a non-nil interface).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

func truncate(s string) string {
	if len(s) <= MaxTypeName && utf8.ValidString(s) {
		return s
	}
	if len(s) > 4*MaxTypeName {
		s = s[:4*MaxTypeName]
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	for len(s) > MaxTypeName {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s
}
