package bolt

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// readRow decodes a row record by hand (it runs once per applied event, and
// reflection built two maps per row). It accepts exactly what encodeRow
// writes: shortest heads, the fixed field order, the canonical clock
// shapes, a non-empty cell map in strictly increasing canonical name order
// (else null), valid UTF-8 names. Anything else is ErrCorrupt. The fuzz
// target checks both directions: an accepted record re-encodes to itself,
// and decodeRow (the reflective reference) reads it the same.
func readRow(t persistence.TableKey, rowKey, b []byte) (persistence.Row, error) {
	return readRowKeyed(t, rowKey, nil, b, nil)
}

// readRowKeyed is readRow taking the row's key columns from key when the
// caller has them (non-nil), instead of decoding rowKey, and the cell
// names from names when it holds them (nil: each name is a new string).
func readRowKeyed(t persistence.TableKey, rowKey []byte, key messages.Columns, b []byte, names *nameCache) (persistence.Row, error) {
	// One copy backs every cell value: the row never aliases bbolt memory.
	return readRowInto(t, rowKey, key, bytes.Clone(b), names, nil)
}

// readRowInto is readRowKeyed over b, which the row's cell values then
// share (the caller's copy), filling cells (emptied first) when it is not
// nil instead of a new map.
func readRowInto(t persistence.TableKey, rowKey []byte, key messages.Columns, b []byte, names *nameCache, cells map[string]persistence.Cell) (persistence.Row, error) {
	r := cborReader{b: b}
	row := persistence.Row{Schema: t.Schema, Table: t.Table}
	if r.mapLen() != 5 || r.uint() != 1 || r.uint() != rowRecordVersion {
		return row, corrupt("row", r.fail("header"))
	}
	if r.uint() != 2 {
		return row, corrupt("row", r.fail("exists"))
	}
	row.Exists = r.bool()
	if r.uint() != 3 {
		return row, corrupt("row", r.fail("existence"))
	}
	row.Existence = r.clock()
	if r.uint() != 4 {
		return row, corrupt("row", r.fail("tomb"))
	}
	row.Tomb = r.clock()
	if r.uint() != 5 {
		return row, corrupt("row", r.fail("cells"))
	}
	if !r.null() {
		n := r.mapLen()
		if n == 0 && r.err == nil {
			return row, corrupt("row", r.fail("empty cell map (written as null)"))
		}
		if r.err == nil {
			if cells != nil {
				clear(cells)
				row.Cells = cells
			} else {
				row.Cells = make(map[string]persistence.Cell, n)
			}
		}
		var prev string
		for i := 0; i < n && r.err == nil; i++ {
			name := r.name(names)
			if i > 0 && !messages.LessShortlex(prev, name) {
				return row, corrupt("row", r.fail("cell order"))
			}
			prev = name
			if r.mapLen() != 2 || r.uint() != 1 {
				return row, corrupt("row", r.fail("cell"))
			}
			v := r.bytes()
			if r.uint() != 2 {
				return row, corrupt("row", r.fail("cell clock"))
			}
			c := r.clock()
			row.Cells[name] = persistence.Cell{Value: messages.Value(v), Clock: c}
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return row, corrupt("row", r.err)
	}
	if key == nil {
		var err error
		if key, err = messages.DecodeColumns(rowKey); err != nil {
			return row, corrupt("row key", err)
		}
	}
	row.Key = key
	return row, nil
}

// cborReader reads the few CBOR shapes of hand-encoded records. The first
// error sticks; later reads return zero values.
type cborReader struct {
	b   []byte
	err error
}

func (r *cborReader) fail(what string) error {
	if r.err == nil {
		r.err = fmt.Errorf("unexpected %s", what)
	}
	return r.err
}

// head reads one data item head; only definite lengths, only the shortest
// form of the argument (what messages' encoders write).
func (r *cborReader) head(major byte) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 || r.b[0]>>5 != major {
		r.fail(fmt.Sprintf("major type (want %d)", major))
		return 0
	}
	info := r.b[0] & 0x1f
	r.b = r.b[1:]
	var size int
	var min uint64
	switch {
	case info < 24:
		return uint64(info)
	case info == 24:
		size, min = 1, 24
	case info == 25:
		size, min = 2, 0x100
	case info == 26:
		size, min = 4, 0x10000
	case info == 27:
		size, min = 8, 0x100000000
	default:
		r.fail("length encoding")
		return 0
	}
	if len(r.b) < size {
		r.fail("end of input")
		return 0
	}
	var n uint64
	for _, c := range r.b[:size] {
		n = n<<8 | uint64(c)
	}
	if n < min {
		r.fail("non-shortest head")
		return 0
	}
	r.b = r.b[size:]
	return n
}

