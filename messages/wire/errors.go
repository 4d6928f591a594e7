package wire

import "errors"

// Errors of the registry and of decoding. An Undecodable's Err matches one
// of them or wraps a messages decode error (messages.ErrMalformed, ...).
var (
	// ErrUnknownType marks an envelope whose type name is not registered.
	ErrUnknownType = errors.New("wire: unknown type")
	// ErrDuplicateType is returned by Register for a name already taken.
	ErrDuplicateType = errors.New("wire: type already registered")
	// ErrInvalidName is returned by Register for an empty, over-long or
	// non-UTF-8 name.
	ErrInvalidName = errors.New("wire: invalid type name")
	// ErrDecoderPanic marks a frame whose registered decoder panicked.
	ErrDecoderPanic = errors.New("wire: decoder panicked")
	// ErrNotSendable is returned by Undecodable.Serialize: an undecodable
	// frame is never forwarded.
	ErrNotSendable = errors.New("wire: value cannot be sent")
	// ErrNilMessage marks a nil message handed to an encoder or a nil
	// envelope.
	ErrNilMessage = errors.New("wire: nil message")
)
