package messages

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// ReconcileVersion is the version of the set-reconciliation messages this
// build speaks; another version is rejected with ErrUnsupportedVersion.
// A Reconcile round that carries a RangeSum is version ReconcileSumVersion
// (a build that only speaks version 1 refuses it with a typed error);
// every other message, and a round without one, is version 1. A round
// whose fingerprints all come from range sums (Reconcile.SumRanges) is
// version ReconcileRangeSumVersion, whatever its modes: a build that
// speaks only versions 1 and 2 refuses it with a typed error, and the
// initiator falls back to version 2 for that peer.
const (
	ReconcileVersion         = 1
	ReconcileSumVersion      = 2
	ReconcileRangeSumVersion = 3
)

// Sizes and limits of the reconciliation messages. The encoder checks the
// same limits as the decoder, so a message this build writes is one it
// (and its peer) will read.
const (
	// ReconcileKeySize is the size of an item key: site(16) | HLC(8, big
	// endian) | event id(32). Byte order of keys is (site, HLC, id) order.
	ReconcileKeySize = 16 + 8 + 32
	// FingerprintSize is the size of a range fingerprint.
	FingerprintSize = 16
	// MaxReconcileBytes bounds an encoded Reconcile or ReconcileFetch.
	MaxReconcileBytes = 1 << 20
	// MaxReconcileGroups bounds the groups of one message. (No array of a
	// message is longer than the codec's 4096 elements.)
	MaxReconcileGroups = 1024
	// MaxReconcileRanges bounds the ranges of one message (all groups).
	MaxReconcileRanges = 4096
	// MaxReconcileKeys bounds the keys of one message (all id lists and
	// replies of all groups; for a fetch, the keys asked for).
	MaxReconcileKeys = 4096
	// MaxReconcileEvents bounds the events of one ReconcileEvents.
	MaxReconcileEvents = MaxPushEvents
	// MaxReconcileEventBytes bounds an encoded ReconcileEvents.
	MaxReconcileEventBytes = MaxPushBytes
)

// ReconcileKey orders the items of a reconciliation: site | HLC | event id.
type ReconcileKey [ReconcileKeySize]byte

// NewReconcileKey builds the key of an event.
func NewReconcileKey(site SiteID, h HLC, id EventID) ReconcileKey {
	var k ReconcileKey
	copy(k[:16], site[:])
	binary.BigEndian.PutUint64(k[16:24], uint64(h))
	copy(k[24:], id[:])
	return k
}

// Site returns the key's site.
func (k ReconcileKey) Site() (s SiteID) { copy(s[:], k[:16]); return s }

// HLC returns the key's HLC.
func (k ReconcileKey) HLC() HLC { return HLC(binary.BigEndian.Uint64(k[16:24])) }

// ID returns the key's event id.
func (k ReconcileKey) ID() (id EventID) { copy(id[:], k[24:]); return id }

// RangeMode says what a range of a Reconcile message carries.
type RangeMode uint8

// Range modes (Meyer's range-based set reconciliation, as in Negentropy).
const (
	// RangeSkip: nothing more to do for the range.
	RangeSkip RangeMode = iota
	// RangeFingerprint: the sender's fingerprint of its items in the range.
	RangeFingerprint
	// RangeIDList: every key the sender holds in the range.
	RangeIDList
	// RangeIDReply answers a RangeIDList: Keys are the sender's keys the
	// list lacked, Need a bitmap over the list of the keys the sender lacks.
	RangeIDReply
	// RangeSum (version 2): the sender's fingerprint of all of the group's
	// items, from the range sum (count and LtHash16 of the keys) its
	// store keeps, so agreement costs no pass over the items. It is the
	// group's only range.
	RangeSum
	rangeModes
)

// ReconcileRange is one range of a group: it covers the keys from the
// previous range's Upper (the empty string for the first) up to, not
// including, Upper; nil Upper is +∞ and only the last range has it.
type ReconcileRange struct {
	Mode  RangeMode
	Upper []byte // a key prefix (at most ReconcileKeySize bytes); nil: +∞
	FP    [FingerprintSize]byte
	Keys  []ReconcileKey
	Need  []byte
}

// ReconcileGroup is the reconciliation of one table: the items are the
// events of the table with an HLC at or above Bound, ordered by key.
type ReconcileGroup struct {
	Schema, Table string
	Bound         HLC
	Ranges        []ReconcileRange
}

