package messages

import (
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// DecodeError describes why an input failed to decode. It matches
// ErrMalformed and, where one applies, the more specific sentinel in Kind.
type DecodeError struct {
	What string // what was being decoded, e.g. "event"
	Kind error  // one of the sentinels above, or nil
	Err  error  // the underlying cause, or nil
}

// Error implements the error interface.
func (e *DecodeError) Error() string {
	msg := "messages: decode " + e.What
	if e.Kind != nil && e.Kind != ErrMalformed {
		msg += ": " + e.Kind.Error()
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrMalformed or the error's specific kind.
func (e *DecodeError) Is(target error) bool {
	return target == ErrMalformed || (e.Kind != nil && target == e.Kind)
}

// Unwrap returns the underlying cause.
func (e *DecodeError) Unwrap() error { return e.Err }

func decodeErr(what string, kind error, err error) error {
	return &DecodeError{What: what, Kind: kind, Err: err}
}

// Limits applied by the strict decoder.
const (
	maxNesting   = 16
	maxArrayLen  = 4096
	maxMapPairs  = 4096
	maxValueSize = 64 << 10
)

// Bounds of the strict decoder that every writer must stay within too:
// an array or map longer than these is refused by every reader, so a
// message that carries a list of items pages it at no more than these.
const (
	// MaxArrayElements bounds the elements of one decoded array.
	MaxArrayElements = maxArrayLen
	// MaxMapPairs bounds the pairs of one decoded map.
	MaxMapPairs = maxMapPairs
)

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	encOpts := cbor.CoreDetEncOptions()
	encOpts.Time = cbor.TimeUnixMicro
	if encMode, err = encOpts.EncMode(); err != nil {
		panic(err) // static options; cannot fail at run time
	}
	decMode, err = cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		MaxNestedLevels:   maxNesting,
		MaxArrayElements:  maxArrayLen,
		MaxMapPairs:       maxMapPairs,
		IndefLength:       cbor.IndefLengthForbidden,
		TagsMd:            cbor.TagsForbidden,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		UTF8:              cbor.UTF8RejectInvalid,
		DefaultMapType:    nil,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// Marshal encodes v with Core Deterministic Encoding.
func Marshal(v any) ([]byte, error) { return encMode.Marshal(v) }

// Unmarshal decodes exactly one data item from data into v with the strict
// decoder: trailing bytes, duplicate keys, unknown struct fields,
// indefinite lengths and tags are errors. what names the record in errors.
func Unmarshal(what string, data []byte, v any, maxSize int) error {
	if maxSize > 0 && len(data) > maxSize {
		return decodeErr(what, ErrTooLarge, fmt.Errorf("%d bytes, limit %d", len(data), maxSize))
	}
	err := decMode.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var extra *cbor.ExtraneousDataError
	if errors.As(err, &extra) {
		return decodeErr(what, ErrTrailingBytes, err)
	}
	return decodeErr(what, ErrMalformed, err)
}

// Wellformed reports whether data is exactly one well-formed data item that
// the strict decoder accepts.
func Wellformed(data []byte) error {
	return decMode.Wellformed(data)
}

// CheckReadable is the writer's side of the decoder's bounds: it returns
// an error matching ErrTooLarge when data, encoded by Marshal, nests
// deeper or holds a longer array or map than the strict decoder accepts
// (MaxArrayElements, MaxMapPairs), so a writer refuses what no reader
// would take instead of sending it. what names the record in errors.
func CheckReadable(what string, data []byte) error {
	err := decMode.Wellformed(data)
	if err == nil {
		return nil
	}
	var (
		arr   *cbor.MaxArrayElementsError
		pairs *cbor.MaxMapPairsError
		nest  *cbor.MaxNestedLevelError
	)
	if errors.As(err, &arr) || errors.As(err, &pairs) || errors.As(err, &nest) {
		return fmt.Errorf("%w: %s past the decoder's bounds: %w", ErrTooLarge, what, err)
	}
	return decodeErr(what, ErrMalformed, err)
}
