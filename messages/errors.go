package messages

import "errors"

// Sentinel errors of the codec. Every decode failure matches ErrMalformed.
var (
	// ErrMalformed is matched by every decode failure.
	ErrMalformed = errors.New("messages: malformed input")
	// ErrUnsupportedVersion marks a well-formed record of a version this build does not know.
	ErrUnsupportedVersion = errors.New("messages: unsupported version")
	// ErrTrailingBytes marks input with bytes after the first data item.
	ErrTrailingBytes = errors.New("messages: trailing bytes")
	// ErrTooLarge marks input over the decoder's size limit.
	ErrTooLarge = errors.New("messages: input too large")
	// ErrEmptyRowKey marks an event whose key is null or an empty map (SSP/1 §13.6).
	ErrEmptyRowKey = errors.New("messages: row key is null or empty")
)

// ErrSyncInvalid marks a push or push result that decodes as CBOR but
// breaks a rule of the §14 protocol (sequence order, ranges, sizes).
var ErrSyncInvalid = errors.New("messages: invalid sync message")

// ErrReconcileInvalid marks a reconciliation message that decodes as CBOR
// but breaks a rule of the protocol (order of bounds and keys, sizes,
// fields that do not belong to a range's mode).
var ErrReconcileInvalid = errors.New("messages: invalid reconciliation message")