// Reconcile is one round of a reconciliation. A group absent from a
// message is finished (or not synced by the sender).
type Reconcile struct {
	Groups []ReconcileGroup
	// SumRanges (version 3): every RangeFingerprint carries the
	// fingerprint of its range's count and LtHash16 sum, as RangeSum does
	// for a whole group, instead of the SHA-256 of the range's keys. A
	// responder answers in the version it was asked in.
	SumRanges bool
}

// FetchGroup asks for the events of one table by key.
type FetchGroup struct {
	Schema, Table string
	Keys          []ReconcileKey
}

// ReconcileFetch asks the peer for signed events it holds.
type ReconcileFetch struct {
	Groups []FetchGroup
}

// ReconcileEvents carries signed events (COSE_Sign1, as received): the
// answer to a fetch, or events offered to a peer that lacks them.
type ReconcileEvents struct {
	Events [][]byte
}

// ReconcileAck answers offered ReconcileEvents: how many the receiver
// applied (new or duplicate), and how many it dropped for good.
type ReconcileAck struct {
	Applied, Dropped uint64
}

// Wire forms: bounds and keys are prefix-compressed against the previous
// one (shared prefix length, then the rest), since sorted keys of one
// site share its 16 bytes and most of the HLC. A range is one flat array
// [mode, shared, suffix, data, keys]: data is the fingerprint (mode
// fingerprint) or the need bitmap (mode id reply); keys packs each key as
// shared(1) | suffix length(1) | suffix.
type wireRange struct {
	_      struct{} `cbor:",toarray"`
	Mode   uint64
	Shared uint64
	Suffix []byte
	Data   []byte
	Keys   []byte
}

type wireGroup struct {
	_      struct{} `cbor:",toarray"`
	Schema string
	Table  string
	Bound  HLC
	Ranges []wireRange
}

type wireReconcile struct {
	V      uint64      `cbor:"v"`
	Groups []wireGroup `cbor:"g"`
}

type wireFetchGroup struct {
	_      struct{} `cbor:",toarray"`
	Schema string
	Table  string
	Keys   []byte // packed as in wireRange
}

type wireFetch struct {
	V      uint64           `cbor:"v"`
	Groups []wireFetchGroup `cbor:"g"`
}

type wireEvents struct {
	V      uint64   `cbor:"v"`
	Events [][]byte `cbor:"e"`
}

type wireReconcileAck struct {
	V       uint64 `cbor:"v"`
	Applied uint64 `cbor:"a"`
	Dropped uint64 `cbor:"d"`
}

// invalid reports a rule broken by a reconciliation message; it matches
// ErrReconcileInvalid and ErrMalformed.
func invalid(format string, args ...any) error {
	return decodeErr("reconcile message", ErrReconcileInvalid, fmt.Errorf(format, args...))
}

func sharedLen(prev, cur []byte) int {
	n := 0
	for n < len(prev) && n < len(cur) && prev[n] == cur[n] {
		n++
	}
	return n
}

func unprefix(prev []byte, shared uint64, suffix []byte) ([]byte, error) {
	if shared > uint64(len(prev)) || shared+uint64(len(suffix)) > ReconcileKeySize {
		return nil, invalid("prefix of %d+%d bytes after %d", shared, len(suffix), len(prev))
	}
	out := make([]byte, 0, int(shared)+len(suffix))
	return append(append(out, prev[:shared]...), suffix...), nil
}

// packKeys prefix-compresses sorted keys into one byte string.
func packKeys(keys []ReconcileKey) []byte {
	out := make([]byte, 0, len(keys)*(ReconcileKeySize/2))
	var prev []byte
	for i := range keys {
		n := sharedLen(prev, keys[i][:])
		out = append(out, byte(n), byte(ReconcileKeySize-n))
		out = append(out, keys[i][n:]...)
		prev = keys[i][:]
	}
	return out
}

// unpackKeys reverses packKeys, taking at most limit keys.
func unpackKeys(b []byte, limit int) ([]ReconcileKey, error) {
	var out []ReconcileKey
	var prev []byte
	for len(b) > 0 {
		if len(out) == limit {
			return nil, invalid("more than %d keys", limit)
		}
		if len(b) < 2 || int(b[0])+int(b[1]) != ReconcileKeySize || len(b)-2 < int(b[1]) || int(b[0]) > len(prev) {
			return nil, invalid("packed key at %d bytes from the end", len(b))
		}
		var k ReconcileKey
		copy(k[:], prev[:b[0]])
		copy(k[b[0]:], b[2:2+int(b[1])])
		b = b[2+int(b[1]):]
		out = append(out, k)
		prev = out[len(out)-1][:]
	}
	return out, nil
}

