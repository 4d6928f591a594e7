package bolt

import (
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// recordVersion is the version field of every stored CBOR record; a record
// of another version fails to decode (messages.ErrUnsupportedVersion) until
// a layout migration rewrites it.
const recordVersion = 1

// rowRecordVersion is the version of a row record (bucketSyncRows) from
// layout 7 on: every clock carries the id of the event that set it, the
// last tiebreak of SSP/1's order (messages.Clock). Version-1 rows (no ids)
// are read only by the layout 6→7 migration (row_clock_ids.go).
const rowRecordVersion = 2

// maxRecordSize bounds a stored record the decoder accepts.
const maxRecordSize = 16 << 20

// eventRecord is a value of bucketSyncEvents. Index fields are plaintext;
// Raw is sealed as persistence.RecordEvent with identity = ID.
type eventRecord struct {
	V      uint64 `cbor:"1,keyasint"`
	ID     []byte `cbor:"2,keyasint"`
	Site   []byte `cbor:"3,keyasint"`
	HLC    uint64 `cbor:"4,keyasint"`
	Schema string `cbor:"5,keyasint"`
	Table  string `cbor:"6,keyasint"`
	RowKey []byte `cbor:"7,keyasint"`
	Raw    []byte `cbor:"8,keyasint"`
}

// clockRecord is a stored messages.Clock. ID is absent for the zero id
// (the zero clock, or a clock whose event was reclaimed before layout 7;
// see row_clock_ids.go).
type clockRecord struct {
	HLC  uint64 `cbor:"1,keyasint,omitempty"`
	Site []byte `cbor:"2,keyasint,omitempty"`
	ID   []byte `cbor:"3,keyasint,omitempty"`
}

type cellRecord struct {
	Value []byte      `cbor:"1,keyasint"`
	Clock clockRecord `cbor:"2,keyasint"`
}

// rowRecord is a value of bucketSyncRows; the key columns are the bucket
// key's row-key part.
type rowRecord struct {
	V         uint64                `cbor:"1,keyasint"`
	Exists    bool                  `cbor:"2,keyasint"`
	Existence clockRecord           `cbor:"3,keyasint"`
	Tomb      clockRecord           `cbor:"4,keyasint"`
	Cells     map[string]cellRecord `cbor:"5,keyasint"`
}

type tableRecord struct {
	V          uint64   `cbor:"1,keyasint"`
	Schema     string   `cbor:"2,keyasint"`
	Table      string   `cbor:"3,keyasint"`
	KeyColumns []string `cbor:"4,keyasint"`
	Columns    []string `cbor:"5,keyasint"`
	// Types is absent when every column is of type any, so a definition
	// without types encodes as it did before types existed.
	Types map[string]uint8 `cbor:"6,keyasint,omitempty"`
	// Indexes is absent for a table without secondary indexes.
	Indexes []indexRecord `cbor:"7,keyasint,omitempty"`
}

// indexRecord is one secondary index of a tableRecord.
type indexRecord struct {
	Name    string   `cbor:"1,keyasint"`
	Columns []string `cbor:"2,keyasint"`
}

type keyRecord struct {
	V         uint64 `cbor:"1,keyasint"`
	Kid       []byte `cbor:"2,keyasint"`
	Site      []byte `cbor:"3,keyasint"`
	PublicKey []byte `cbor:"4,keyasint"`
	Cutoff    uint64 `cbor:"5,keyasint"`
}

// corrupt wraps a decode failure of a stored record as persistence.ErrCorrupt.
func corrupt(what string, err error) error {
	return fmt.Errorf("bolt: %s: %w: %w", what, persistence.ErrCorrupt, err)
}

func decodeRecord(what string, b []byte, v any, version *uint64) error {
	return decodeRecordVersion(what, b, v, version, recordVersion)
}

func decodeRecordVersion(what string, b []byte, v any, version *uint64, want uint64) error {
	if err := messages.Unmarshal(what, b, v, maxRecordSize); err != nil {
		return corrupt(what, err)
	}
	if *version != want {
		return corrupt(what, fmt.Errorf("record version %d: %w", *version, messages.ErrUnsupportedVersion))
	}
	return nil
}

func toClockRecord(c messages.Clock) clockRecord {
	if c.IsZero() {
		return clockRecord{}
	}
	r := clockRecord{HLC: uint64(c.HLC), Site: c.Site[:]}
	if c.ID != (messages.EventID{}) {
		r.ID = c.ID[:]
	}
	return r
}

func fromClockRecord(r clockRecord) (messages.Clock, error) {
	c := messages.Clock{HLC: messages.HLC(r.HLC)}
	switch len(r.Site) {
	case 0:
	case len(c.Site):
		copy(c.Site[:], r.Site)
	default:
		return c, fmt.Errorf("clock site of %d bytes", len(r.Site))
	}
	switch len(r.ID) {
	case 0:
	case len(c.ID):
		copy(c.ID[:], r.ID)
	default:
		return c, fmt.Errorf("clock event id of %d bytes", len(r.ID))
	}
	return c, nil
}

func siteFrom(b []byte) (messages.SiteID, error) {
	var s messages.SiteID
	if len(b) != len(s) {
		return s, fmt.Errorf("site of %d bytes", len(b))
	}
	copy(s[:], b)
	return s, nil
}

// encodeRow writes the rowRecord of row directly (it runs once per applied
// event); TestRecordEncodersMatchCodec proves it byte-identical to
// messages.Marshal(&rowRecord{...}).
func encodeRow(row *persistence.Row) ([]byte, error) {
	return encodeRowTo(make([]byte, 0, rowLen(row)), row), nil
}

// rowLen bounds what encodeRowTo writes (as cellsLen does).
func rowLen(row *persistence.Row) int { return 16 + 2*maxClockLen + cellsLen(row.Cells) }

// encodeRowTo appends the rowRecord of row to b.
func encodeRowTo(b []byte, row *persistence.Row) []byte {
	b = messages.AppendMapHeader(b, 5)
	b = messages.AppendUint(messages.AppendUint(b, 1), rowRecordVersion)
	b = messages.AppendBool(messages.AppendUint(b, 2), row.Exists)
	b = appendClock(messages.AppendUint(b, 3), row.Existence)
	b = appendClock(messages.AppendUint(b, 4), row.Tomb)
	return appendCells(messages.AppendUint(b, 5), row.Cells)
}

// maxClockLen is the most appendClock writes: a map of HLC, site and id.
const maxClockLen = 1 + 1 + 9 + 1 + 2 + 16 + 1 + 2 + 32

// cellsLen bounds what appendCells writes for cells whose names are
// shorter than 256 bytes and values than 64 KiB (larger ones only cost a
// reallocation), so the encoders allocate their record once instead of
// growing it clock by clock (a third of their time in a profile of the
// apply path).
func cellsLen(cells map[string]persistence.Cell) int {
	n := 9
	for name, c := range cells {
		n += 2 + len(name) + 1 + 1 + 3 + len(c.Value) + 1 + maxClockLen
	}
	return n
}

// appendCells writes a map[string]cellRecord of cells (null when empty,
// as the reflective codec writes the nil map the records hold then).
func appendCells(b []byte, cells map[string]persistence.Cell) []byte {
	if len(cells) == 0 {
		return messages.AppendNull(b)
	}
	b = messages.AppendMapHeader(b, len(cells))
	// Sort the names on the stack when they fit (rows have few columns).
	var stack [16]string
	names := stack[:0]
	for name := range cells {
		names = append(names, name)
	}
	slices.SortFunc(names, messages.CompareShortlex[string])
	for _, name := range names {
		c := cells[name]
		v := []byte(c.Value)
		if v == nil {
			v = []byte{}
		}
		b = messages.AppendText(b, name)
		b = messages.AppendMapHeader(b, 2)
		b = messages.AppendBytes(messages.AppendUint(b, 1), v)
		b = appendClock(messages.AppendUint(b, 2), c.Clock)
	}
	return b
}

// appendArrayHeader writes the head of an array of n items: a uint's head
// with the major type changed to 4.
func appendArrayHeader(b []byte, n int) []byte {
	at := len(b)
	b = messages.AppendUint(b, uint64(n))
	b[at] |= 4 << 5
	return b
}

// appendClock writes a clockRecord (every field omitempty; the site is
// written for every non-zero clock).
func appendClock(b []byte, c messages.Clock) []byte {
	if c.IsZero() {
		return messages.AppendMapHeader(b, 0)
	}
	hasID := c.ID != (messages.EventID{})
	n := 1
	if c.HLC != 0 {
		n++
	}
	if hasID {
		n++
	}
	b = messages.AppendMapHeader(b, n)
	if c.HLC != 0 {
		b = messages.AppendUint(messages.AppendUint(b, 1), uint64(c.HLC))
	}
	b = messages.AppendBytes(messages.AppendUint(b, 2), c.Site[:])
	if hasID {
		b = messages.AppendBytes(messages.AppendUint(b, 3), c.ID[:])
	}
	return b
}

// encodeEvent writes an eventRecord directly (once per appended event);
// proven byte-identical to messages.Marshal by TestRecordEncodersMatchCodec.
func encodeEvent(r *eventRecord) []byte { return encodeEventTo(make([]byte, 0, eventLen(r)), r) }

// eventLen bounds what encodeEventTo writes.
func eventLen(r *eventRecord) int {
	return 64 + len(r.ID) + len(r.Site) + len(r.Schema) + len(r.Table) + len(r.RowKey) + len(r.Raw)
}

// encodeEventTo appends the eventRecord r to b.
func encodeEventTo(b []byte, r *eventRecord) []byte {
	b = messages.AppendMapHeader(b, 8)
	b = messages.AppendUint(messages.AppendUint(b, 1), r.V)
	b = messages.AppendBytes(messages.AppendUint(b, 2), r.ID)
	b = messages.AppendBytes(messages.AppendUint(b, 3), r.Site)
	b = messages.AppendUint(messages.AppendUint(b, 4), r.HLC)
	b = messages.AppendText(messages.AppendUint(b, 5), r.Schema)
	b = messages.AppendText(messages.AppendUint(b, 6), r.Table)
	b = messages.AppendBytes(messages.AppendUint(b, 7), r.RowKey)
	return messages.AppendBytes(messages.AppendUint(b, 8), r.Raw)
}

func decodeRow(t persistence.TableKey, rowKey, b []byte) (persistence.Row, error) {
	var rec rowRecord
	if err := decodeRecordVersion("row", b, &rec, &rec.V, rowRecordVersion); err != nil {
		return persistence.Row{}, err
	}
	key, err := messages.DecodeColumns(rowKey)
	if err != nil {
		return persistence.Row{}, corrupt("row key", err)
	}
	row := persistence.Row{Schema: t.Schema, Table: t.Table, Key: key, Exists: rec.Exists}
	if row.Existence, err = fromClockRecord(rec.Existence); err != nil {
		return row, corrupt("row existence", err)
	}
	if row.Tomb, err = fromClockRecord(rec.Tomb); err != nil {
		return row, corrupt("row tomb", err)
	}
	if len(rec.Cells) > 0 {
		row.Cells = make(map[string]persistence.Cell, len(rec.Cells))
		for n, c := range rec.Cells {
			clk, err := fromClockRecord(c.Clock)
			if err != nil {
				return row, corrupt("row cell", err)
			}
			row.Cells[n] = persistence.Cell{Value: messages.Value(c.Value), Clock: clk}
		}
	}
	return row, nil
}
