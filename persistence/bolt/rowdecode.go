package bolt

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// readRow decodes a row record by hand (it runs once per applied event, and
// reflection built two maps per row). It is strict the simple way: it reads
// only the shape encodeRow writes and then requires that re-encoding the
// result gives the input byte for byte, so anything but the canonical
// encoding is ErrCorrupt — the same records decodeRow (the reflective
// reference, kept for the fuzz target's cross-check) accepts.
func readRow(t persistence.TableKey, rowKey, b []byte) (persistence.Row, error) {
	r := cborReader{b: b}
	row := persistence.Row{Schema: t.Schema, Table: t.Table}
	if r.mapLen() != 5 || r.uint() != 1 || r.uint() != recordVersion {
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
		if n > 0 && r.err == nil {
			row.Cells = make(map[string]persistence.Cell, n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			name := r.text()
			if r.mapLen() != 2 || r.uint() != 1 {
				return row, corrupt("row", r.fail("cell"))
			}
			v := r.bytes()
			if r.uint() != 2 {
				return row, corrupt("row", r.fail("cell clock"))
			}
			c := r.clock()
			row.Cells[name] = persistence.Cell{Value: messages.Value(bytes.Clone(v)), Clock: c}
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return row, corrupt("row", r.err)
	}
	if again, _ := encodeRow(&row); !bytes.Equal(again, b) {
		return row, corrupt("row", errors.New("not the canonical encoding"))
	}
	key, err := messages.DecodeColumns(rowKey)
	if err != nil {
		return row, corrupt("row key", err)
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

// head reads one data item head; only definite lengths.
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
	switch {
	case info < 24:
		return uint64(info)
	case info == 24:
		size = 1
	case info == 25:
		size = 2
	case info == 26:
		size = 4
	case info == 27:
		size = 8
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
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *cborReader) text() string {
	n := r.head(3)
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.fail("text length")
		return ""
	}
	v := string(r.b[:n])
	r.b = r.b[n:]
	return v
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

// clock reads a clockRecord: {} | {1: hlc, 2: site} | {2: site}.
func (r *cborReader) clock() messages.Clock {
	var c messages.Clock
	n := r.mapLen()
	for i := 0; i < n && r.err == nil; i++ {
		switch r.uint() {
		case 1:
			c.HLC = messages.HLC(r.uint())
		case 2:
			site := r.bytes()
			if len(site) != len(c.Site) {
				r.fail("site length")
				return c
			}
			copy(c.Site[:], site)
		default:
			r.fail("clock field")
		}
	}
	return c
}
