package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"

	"github.com/syncmesh/syncmesh/messages"
)

// Typed keys.
//
// A row is named by the CBOR encoding of its key columns, so two Go values
// that print alike but encode differently would name two rows. Local
// writes and lookups (Upsert, Delete, Get) therefore normalize every key
// component before encoding it:
//
//	Go value (any named type with that kind too)     stored key
//	int, int8 … int64, uint, uint8 … uint64, uintptr  CBOR integer
//	float32, float64 holding an integer               CBOR integer (float64(1) from JSON is the row 1)
//	json.Number holding an integer                    CBOR integer
//	string, []byte, bool                              text, byte string, bool
//	messages.Value                                     taken as encoded
//
// Refused with a *KeyError matching ErrInvalidKey: nil, "", an empty
// []byte, a null or empty messages.Value, a float that is NaN, infinite,
// fractional or outside the int64/uint64 range, and any other type (maps,
// slices, structs, time.Time: encode them yourself as a messages.Value if
// you mean it). Refusing nil and empty components goes beyond SSP/1 §13.6,
// which only rules out a null or empty key map; it is our choice, because
// such a component names no row anyone meant.
//
// Only the local API normalizes. Keys inside received signed events are
// used exactly as signed: rewriting them would change the event (and its
// id), which would be a protocol change. A received key whose value is not
// in its one canonical encoding (an integer or length head longer than its
// shortest form, a float a shorter float encodes, a float naming an
// integer, a non-canonical NaN, nested map keys out of order) is dropped
// as malformed, as a tagged one is, so one key value names one row
// (messages.ErrNonCanonicalKey). A messages.Value handed to the local API
// is held to the same rule.

// KeyError says which key column of a local write or lookup was refused
// and why. It matches ErrInvalidKey.
type KeyError struct {
	Column string
	Reason string
}

// Error implements the error interface.
func (e *KeyError) Error() string {
	return fmt.Sprintf("runtime: key column %q: %s", e.Column, e.Reason)
}

// Is makes a KeyError match ErrInvalidKey.
func (e *KeyError) Is(target error) bool { return target == ErrInvalidKey }

// NormalizeKey returns the key as local writes store it: every component
// mapped to its stored type (see "Typed keys" above), or a *KeyError. An
// empty or nil key is refused as well.
func NormalizeKey(key map[string]any) (map[string]any, error) {
	if len(key) == 0 {
		return nil, &KeyError{Reason: "the key has no columns"}
	}
	out := make(map[string]any, len(key))
	for col, v := range key {
		nv, err := normalizeKeyValue(v)
		if err != nil {
			return nil, &KeyError{Column: col, Reason: err.Error()}
		}
		out[col] = nv
	}
	return out, nil
}

// encodeKey normalizes and encodes a local key.
func encodeKey(key map[string]any) (messages.Columns, error) {
	nk, err := NormalizeKey(key)
	if err != nil {
		return nil, err
	}
	return encodeColumns(nk)
}

var errKeyNil = errors.New("nil is not a key value")

func normalizeKeyValue(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, errKeyNil
	case messages.Value:
		if err := messages.Wellformed(x); err != nil {
			return nil, err
		}
		if x.IsNull() || len(x) == 1 && (x[0] == 0x40 || x[0] == 0x60) {
			return nil, errors.New("a null or empty encoded value is not a key value")
		}
		// A peer drops an event whose key value is not in its one
		// canonical encoding; a local write must not name such a row.
		if err := messages.CheckKeyValue(x); err != nil {
			return nil, err
		}
		return x, nil
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i, nil
		}
		if u, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return u, nil
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return nil, fmt.Errorf("json.Number %q is not a number", x)
		}
		return integralFloat(f)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.Uint(), nil
	case reflect.Float32, reflect.Float64:
		return integralFloat(rv.Float())
	case reflect.String:
		if rv.Len() == 0 {
			return nil, errors.New("an empty string is not a key value")
		}
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			if rv.Len() == 0 {
				return nil, errors.New("an empty byte string is not a key value")
			}
			return rv.Bytes(), nil
		}
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return nil, errKeyNil
		}
	}
	return nil, fmt.Errorf("type %T is not a key type (integers, integral floats, strings, bytes, bools, messages.Value)", v)
}

// integralFloat maps a float holding an integer to that integer: a key
// decoded from JSON as float64(1) is the row written with 1.
func integralFloat(f float64) (any, error) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return nil, fmt.Errorf("%v is not a key value", f)
	case f != math.Trunc(f):
		return nil, fmt.Errorf("%v is not an integer: floats name rows only when integral", f)
	case f >= -(1<<63) && f < 1<<63:
		return int64(f), nil
	case f >= 0 && f < 1<<64:
		return uint64(f), nil
	}
	return nil, fmt.Errorf("%v is outside the 64-bit integer range", f)
}
