package messages

import (
	"errors"
	"fmt"
)

// ColumnType is the declared type of a table column. It is local to each
// node's table definition and never travels in an event: a value is
// signed as written, and a node checks it against its own declaration
// (SSP/1 §13.1 resolves cells by clock, whatever their type, so nodes
// with different declarations still converge on the same bytes).
type ColumnType uint8

// Column types. TypeAny (the zero value) accepts every value; the others
// accept the CBOR null (an explicit null cell) and their own kind.
const (
	// TypeAny: any value (the type of a column declared without one).
	TypeAny ColumnType = iota
	// TypeInteger: a CBOR integer (major type 0 or 1).
	TypeInteger
	// TypeFloat: a CBOR float, or an integer (every integer reads into a
	// float64, the larger ones rounded).
	TypeFloat
	// TypeText: a CBOR text string.
	TypeText
	// TypeBytes: a CBOR byte string.
	TypeBytes
	// TypeBool: CBOR true or false.
	TypeBool
	// TypeTimestamp: seconds since the Unix epoch as a CBOR integer or
	// float (how a time.Time encodes: microsecond precision), read back
	// into a time.Time.
	TypeTimestamp

	// typeEnd is one past the last type this build knows.
	typeEnd
)

var typeNames = [...]string{"any", "integer", "float", "text", "bytes", "bool", "timestamp"}

// String returns the type's name ("any", "integer", …).
func (t ColumnType) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Known reports whether this build knows t. A definition stored by a
// newer build may name a type this one does not: it is read as TypeAny.
func (t ColumnType) Known() bool { return t < typeEnd }

// ParseColumnType returns the type named s ("" is TypeAny).
func ParseColumnType(s string) (ColumnType, error) {
	if s == "" {
		return TypeAny, nil
	}
	for i, n := range typeNames {
		if n == s {
			return ColumnType(i), nil
		}
	}
	return TypeAny, fmt.Errorf("%w: column type %q", ErrMalformed, s)
}

// ErrTypeMismatch matches every *TypeError.
var ErrTypeMismatch = errors.New("value does not match the column's type")

// TypeError says that a column's value is not of its declared type.
type TypeError struct {
	Column string
	Want   ColumnType
	// Got names the value's CBOR kind ("text", "integer", "map", …).
	Got string
}

// Error implements the error interface.
func (e *TypeError) Error() string {
	return fmt.Sprintf("column %q is %s, value is %s", e.Column, e.Want, e.Got)
}

// Is matches ErrTypeMismatch.
func (e *TypeError) Is(target error) bool { return target == ErrTypeMismatch }

// Check returns a *TypeError when v (a well-formed data item) is not of
// type t; the null and every value of TypeAny (or of a type this build
// does not know) pass.
func (t ColumnType) Check(column string, v Value) error {
	if t == TypeAny || !t.Known() || len(v) == 0 || v.IsNull() {
		return nil
	}
	kind := v.Kind()
	ok := false
	switch t {
	case TypeInteger:
		ok = kind == "integer"
	case TypeFloat, TypeTimestamp:
		ok = kind == "integer" || kind == "float"
	case TypeText:
		ok = kind == "text"
	case TypeBytes:
		ok = kind == "bytes"
	case TypeBool:
		ok = kind == "bool"
	}
	if ok {
		return nil
	}
	return &TypeError{Column: column, Want: t, Got: kind}
}

// Kind names the CBOR kind of v's data item: "integer", "bytes", "text",
// "array", "map", "tag", "bool", "null", "undefined", "float", "simple",
// or "empty" for no bytes.
func (v Value) Kind() string {
	if len(v) == 0 {
		return "empty"
	}
	switch major := v[0] >> 5; major {
	case 0, 1:
		return "integer"
	case 2:
		return "bytes"
	case 3:
		return "text"
	case 4:
		return "array"
	case 5:
		return "map"
	case 6:
		return "tag"
	}
	switch info := v[0] & 0x1f; {
	case info == 20 || info == 21:
		return "bool"
	case info == 22:
		return "null"
	case info == 23:
		return "undefined"
	case info >= 25 && info <= 27:
		return "float"
	}
	return "simple"
}