func validName(schema, table string) error {
	if schema == "" || table == "" || len(schema) > maxPeerName || len(table) > maxPeerName {
		return invalid("group %q/%q", schema, table)
	}
	return nil
}

// groupLess orders groups by (schema, table): messages list them strictly
// ascending, so a group appears at most once.
func groupLess(as, at, bs, bt string) bool {
	return as < bs || (as == bs && at < bt)
}

func validKeys(keys []ReconcileKey) error {
	for i := 1; i < len(keys); i++ {
		if bytes.Compare(keys[i-1][:], keys[i][:]) >= 0 {
			return invalid("keys not strictly ascending at %d", i)
		}
	}
	return nil
}

// Validate checks the protocol rules of a reconciliation round.
func (m *Reconcile) Validate() error {
	if len(m.Groups) > MaxReconcileGroups {
		return invalid("%d groups, limit %d", len(m.Groups), MaxReconcileGroups)
	}
	ranges, keys := 0, 0
	for gi, g := range m.Groups {
		if err := validName(g.Schema, g.Table); err != nil {
			return err
		}
		if gi > 0 && !groupLess(m.Groups[gi-1].Schema, m.Groups[gi-1].Table, g.Schema, g.Table) {
			return invalid("groups not strictly ascending at %d", gi)
		}
		if len(g.Ranges) == 0 {
			return invalid("group %s.%s has no range", g.Schema, g.Table)
		}
		ranges += len(g.Ranges)
		if ranges > MaxReconcileRanges {
			return invalid("more than %d ranges", MaxReconcileRanges)
		}
		var lower []byte
		for ri, r := range g.Ranges {
			last := ri == len(g.Ranges)-1
			if last != (r.Upper == nil) {
				return invalid("group %s.%s range %d: only the last range is unbounded", g.Schema, g.Table, ri)
			}
			if r.Upper != nil && (len(r.Upper) == 0 || len(r.Upper) > ReconcileKeySize || bytes.Compare(lower, r.Upper) >= 0) {
				return invalid("group %s.%s range %d: bound not ascending or of %d bytes", g.Schema, g.Table, ri, len(r.Upper))
			}
			if r.Mode >= rangeModes {
				return invalid("range mode %d", r.Mode)
			}
			if r.Mode == RangeSum && len(g.Ranges) != 1 {
				return invalid("group %s.%s: a range sum is the group's only range", g.Schema, g.Table)
			}
			if r.Mode != RangeFingerprint && r.Mode != RangeSum && r.FP != ([FingerprintSize]byte{}) {
				return invalid("fingerprint in a range of mode %d", r.Mode)
			}
			if len(r.Keys) > 0 && r.Mode != RangeIDList && r.Mode != RangeIDReply {
				return invalid("keys in a range of mode %d", r.Mode)
			}
			if len(r.Need) > 0 && r.Mode != RangeIDReply {
				return invalid("need bitmap in a range of mode %d", r.Mode)
			}
			if len(r.Need) > MaxReconcileKeys/8 {
				return invalid("need bitmap of %d bytes", len(r.Need))
			}
			keys += len(r.Keys)
			if keys > MaxReconcileKeys {
				return invalid("more than %d keys", MaxReconcileKeys)
			}
			if err := validKeys(r.Keys); err != nil {
				return err
			}
			for _, k := range r.Keys {
				if bytes.Compare(k[:], lower) < 0 || (r.Upper != nil && bytes.Compare(k[:], r.Upper) >= 0) {
					return invalid("group %s.%s range %d: key outside the range", g.Schema, g.Table, ri)
				}
			}
			lower = r.Upper
		}
	}
	return nil
}