func (r *cborReader) uint() uint64 { return r.head(0) }

func (r *cborReader) mapLen() int {
	n := r.head(5)
	if n > uint64(len(r.b)) { // every pair takes at least two bytes
		r.fail("map length")
		return 0
	}
	return int(n)
}

func (r *cborReader) bytes() []byte {
	n := r.head(2)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail("byte string length")
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// textBytes reads a text string's head and returns its bytes, not yet
// checked as UTF-8 (nil after a failure).
func (r *cborReader) textBytes() []byte {
	n := r.head(3)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail("text length")
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

func (r *cborReader) text() string {
	b := r.textBytes()
	if r.err != nil {
		return ""
	}
	if !utf8.Valid(b) {
		r.fail("text encoding")
		return ""
	}
	return string(b)
}

// nameCache holds the column names a transaction's rows were read with:
// a table's rows share a few names, and the apply path reads a row per
// event, so its names are allocated once instead of once per row.
type nameCache struct{ names []string }

// maxCachedNames bounds a nameCache (wider rows allocate the rest).
const maxCachedNames = 32

// name reads a text string as text does, returning an equal string of c
// when it holds one (c may be nil).
func (r *cborReader) name(c *nameCache) string {
	if c == nil {
		return r.text()
	}
	b := r.textBytes()
	if r.err != nil {
		return ""
	}
	for _, s := range c.names {
		if s == string(b) { // no allocation: a comparison
			return s
		}
	}
	if !utf8.Valid(b) {
		r.fail("text encoding")
		return ""
	}
	s := string(b)
	if len(c.names) < maxCachedNames {
		c.names = append(c.names, s)
	}
	return s
}

func (r *cborReader) bool() bool {
	if r.err != nil || len(r.b) == 0 || (r.b[0] != 0xf4 && r.b[0] != 0xf5) {
		r.fail("bool")
		return false
	}
	v := r.b[0] == 0xf5
	r.b = r.b[1:]
	return v
}

func (r *cborReader) null() bool {
	if r.err == nil && len(r.b) > 0 && r.b[0] == 0xf6 {
		r.b = r.b[1:]
		return true
	}
	return false
}

// clock reads a clockRecord in appendClock's shapes: {} for the zero
// clock, else {1: hlc (non-zero, absent for 0), 2: site, 3: event id
// (non-zero, absent for the zero id)} in that field order.
func (r *cborReader) clock() messages.Clock {
	var c messages.Clock
	n := r.mapLen()
	if r.err != nil || n == 0 {
		return c
	}
	if n > 3 {
		r.fail("clock size")
		return c
	}
	key := r.uint()
	if key == 1 {
		if c.HLC = messages.HLC(r.uint()); c.HLC == 0 {
			r.fail("clock hlc 0 (written without the field)")
			return c
		}
		n--
		key = r.uint()
	}
	if key != 2 || n < 1 {
		r.fail("clock field")
		return c
	}
	site := r.bytes()
	if len(site) != len(c.Site) {
		r.fail("site length")
		return c
	}
	copy(c.Site[:], site)
	switch n {
	case 1:
	case 2:
		if r.uint() != 3 {
			r.fail("clock field")
			return c
		}
		id := r.bytes()
		if len(id) != len(c.ID) {
			r.fail("clock event id length")
			return c
		}
		copy(c.ID[:], id)
		if c.ID == (messages.EventID{}) {
			r.fail("clock zero event id (written without the field)")
			return c
		}
	default:
		r.fail("clock size")
		return c
	}
	if c.IsZero() {
		r.fail("zero clock (written as {})")
	}
	return c
}
