package runtime

import (
	"bytes"
	"context"
	"fmt"
	"iter"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// IndexDef declares a secondary index of a table (TableDef.Indexes): a
// name unique in the table and the columns (key or value) it orders rows
// by. The materializer keeps it in the same transaction as the rows;
// EnsureTable adds a missing one and builds it from the rows.
type IndexDef = persistence.IndexDef

// Query limits.
const (
	// DefaultQueryLimit is the number of rows a Query with Limit 0 returns
	// at most.
	DefaultQueryLimit = 100
	// MaxQueryLimit is the largest Query.Limit: the rows of one answer are
	// read in one read transaction and held until they are yielded.
	MaxQueryLimit = 10000
)

// Cursor is an opaque position in a query's order: Query.After resumes
// after it. Row.Cursor is the position of a row a query returned.
type Cursor []byte

// Query selects the rows of one table by its key or by one of its
// indexes, in the order of that key or index: the natural order of the
// values, column by column (integers and floats numerically, negative
// below positive; text and bytes bytewise; see persistence/ordkey for the
// order of values of mixed kinds), rows with equal index values in key
// order. Only rows that exist are returned (a tombstoned row is in no
// answer).
//
// Eq fixes the leading columns to values; then one of Prefix or From/To
// may restrict the next column. A value column reads as a reader sees it
// (SSP/1 §13.6): its written value, null once a delete cleared it, and
// an unmaterialized cell is below null and matches no bound but a missing
// lower one. Values compare by kind and value: the integer 2 and the
// float 2.0 are not equal (the float sorts first). An index compares the
// first ordkey.MaxIndexValue encoded bytes of a value: a query by an
// index with a longer value or prefix is refused (ErrBadQuery) rather
// than answered inexactly.
type Query struct {
	Schema, Table string
	// Index names the index to read by; "" reads by the row key (the
	// table's KeyColumns).
	Index string
	// Eq holds values for the leading columns, in order (nil is the null).
	// A value of a typed column must be of its type (*TypeError).
	Eq []any
	// Prefix, a string (text column) or []byte (bytes column), selects
	// the rows whose next column starts with it.
	Prefix any
	// From (inclusive) and To (exclusive) bound the next column; nil is
	// no bound.
	From, To any
	// Limit is the most rows returned: 0 is DefaultQueryLimit, at most
	// MaxQueryLimit. The work of a query is bounded by it (a key query
	// also steps over tombstoned rows in its range).
	Limit int
	// After resumes after a row an earlier query returned (its
	// Row.Cursor); nil starts at the beginning.
	After Cursor
}

// queryPlan is a Query checked against its table: ranges over the
// entries of the key order (a row's storage key) or of an index.
type queryPlan struct {
	def   TableDef
	index string   // "" for the key
	cols  []string // the columns of the order
	// eq is the encoded Eq prefix; prefix, when not nil, is eq with the
	// Prefix appended; lo and hi (nil: none) bound the entries.
	eq, prefix, lo, hi []byte
	after              []byte
	limit              int
}

// planQuery checks q against def.
func planQuery(def TableDef, q Query) (queryPlan, error) {
	p := queryPlan{def: def, index: q.Index, after: q.After}
	if q.Index == "" {
		p.cols = def.KeyColumns
	} else {
		x, ok := def.Index(q.Index)
		if !ok {
			return p, fmt.Errorf("%w: %q of %s.%s", ErrUnknownIndex, q.Index, def.Schema, def.Table)
		}
		p.cols = x.Columns
	}
	switch {
	case q.Limit < 0 || q.Limit > MaxQueryLimit:
		return p, fmt.Errorf("%w: limit %d outside 0..%d", ErrBadQuery, q.Limit, MaxQueryLimit)
	case q.Limit == 0:
		p.limit = DefaultQueryLimit
	default:
		p.limit = q.Limit
	}
	if len(q.Eq) > len(p.cols) {
		return p, fmt.Errorf("%w: %d equal values for %d columns", ErrBadQuery, len(q.Eq), len(p.cols))
	}
	ranged := q.Prefix != nil || q.From != nil || q.To != nil
	if ranged && len(q.Eq) == len(p.cols) {
		return p, fmt.Errorf("%w: a prefix or range needs a column after the equal values", ErrBadQuery)
	}
	if q.Prefix != nil && (q.From != nil || q.To != nil) {
		return p, fmt.Errorf("%w: a prefix and a range together", ErrBadQuery)
	}
	for i, v := range q.Eq {
		enc, err := p.value(p.cols[i], v, true)
		if err != nil {
			return p, err
		}
		if err := p.exact(p.cols[i], enc); err != nil {
			return p, err
		}
		p.eq = p.appendValue(p.eq, enc)
	}
	if !ranged {
		return p, nil
	}
	col := p.cols[len(q.Eq)]
	if q.Prefix != nil {
		var b []byte
		isBytes := false
		switch x := q.Prefix.(type) {
		case string:
			b = []byte(x)
		case []byte:
			b, isBytes = x, true
		default:
			return p, fmt.Errorf("%w: prefix of type %T (want string or []byte)", ErrBadQuery, q.Prefix)
		}
		want := TypeText
		if isBytes {
			want = TypeBytes
		}
		if t := def.TypeOf(col); t != TypeAny && t != want {
			return p, &TypeError{Column: col, Want: t, Got: want.String()}
		}
		// A cut index value keeps at least MaxIndexValue-3 encoded bytes:
		// a longer prefix could miss rows whose values were cut.
		if p.index != "" && len(ordkey.AppendPrefix(nil, b, isBytes)) > ordkey.MaxIndexValue-3 {
			return p, fmt.Errorf("%w: column %q: a prefix of %d bytes is longer than an index compares", ErrBadQuery, col, len(b))
		}
		p.prefix = ordkey.AppendPrefix(slices.Clone(p.eq), b, isBytes)
		return p, nil
	}
	for _, b := range []struct {
		v   any
		out *[]byte
	}{{q.From, &p.lo}, {q.To, &p.hi}} {
		if b.v == nil {
			continue
		}
		enc, err := p.value(col, b.v, false)
		if err != nil {
			return p, err
		}
		if err := p.exact(col, enc); err != nil {
			return p, err
		}
		*b.out = p.appendValue(slices.Clone(p.eq), enc)
	}
	return p, nil
}

// value encodes one query value of column col and checks its type. An
// equal value of a key column is normalized as a key is (NormalizeKey)
// when it can be, so it names the rows Get would.
func (p queryPlan) value(col string, v any, eq bool) (messages.Value, error) {
	var (
		enc messages.Value
		err error
	)
	if raw, ok := v.(messages.Value); ok {
		err = messages.Wellformed(raw)
		enc = raw
	} else {
		if eq && v != nil && slices.Contains(p.def.KeyColumns, col) {
			// A value a local key refuses (an empty string…) may still
			// be in a received key: it is then looked for as given.
			if nv, err := normalizeKeyValue(v); err == nil {
				v = nv
			}
		}
		enc, err = messages.NewValue(v)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: column %q: %w", ErrBadQuery, col, err)
	}
	if err := p.def.TypeOf(col).Check(col, enc); err != nil {
		return nil, err
	}
	return enc, nil
}

// exact refuses a value an index would cut (ordkey.AppendIndexValue):
// rows whose values share its first MaxIndexValue encoded bytes compare
// equal in the index, so the answer would not be exact.
func (p queryPlan) exact(col string, v messages.Value) error {
	if p.index == "" {
		return nil
	}
	if full := ordkey.AppendValue(nil, v); len(full) > ordkey.MaxIndexValue {
		return fmt.Errorf("%w: column %q: a value of %d encoded bytes is longer than an index compares (%d)", ErrBadQuery, col, len(full), ordkey.MaxIndexValue)
	}
	return nil
}

// appendValue encodes a query value as the order stores it: an index
// cuts long values (ordkey.AppendIndexValue), the key does not.
func (p queryPlan) appendValue(dst []byte, v messages.Value) []byte {
	if p.index != "" {
		return ordkey.AppendIndexValue(dst, v)
	}
	return ordkey.AppendValue(dst, v)
}

// start is the first entry a range read seeks to.
func (p queryPlan) start() []byte {
	s := p.eq
	switch {
	case p.prefix != nil:
		s = p.prefix
	case p.lo != nil:
		s = p.lo
	}
	if p.after != nil && bytes.Compare(p.after, s) > 0 {
		s = p.after
	}
	return s
}

// match reports whether entry k is in the plan's range, and done when
// no later entry can be (the read stops).
func (p queryPlan) match(k []byte) (in, done bool) {
	if !bytes.HasPrefix(k, p.eq) {
		return false, bytes.Compare(k, p.eq) > 0
	}
	if p.prefix != nil && !bytes.HasPrefix(k, p.prefix) {
		return false, bytes.Compare(k, p.prefix) > 0
	}
	if p.hi != nil && bytes.Compare(k, p.hi) >= 0 {
		return false, true
	}
	if p.lo != nil && bytes.Compare(k, p.lo) < 0 {
		return false, false
	}
	if p.after != nil && bytes.Compare(k, p.after) <= 0 {
		return false, false
	}
	return true, false
}

// Query returns the rows q selects, in its order, at most q.Limit of
// them, each with its Row.Cursor: set q.After to the last one's to read
// on. A bad query yields one error and no row: ErrUnknownTable,
// ErrUnknownIndex, ErrBadQuery, or a *TypeError for a value not of its
// column's type. The rows are read in one read transaction before the
// first is yielded (a consumer that stops early does not hold it open).
func (n *Node) Query(ctx context.Context, q Query) iter.Seq2[Row, error] {
	return func(yield func(Row, error) bool) {
		rows, err := n.queryRows(ctx, q)
		if err != nil {
			yield(Row{}, err)
			return
		}
		for _, r := range rows {
			if !yield(r, nil) {
				return
			}
		}
	}
}

// QueryPage is Query gathered into a slice, with the cursor to resume
// after its last row (nil when the page is empty: there is nothing after
// q.After).
func (n *Node) QueryPage(ctx context.Context, q Query) ([]Row, Cursor, error) {
	rows, err := n.queryRows(ctx, q)
	if err != nil || len(rows) == 0 {
		return nil, nil, err
	}
	return rows, rows[len(rows)-1].Cursor, nil
}

func (n *Node) queryRows(ctx context.Context, q Query) ([]Row, error) {
	if n.isClosed() {
		return nil, ErrClosed
	}
	var out []Row
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		out = out[:0]
		t, def, err := requireTable(tx, q.Schema, q.Table)
		if err != nil {
			return err
		}
		p, err := planQuery(def, q)
		if err != nil {
			return err
		}
		if p.index != "" {
			if b, err := building(tx, q.Schema, q.Table, p.index); err != nil {
				return err
			} else if b {
				return fmt.Errorf("%w: %q of %s.%s", ErrIndexBuilding, p.index, q.Schema, q.Table)
			}
		}
		// One ordered range read from the first entry that can match;
		// it stops at the first entry past the range or at the limit.
		return tx.IndexRange(t, p.index, p.start(), func(e []byte, pr persistence.Row) (bool, error) {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			in, done := p.match(e)
			if done {
				return false, nil
			}
			if !in || !pr.Exists {
				return true, nil
			}
			r := viewRow(def, pr)
			r.Cursor = Cursor(bytes.Clone(e))
			out = append(out, r)
			return len(out) < p.limit, nil
		})
	})
	return out, err
}