// EncodeReconcile validates and encodes a reconciliation round.
func EncodeReconcile(m *Reconcile) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	w := wireReconcile{V: ReconcileVersion, Groups: make([]wireGroup, len(m.Groups))}
	if m.SumRanges {
		w.V = ReconcileRangeSumVersion
	}
	for gi, g := range m.Groups {
		if g.Ranges[0].Mode == RangeSum && w.V < ReconcileSumVersion {
			w.V = ReconcileSumVersion
		}
		wg := wireGroup{Schema: g.Schema, Table: g.Table, Bound: g.Bound, Ranges: make([]wireRange, len(g.Ranges))}
		var prevUpper []byte
		for ri, r := range g.Ranges {
			wr := wireRange{Mode: uint64(r.Mode), Suffix: []byte{}, Data: []byte{}, Keys: packKeys(r.Keys)}
			if r.Upper != nil {
				n := sharedLen(prevUpper, r.Upper)
				wr.Shared, wr.Suffix = uint64(n), r.Upper[n:]
				prevUpper = r.Upper
			}
			switch r.Mode {
			case RangeFingerprint, RangeSum:
				wr.Data = r.FP[:]
			case RangeIDReply:
				wr.Data = append(wr.Data, r.Need...)
			}
			wg.Ranges[ri] = wr
		}
		w.Groups[gi] = wg
	}
	b, err := Marshal(&w)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReconcileBytes {
		return nil, invalid("%d bytes, limit %d", len(b), MaxReconcileBytes)
	}
	return b, nil
}

