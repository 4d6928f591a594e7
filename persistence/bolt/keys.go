package bolt

import (
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Key encoding. Every variable-length part is prefixed by its uvarint
// length, so no two (schema, table, row key) tuples share an encoding and a
// table's (or row's) keys are exactly the keys under its prefix: ("a","bc")
// and ("ab","c") encode as 01 61 02 62 63 and 02 61 62 01 63.

func appendLP(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendLPString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// tablePrefix is lp(schema)|lp(table).
func tablePrefix(b []byte, t persistence.TableKey) []byte {
	return appendLPString(appendLPString(b, t.Schema), t.Table)
}

// readLP reads one length-prefixed part.
func readLP(b []byte) (part, rest []byte, err error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || uint64(len(b)-w) < n {
		return nil, nil, fmt.Errorf("bad length prefix: %w", persistence.ErrCorrupt)
	}
	return b[w : w+int(n)], b[w+int(n):], nil
}

// rowIdxKey is the row index key of layout 8 (row_index.go):
// lp(schema)|lp(table)|gen(seq)|lp(rowkey)|seq.
func rowIdxKey(b []byte, t persistence.TableKey, rowKey []byte, seq uint64) []byte {
	b = rowGenPrefix(b, t, rowGen(seq), rowKey)
	return binary.BigEndian.AppendUint64(b, seq)
}

// tableIdxKey is lp(schema)|lp(table)|hlc|seq.
func tableIdxKey(b []byte, t persistence.TableKey, h messages.HLC, seq uint64) []byte {
	b = binary.BigEndian.AppendUint64(tablePrefix(b, t), uint64(h))
	return binary.BigEndian.AppendUint64(b, seq)
}

// groupPrefix is site|lp(schema)|lp(table).
func groupPrefix(b []byte, g persistence.GroupKey) []byte {
	b = append(b, g.Site[:]...)
	return tablePrefix(b, persistence.TableKey{Schema: g.Schema, Table: g.Table})
}

// parseGroupKey splits a held-bucket key into its group and seq.
func parseGroupKey(k []byte) (persistence.GroupKey, uint64, error) {
	var g persistence.GroupKey
	if len(k) < len(g.Site)+8 {
		return g, 0, fmt.Errorf("held key of %d bytes: %w", len(k), persistence.ErrCorrupt)
	}
	copy(g.Site[:], k)
	schema, rest, err := readLP(k[len(g.Site):])
	if err != nil {
		return g, 0, err
	}
	table, rest, err := readLP(rest)
	if err != nil {
		return g, 0, err
	}
	if len(rest) != 8 {
		return g, 0, fmt.Errorf("held key seq of %d bytes: %w", len(rest), persistence.ErrCorrupt)
	}
	g.Schema, g.Table = string(schema), string(table)
	return g, binary.BigEndian.Uint64(rest), nil
}
