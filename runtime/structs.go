package runtime

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/syncmesh/syncmesh/messages"
)

// Struct mapping: a row read into and written from a Go struct through
// field tags, with the cell states of SSP/1 §13.6 still reachable.
//
//	type Todo struct {
//		ID    int                   `syncmesh:"id,key"`
//		Title string                `syncmesh:"title"`
//		Done  runtime.Field[bool]   `syncmesh:"done"`
//		Note  *string               `syncmesh:"note"`
//		Local string                `syncmesh:"-"`
//	}
//
// The tag names the column (an untagged exported field is the column of
// its Go name); ",key" marks a key column; "-" skips the field. Writing,
// every value field is written — a nil pointer as an explicit null —
// except a Field whose State is Unmaterialized, which is left out (the
// column keeps what it had). Reading, a Field gets the cell's state,
// value and clock; a plain field gets the value of a Written cell, and a
// pointer field is set to nil by a Cleared cell (a null); an Unmaterialized
// cell leaves a plain field as it was — use Field to tell it apart.

// ErrNotStruct: struct mapping was given something other than a struct
// or a pointer to one, or a struct without a key field.
var ErrNotStruct = errors.New("runtime: struct mapping needs a struct with syncmesh-tagged key fields")

// Field is a struct field that keeps a cell's state beside its value.
type Field[T any] struct {
	State CellState
	Value T
	// Clock is the cell's clock when read (zero when Unmaterialized);
	// ignored when writing.
	Clock messages.Clock
}

// FieldOf returns a Field to write with v.
func FieldOf[T any](v T) Field[T] { return Field[T]{State: Written, Value: v} }

// NullField returns a Field to write with an explicit null.
func NullField[T any]() Field[T] { return Field[T]{State: Cleared} }

// cellField is implemented by every *Field[T]: struct mapping reaches
// the state and value through it without knowing T.
type cellField interface {
	cell() (CellState, any)
	setCell(col string, c Cell) error
}

func (f *Field[T]) cell() (CellState, any) {
	if f.State == Cleared {
		return Cleared, nil
	}
	return f.State, f.Value
}

func (f *Field[T]) setCell(col string, c Cell) error {
	var zero T
	f.State, f.Value, f.Clock = c.State, zero, c.Clock
	if c.State == Unmaterialized || c.Value.IsNull() {
		return nil
	}
	if err := c.Type.Check(col, c.Value); err != nil {
		return err
	}
	return c.Value.Decode(&f.Value)
}

type structField struct {
	col   string
	index []int
	key   bool
}

var structCache sync.Map // reflect.Type → []structField

func fieldsOf(t reflect.Type) ([]structField, error) {
	if f, ok := structCache.Load(t); ok {
		return f.([]structField), nil
	}
	var out []structField
	keys := 0
	for _, sf := range reflect.VisibleFields(t) {
		if !sf.IsExported() || sf.Anonymous {
			continue
		}
		tag := sf.Tag.Get("syncmesh")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = sf.Name
		}
		f := structField{col: name, index: sf.Index, key: opts == "key"}
		if f.key {
			keys++
		}
		out = append(out, f)
	}
	if keys == 0 {
		return nil, fmt.Errorf("%w: %s has no field tagged \",key\"", ErrNotStruct, t)
	}
	structCache.Store(t, out)
	return out, nil
}

func structValue(v any) (reflect.Value, error) {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return reflect.Value{}, fmt.Errorf("%w: got %T", ErrNotStruct, v)
	}
	return rv, nil
}

// structColumns returns the key and the values a struct writes.
func structColumns(v any) (key, values map[string]any, err error) {
	rv, err := structValue(v)
	if err != nil {
		return nil, nil, err
	}
	fields, err := fieldsOf(rv.Type())
	if err != nil {
		return nil, nil, err
	}
	// A copy, so a Field's methods have an addressable receiver.
	cp := reflect.New(rv.Type()).Elem()
	cp.Set(rv)
	key, values = map[string]any{}, map[string]any{}
	for _, f := range fields {
		fv := cp.FieldByIndex(f.index)
		val := fv.Interface()
		if cf, ok := fv.Addr().Interface().(cellField); ok {
			st, x := cf.cell()
			if st == Unmaterialized {
				continue
			}
			val = x
		} else if fv.Kind() == reflect.Pointer && fv.IsNil() {
			val = nil
		}
		if f.key {
			key[f.col] = val
		} else {
			values[f.col] = val
		}
	}
	return key, values, nil
}

// UpsertStruct writes the row v (a struct or a pointer to one, see the
// struct mapping above) like Upsert.
func (n *Node) UpsertStruct(ctx context.Context, schema, table string, v any) (messages.Outcome, error) {
	key, values, err := structColumns(v)
	if err != nil {
		return messages.Outcome{}, err
	}
	return n.Upsert(ctx, schema, table, key, values)
}

// UpsertStruct adds an upsert of the row v (see Node.UpsertStruct); a v
// that does not map is an error and adds nothing.
func (b *Batch) UpsertStruct(schema, table string, v any) error {
	key, values, err := structColumns(v)
	if err != nil {
		return err
	}
	b.Upsert(schema, table, key, values)
	return nil
}

// Decode reads the row into dst, a pointer to a struct (see the struct
// mapping above): its key fields from the row key, its value fields from
// the cells. A value not of its column's declared type is an error
// matching ErrTypeMismatch, as with Value; the other fields are still
// filled.
func (r Row) Decode(dst any) error {
	rv := reflect.ValueOf(dst)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("%w: Decode needs a non-nil pointer to a struct, got %T", ErrNotStruct, dst)
	}
	rv = rv.Elem()
	fields, err := fieldsOf(rv.Type())
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range fields {
		fv := rv.FieldByIndex(f.index)
		var c Cell
		if f.key {
			v, ok := r.Key[f.col]
			if !ok {
				continue
			}
			c = Cell{State: Written, Value: v}
		} else {
			c = r.Cells[f.col]
		}
		if cf, ok := fv.Addr().Interface().(cellField); ok {
			if err := cf.setCell(f.col, c); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		switch {
		case c.State == Unmaterialized:
		case c.Value.IsNull():
			if fv.Kind() == reflect.Pointer || fv.Kind() == reflect.Slice || fv.Kind() == reflect.Map || fv.Kind() == reflect.Interface {
				fv.SetZero()
			}
		default:
			if err := c.Type.Check(f.col, c.Value); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := c.Value.Decode(fv.Addr().Interface()); err != nil {
				errs = append(errs, fmt.Errorf("runtime: column %q: %w", f.col, err))
			}
		}
	}
	return errors.Join(errs...)
}