// DecodeReconcile decodes and validates a reconciliation round. Errors
// match ErrMalformed (and ErrUnsupportedVersion, ErrTrailingBytes,
// ErrTooLarge where they apply) or ErrReconcileInvalid.
func DecodeReconcile(data []byte) (*Reconcile, error) {
	var w wireReconcile
	if err := Unmarshal("reconcile", data, &w, MaxReconcileBytes); err != nil {
		return nil, err
	}
	if w.V != ReconcileVersion && w.V != ReconcileSumVersion && w.V != ReconcileRangeSumVersion {
		return nil, decodeErr("reconcile", ErrUnsupportedVersion, fmt.Errorf("version %d", w.V))
	}
	if len(w.Groups) > MaxReconcileGroups {
		return nil, invalid("%d groups, limit %d", len(w.Groups), MaxReconcileGroups)
	}
	sums := false
	m := &Reconcile{Groups: make([]ReconcileGroup, len(w.Groups)), SumRanges: w.V == ReconcileRangeSumVersion}
	for gi, wg := range w.Groups {
		g := ReconcileGroup{Schema: wg.Schema, Table: wg.Table, Bound: wg.Bound, Ranges: make([]ReconcileRange, len(wg.Ranges))}
		var prevUpper []byte
		for ri, wr := range wg.Ranges {
			if wr.Mode >= uint64(rangeModes) {
				return nil, invalid("range mode %d", wr.Mode)
			}
			r := ReconcileRange{Mode: RangeMode(wr.Mode)}
			sums = sums || r.Mode == RangeSum
			if ri < len(wg.Ranges)-1 {
				u, err := unprefix(prevUpper, wr.Shared, wr.Suffix)
				if err != nil {
					return nil, err
				}
				r.Upper, prevUpper = u, u
			} else if wr.Shared != 0 || len(wr.Suffix) != 0 {
				return nil, invalid("last range of %s.%s is bounded", wg.Schema, wg.Table)
			}
			switch {
			case (r.Mode == RangeFingerprint || r.Mode == RangeSum) && len(wr.Data) == FingerprintSize:
				copy(r.FP[:], wr.Data)
			case r.Mode == RangeFingerprint || r.Mode == RangeSum:
				return nil, invalid("fingerprint of %d bytes", len(wr.Data))
			case r.Mode == RangeIDReply && len(wr.Data) > 0:
				r.Need = wr.Data
			case len(wr.Data) != 0:
				return nil, invalid("data of %d bytes in mode %d", len(wr.Data), r.Mode)
			}
			keys, err := unpackKeys(wr.Keys, MaxReconcileKeys)
			if err != nil {
				return nil, err
			}
			r.Keys = keys
			g.Ranges[ri] = r
		}
		m.Groups[gi] = g
	}
	if w.V != ReconcileRangeSumVersion && sums != (w.V == ReconcileSumVersion) {
		// A version-1 round cannot carry a sum; a version-2 one does; a
		// version-3 one may.
		return nil, decodeErr("reconcile", ErrUnsupportedVersion, fmt.Errorf("version %d with range sums %v", w.V, sums))
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Validate checks the protocol rules of a fetch.
func (f *ReconcileFetch) Validate() error {
	if len(f.Groups) > MaxReconcileGroups {
		return invalid("%d groups, limit %d", len(f.Groups), MaxReconcileGroups)
	}
	keys := 0
	for gi, g := range f.Groups {
		if err := validName(g.Schema, g.Table); err != nil {
			return err
		}
		if gi > 0 && !groupLess(f.Groups[gi-1].Schema, f.Groups[gi-1].Table, g.Schema, g.Table) {
			return invalid("groups not strictly ascending at %d", gi)
		}
		if len(g.Keys) == 0 {
			return invalid("fetch group %s.%s asks for nothing", g.Schema, g.Table)
		}
		if keys += len(g.Keys); keys > MaxReconcileKeys {
			return invalid("more than %d keys", MaxReconcileKeys)
		}
		if err := validKeys(g.Keys); err != nil {
			return err
		}
	}
	return nil
}

// EncodeReconcileFetch validates and encodes a fetch.
func EncodeReconcileFetch(f *ReconcileFetch) ([]byte, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	w := wireFetch{V: ReconcileVersion, Groups: make([]wireFetchGroup, len(f.Groups))}
	for i, g := range f.Groups {
		w.Groups[i] = wireFetchGroup{Schema: g.Schema, Table: g.Table, Keys: packKeys(g.Keys)}
	}
	b, err := Marshal(&w)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReconcileBytes {
		return nil, invalid("%d bytes, limit %d", len(b), MaxReconcileBytes)
	}
	return b, nil
}

// DecodeReconcileFetch decodes and validates a fetch.
func DecodeReconcileFetch(data []byte) (*ReconcileFetch, error) {
	var w wireFetch
	if err := Unmarshal("reconcile fetch", data, &w, MaxReconcileBytes); err != nil {
		return nil, err
	}
	if w.V != ReconcileVersion {
		return nil, decodeErr("reconcile fetch", ErrUnsupportedVersion, fmt.Errorf("version %d", w.V))
	}
	if len(w.Groups) > MaxReconcileGroups {
		return nil, invalid("%d groups, limit %d", len(w.Groups), MaxReconcileGroups)
	}
	f := &ReconcileFetch{Groups: make([]FetchGroup, len(w.Groups))}
	for i, wg := range w.Groups {
		keys, err := unpackKeys(wg.Keys, MaxReconcileKeys)
		if err != nil {
			return nil, err
		}
		f.Groups[i] = FetchGroup{Schema: wg.Schema, Table: wg.Table, Keys: keys}
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
}

// Validate checks the limits of an events message.
func (e *ReconcileEvents) Validate() error {
	if len(e.Events) > MaxReconcileEvents {
		return invalid("%d events, limit %d", len(e.Events), MaxReconcileEvents)
	}
	for i, raw := range e.Events {
		if len(raw) == 0 {
			return invalid("event %d is empty", i)
		}
	}
	return nil
}

// EncodeReconcileEvents validates and encodes an events message.
func EncodeReconcileEvents(e *ReconcileEvents) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	w := wireEvents{V: ReconcileVersion, Events: e.Events}
	if w.Events == nil {
		w.Events = [][]byte{}
	}
	b, err := Marshal(&w)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReconcileEventBytes {
		return nil, decodeErr("reconcile events", ErrTooLarge, fmt.Errorf("%d bytes, limit %d", len(b), MaxReconcileEventBytes))
	}
	return b, nil
}

// DecodeReconcileEvents decodes and validates an events message.
func DecodeReconcileEvents(data []byte) (*ReconcileEvents, error) {
	var w wireEvents
	if err := Unmarshal("reconcile events", data, &w, MaxReconcileEventBytes); err != nil {
		return nil, err
	}
	if w.V != ReconcileVersion {
		return nil, decodeErr("reconcile events", ErrUnsupportedVersion, fmt.Errorf("version %d", w.V))
	}
	e := &ReconcileEvents{Events: w.Events}
	if len(e.Events) == 0 {
		e.Events = nil
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e, nil
}

// EncodeReconcileAck encodes an ack.
func EncodeReconcileAck(a *ReconcileAck) ([]byte, error) {
	return Marshal(&wireReconcileAck{V: ReconcileVersion, Applied: a.Applied, Dropped: a.Dropped})
}

// DecodeReconcileAck decodes an ack.
func DecodeReconcileAck(data []byte) (*ReconcileAck, error) {
	var w wireReconcileAck
	if err := Unmarshal("reconcile ack", data, &w, 64); err != nil {
		return nil, err
	}
	if w.V != ReconcileVersion {
		return nil, decodeErr("reconcile ack", ErrUnsupportedVersion, fmt.Errorf("version %d", w.V))
	}
	return &ReconcileAck{Applied: w.Applied, Dropped: w.Dropped}, nil
}
