package materialize

import "errors"

// Errors returned by ResolveKey; both mean the event is dropped (§13.6).
var (
	ErrUnknownKeyColumn = errors.New("materialize: row key names a column the table does not have")
	ErrIncompleteKey    = errors.New("materialize: row key lacks a key column of the table")
)
