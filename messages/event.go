package messages

import (
	"fmt"
	"unicode/utf8"
	"unsafe"

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

// Clock returns the event's (HLC, site) clock without its id: for display
// and for comparisons where the id cannot matter. Materialization compares
// ClockOf(id).
func (e *Event) Clock() Clock { return Clock{HLC: e.HLC, Site: e.Site} }

// ClockOf returns the event's full clock (HLC, site, id), id being the
// event's id (the BLAKE3 of its signed bytes): what the materializer
// compares and stores.
func (e *Event) ClockOf(id EventID) Clock { return Clock{HLC: e.HLC, Site: e.Site, ID: id} }

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
	for k, v := range e.Key {
		if err := Wellformed(v); err != nil {
			return nil, fmt.Errorf("messages: encode event: key column %q: %w", k, err)
		}
	}
	if err := checkRowKey(e.Key); err != nil {
		return nil, fmt.Errorf("messages: encode event: %w: %w", ErrNonCanonicalKey, err)
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
	e, _, err := DecodeEventRowKey(b)
	return e, err
}

// DecodeEventRowKey is DecodeEvent that also returns the event's row key
// encoding (Event.RowKey) when the decoder read it as it is — the key map
// of a canonically encoded event is its own canonical encoding — and nil
// otherwise (call RowKey). The returned bytes are the caller's, like the
// event, and must not be modified.
func DecodeEventRowKey(b []byte) (*Event, []byte, error) {
	if e, rowKey, ok := decodeEventCanonical(b); ok {
		return e, rowKey, nil
	}
	e, err := decodeEventStrict(b)
	return e, nil, err
}

// DecodeEventOwned is DecodeEventRowKey decoding into *e for a caller
// that hands b over: the event's names and values, and the row key, share
// b instead of a copy of it, so b must never be modified afterwards (nor
// may the event's). *e is written only when err is nil. It spares the
// apply path a copy and an allocation per event (crypto/sign decodes a
// verified batch into one allocation of events, each payload copied once).
func DecodeEventOwned(e *Event, b []byte) (rowKey []byte, err error) {
	if rowKey, ok := decodeCanonicalInto(e, b); ok {
		return rowKey, nil
	}
	s, err := decodeEventStrict(b)
	if err != nil {
		return nil, err
	}
	*e = *s
	return nil, nil
}

// decodeEventStrict is the general strict decoder: every input the fast
// path leaves, and the fast path's reference.
func decodeEventStrict(b []byte) (*Event, error) {
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
	if err := checkRowKey(key); err != nil {
		return nil, decodeErr("event", ErrNonCanonicalKey, err)
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

// The canonical fast path. DecodeEvent runs once per received event; the
// reflective decoder costs microseconds and a dozen allocations. Almost
// every event arrives exactly as EncodeEvent wrote it, so that one shape
// is read by hand first. The fast path accepts only inputs the strict
// decoder also accepts, with the same result (FuzzDecodeEventCanonical
// cross-checks them); anything else — every error, every non-canonical
// or unusual input — falls through to the strict decoder, which decides.

// Encoded map keys of the wire event in Core Deterministic order (RFC 8949
// §4.2.1: shorter first, then bytewise), as EncodeEvent writes them.
var (
	wireKeyV       = []byte{0x61, 'v'}
	wireKeyHLC     = []byte{0x63, 'h', 'l', 'c'}
	wireKeyKey     = []byte{0x63, 'k', 'e', 'y'}
	wireKeySite    = []byte{0x64, 's', 'i', 't', 'e'}
	wireKeyTable   = []byte{0x65, 't', 'a', 'b', 'l', 'e'}
	wireKeySchema  = []byte{0x66, 's', 'c', 'h', 'e', 'm', 'a'}
	wireKeyPayload = []byte{0x67, 'p', 'a', 'y', 'l', 'o', 'a', 'd'}
)

// canonReader reads shortest-form, definite-length CBOR. Any surprise sets
// bad; the caller then abandons the fast path.
type canonReader struct {
	b   []byte
	bad bool
}

// head reads a head of the given major type whose argument is in its
// shortest form.
func (r *canonReader) head(major byte) uint64 {
	if r.bad || len(r.b) == 0 || r.b[0]>>5 != major {
		r.bad = true
		return 0
	}
	n, rest, ok := shortestHead(r.b)
	if !ok {
		r.bad = true
		return 0
	}
	r.b = rest
	return n
}

// take returns the next n bytes.
func (r *canonReader) take(n uint64) []byte {
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// literal consumes exactly lit.
func (r *canonReader) literal(lit []byte) {
	if r.bad || len(r.b) < len(lit) || string(r.b[:len(lit)]) != string(lit) {
		r.bad = true
		return
	}
	r.b = r.b[len(lit):]
}

// str reads a valid UTF-8 text string as a string sharing the reader's
// bytes: the decoder reads a private copy of its input that nothing
// writes, so the names need no allocation of their own.
func (r *canonReader) str() string {
	t := r.text()
	if len(t) == 0 {
		return ""
	}
	return unsafe.String(&t[0], len(t))
}

// text reads a valid UTF-8 text string.
func (r *canonReader) text() []byte {
	t := r.take(r.head(3))
	if !r.bad && !utf8.Valid(t) {
		r.bad = true
	}
	return t
}

// scalar reads one data item of a kind that cannot nest — an integer, a
// byte or text string, false, true, null or a float — and returns its
// encoding. Arrays, maps, tags and anything rarer are left to the strict
// decoder (its nesting and size limits count from the top of the event).
func (r *canonReader) scalar() []byte {
	start := r.b
	if r.bad || len(r.b) == 0 {
		r.bad = true
		return nil
	}
	switch major := r.b[0] >> 5; major {
	case 0, 1:
		r.head(major)
	case 2:
		r.take(r.head(2))
	case 3:
		r.text()
	case 7:
		switch r.b[0] {
		case 0xf4, 0xf5, 0xf6:
			r.b = r.b[1:]
		case 0xf9:
			r.take(3)
		case 0xfa:
			r.take(5)
		case 0xfb:
			r.take(9)
		default:
			r.bad = true
		}
	default:
		r.bad = true
	}
	if r.bad {
		return nil
	}
	n := len(start) - len(r.b)
	return start[:n:n]
}

// columns reads a non-empty map of column name → scalar value whose names
// are valid, 1..maxNameLen bytes, and strictly in canonical order (so
// unique). Values alias the reader's input (names too when shared: the
// event decoder's private copy).
func (r *canonReader) columns() Columns { return r.columnsOf(false) }

func (r *canonReader) columnsOf(shared bool) Columns {
	n := r.head(5)
	if r.bad || n == 0 || n > maxMapPairs || n > uint64(len(r.b))/2 {
		r.bad = true
		return nil
	}
	cols := make(Columns, n)
	var prev []byte
	for i := uint64(0); i < n && !r.bad; i++ {
		name := r.text()
		if r.bad || len(name) == 0 || len(name) > maxNameLen {
			r.bad = true
			return nil
		}
		if prev != nil && !LessShortlex(prev, name) {
			r.bad = true
			return nil
		}
		prev = name
		v := r.scalar()
		if r.bad {
			return nil
		}
		if shared {
			cols[unsafe.String(&name[0], len(name))] = Value(v)
		} else {
			cols[string(name)] = Value(v)
		}
	}
	return cols
}

// decodeEventCanonical decodes the canonical encoding of an event with a
// non-empty key and a valid shape; ok is false for anything else. rowKey
// is the key map's bytes: a canonical map is its own Columns.Encode.
func decodeEventCanonical(in []byte) (e *Event, rowKey []byte, ok bool) {
	if len(in) > maxEventSize {
		return nil, nil, false
	}
	// One copy of the input backs every value and name, as the strict
	// decoder's per-value copies would: the event never aliases the
	// caller's bytes, and nothing writes the copy.
	var ev Event
	if rowKey, ok = decodeCanonicalInto(&ev, append([]byte(nil), in...)); !ok {
		return nil, nil, false
	}
	e = new(Event)
	*e = ev
	return e, rowKey, true
}

// decodeCanonicalInto is decodeEventCanonical into *e (written only when
// ok) over bytes b it may share: every name, value and the row key alias b.
func decodeCanonicalInto(e *Event, b []byte) (rowKey []byte, ok bool) {
	if len(b) > maxEventSize {
		return nil, false
	}
	r := canonReader{b: b}
	if r.head(5) != 7 {
		return nil, false
	}
	r.literal(wireKeyV)
	if r.head(0) != EventVersion {
		return nil, false
	}
	r.literal(wireKeyHLC)
	hlc := r.head(0)
	r.literal(wireKeyKey)
	keyAt := r.b
	key := r.columnsOf(true)
	rowKey = keyAt[: len(keyAt)-len(r.b) : len(keyAt)-len(r.b)]
	r.literal(wireKeySite)
	site := r.take(r.head(2))
	r.literal(wireKeyTable)
	table := r.str()
	r.literal(wireKeySchema)
	schema := r.str()
	r.literal(wireKeyPayload)
	var payload Columns
	del := false
	switch {
	case r.bad || len(r.b) == 0:
		return nil, false
	case r.b[0] == 0xf6:
		r.b, del = r.b[1:], true
	case r.b[0] == 0xa0:
		r.b, payload = r.b[1:], Columns{}
	default:
		payload = r.columnsOf(true)
	}
	if r.bad || len(r.b) != 0 || len(site) != len(SiteID{}) {
		return nil, false
	}
	if validateNames(schema, table, nil) != nil || checkRowKey(key) != nil {
		return nil, false
	}
	*e = Event{HLC: HLC(hlc), Schema: schema, Table: table, Key: key, Payload: payload, Delete: del}
	copy(e.Site[:], site)
	return rowKey, true
}
