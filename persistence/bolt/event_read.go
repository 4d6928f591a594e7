package bolt

import (
	"bytes"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// readEvent decodes an event record by hand: a sender reads every event
// it pushes (EventsAfter), and the reflective decoder was most of a
// catch-up source's log read. It accepts exactly what encodeEvent writes
// (shortest heads, the fixed field order, this record version, a 32-byte
// id and a 16-byte site, valid UTF-8 names, null for a nil row key or raw,
// nothing after the record) and
// reads it as decodeEvent does; anything else is left to decodeEvent,
// which decides (FuzzReadEvent holds the two equal). One copy backs Raw
// and RowKey: the event never aliases bbolt memory.
func readEvent(seq uint64, v []byte) (persistence.StoredEvent, error) {
	if ev, ok := readCanonicalEvent(seq, v); ok {
		return ev, nil
	}
	return decodeEvent(seq, v)
}

func readCanonicalEvent(seq uint64, v []byte) (persistence.StoredEvent, bool) {
	ev := persistence.StoredEvent{Seq: seq}
	if len(v) > maxRecordSize {
		return ev, false
	}
	r := cborReader{b: bytes.Clone(v)}
	if r.mapLen() != 8 || r.uint() != 1 || r.uint() != recordVersion || r.uint() != 2 {
		return ev, false
	}
	if id := r.bytes(); len(id) == len(ev.ID) {
		copy(ev.ID[:], id)
	} else {
		return ev, false
	}
	if r.uint() != 3 {
		return ev, false
	}
	if site := r.bytes(); len(site) == len(ev.Site) {
		copy(ev.Site[:], site)
	} else {
		return ev, false
	}
	if r.uint() != 4 {
		return ev, false
	}
	ev.HLC = messages.HLC(r.uint())
	if r.uint() != 5 {
		return ev, false
	}
	ev.Schema = r.text()
	if r.uint() != 6 {
		return ev, false
	}
	ev.Table = r.text()
	if r.uint() != 7 {
		return ev, false
	}
	ev.RowKey = r.nullableBytes()
	if r.uint() != 8 {
		return ev, false
	}
	ev.Raw = r.nullableBytes()
	return ev, r.err == nil && len(r.b) == 0
}

// nullableBytes reads a byte string, or null for a nil slice (as
// messages.AppendBytes writes it).
func (r *cborReader) nullableBytes() []byte {
	if r.null() {
		return nil
	}
	return r.bytes()
}
