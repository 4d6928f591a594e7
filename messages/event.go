package messages

import (
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

type cborRaw = cbor.RawMessage

// EventVersion is the only event encoding version this build reads and writes.
const EventVersion = 1

// Limits on events.
const (
	maxEventSize = 256 << 10 // bytes of one encoded event
	maxNameLen   = 255       // schema, table and column names
)

// MaxEventSize is the largest encoded event the decoder accepts.
const MaxEventSize = maxEventSize

// Event is one SSP/1 write: an upsert of some columns of a row, or a delete
// of the row. Its CBOR form is a map with text keys v, site, hlc, schema,
// table, key and payload, where payload is null for a delete.
type Event struct {
	Site   SiteID
	HLC    HLC
	Schema string
	Table  string
	// Key names the row: a non-empty map from key column to value.
	Key Columns
	// Payload holds the upserted columns (values may be null). Nil for a delete.
	Payload Columns
	// Delete marks a tombstone event; Payload is then nil.
	Delete bool
}

// Clock returns the event's (HLC, site) clock.
func (e *Event) Clock() Clock { return Clock{HLC: e.HLC, Site: e.Site} }

// RowKey returns the deterministic encoding of the row key: the row's identity.
func (e *Event) RowKey() []byte { return e.Key.Encode() }

type wireEvent struct {
	V       uint64       `cbor:"v"`
	Site    bstr         `cbor:"site"`
	HLC     *uint64      `cbor:"hlc"`
	Schema  string       `cbor:"schema"`
	Table   string       `cbor:"table"`
	Key     columnsField `cbor:"key"`
	Payload columnsField `cbor:"payload"`
}

// columnsField decodes an event's key or payload in one pass: null, or a
// map of columns (strictly, with the same decoder). set tells a present
// field from an absent one.
type columnsField struct {
	set  bool
	null bool
	cols Columns
}

// UnmarshalCBOR implements cbor.Unmarshaler.
func (f *columnsField) UnmarshalCBOR(data []byte) error {
	f.set = true
	if Value(data).IsNull() {
		f.null = true
		return nil
	}
	return decMode.Unmarshal(data, &f.cols)
}

// wireEventOut is the encoding side of wireEvent.
type wireEventOut struct {
	V       uint64  `cbor:"v"`
	Site    []byte  `cbor:"site"`
	HLC     uint64  `cbor:"hlc"`
	Schema  string  `cbor:"schema"`
	Table   string  `cbor:"table"`
	Key     cborRaw `cbor:"key"`
	Payload cborRaw `cbor:"payload"`
}

// EncodeEvent returns the deterministic CBOR encoding of e. It validates e
// as DecodeEvent would.
func EncodeEvent(e *Event) ([]byte, error) {
	if err := validateNames(e.Schema, e.Table, e.Key); err != nil {
		return nil, err
	}
	if len(e.Key) == 0 {
		return nil, fmt.Errorf("messages: encode event: %w", ErrEmptyRowKey)
	}
	if e.Delete && e.Payload != nil {
		return nil, fmt.Errorf("messages: encode event: a delete carries no payload")
	}
	if !e.Delete && e.Payload == nil {
		return nil, fmt.Errorf("messages: encode event: an upsert needs a payload map (empty is allowed)")
	}
	if err := validateColumns(e.Payload); err != nil {
		return nil, err
	}
	for _, cols := range []Columns{e.Key, e.Payload} {
		for k, v := range cols {
			if err := Wellformed(v); err != nil {
				return nil, fmt.Errorf("messages: encode event: column %q: %w", k, err)
			}
		}
	}
	h := uint64(e.HLC)
	w := wireEventOut{V: EventVersion, Site: e.Site[:], HLC: h, Schema: e.Schema, Table: e.Table, Key: e.Key.Encode()}
	if e.Delete {
		w.Payload = cborRaw(Null)
	} else {
		w.Payload = e.Payload.Encode()
	}
	b, err := Marshal(&w)
	if err != nil {
		return nil, err
	}
	if len(b) > maxEventSize {
		return nil, fmt.Errorf("messages: encode event: %d bytes: %w", len(b), ErrTooLarge)
	}
	return b, nil
}

// DecodeEvent strictly decodes one event. A null or empty key decodes to
// an error matching ErrEmptyRowKey, so the apply path can drop and surface
// it (SSP/1 §13.6).
func DecodeEvent(b []byte) (*Event, error) {
	var w wireEvent
	if err := Unmarshal("event", b, &w, maxEventSize); err != nil {
		return nil, err
	}
	if w.V != EventVersion {
		return nil, decodeErr("event", ErrUnsupportedVersion, fmt.Errorf("version %d", w.V))
	}
	e := &Event{Schema: w.Schema, Table: w.Table}
	if len(w.Site) != len(e.Site) {
		return nil, decodeErr("event", ErrMalformed, fmt.Errorf("site must be %d bytes", len(e.Site)))
	}
	copy(e.Site[:], w.Site)
	if w.HLC == nil {
		return nil, decodeErr("event", ErrMalformed, fmt.Errorf("missing hlc"))
	}
	e.HLC = HLC(*w.HLC)
	if !w.Key.set || !w.Payload.set {
		return nil, decodeErr("event", ErrMalformed, fmt.Errorf("missing key or payload"))
	}
	if err := validateNames(e.Schema, e.Table, nil); err != nil {
		return nil, decodeErr("event", ErrMalformed, err)
	}
	if w.Key.null {
		return nil, decodeErr("event", ErrEmptyRowKey, nil)
	}
	key := w.Key.cols
	if len(key) == 0 {
		return nil, decodeErr("event", ErrEmptyRowKey, nil)
	}
	if err := validateColumns(key); err != nil {
		return nil, decodeErr("event", ErrMalformed, err)
	}
	e.Key = key
	if w.Payload.null {
		e.Delete = true
		return e, nil
	}
	payload := w.Payload.cols
	if payload == nil {
		payload = Columns{}
	}
	if err := validateColumns(payload); err != nil {
		return nil, decodeErr("event", ErrMalformed, err)
	}
	e.Payload = payload
	return e, nil
}

func validateNames(schema, table string, _ Columns) error {
	if schema == "" || table == "" {
		return fmt.Errorf("messages: schema and table must be non-empty")
	}
	if len(schema) > maxNameLen || len(table) > maxNameLen {
		return fmt.Errorf("messages: schema or table name longer than %d bytes", maxNameLen)
	}
	return nil
}

func validateColumns(c Columns) error {
	for k := range c {
		if k == "" || len(k) > maxNameLen {
			return fmt.Errorf("messages: column name must be 1..%d bytes", maxNameLen)
		}
	}
	return nil
}

// bstr is a []byte that decodes only from a CBOR byte string; a plain
// []byte would also accept an array of small integers.
type bstr []byte

// UnmarshalCBOR rejects anything but a definite-length byte string.
func (b *bstr) UnmarshalCBOR(data []byte) error {
	if len(data) == 0 || data[0]>>5 != 2 {
		return fmt.Errorf("cbor: expected a byte string")
	}
	return decMode.Unmarshal(data, (*[]byte)(b))
}
