package ratchet

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
)

// Skipped message keys stored on their own. A record
// holds up to MaxSkippedKeysPerRecord of them (~150 KiB at 2 000); written
// inside the session record, every ratchet step would rewrite them all. A
// store instead keeps the record without its keys (MarshalStateWithoutKeys)
// and each key as an entry addressed by its record-unique sequence number:
// a step writes the small record plus SkippedKeyChanges, the keys it added
// or consumed, evicted or expired.

// SkippedKeyEntrySize is the size of an encoded skipped-key entry:
// version (1) || session id (32) || ratchet public key (32) || message
// number (u32 BE) || time skipped (i64 BE, unix ns) || message key (32).
const SkippedKeyEntrySize = 1 + 32 + 32 + 4 + 8 + 32

const skippedKeyEntryVersion = 1

// SkippedKey is one skipped message key as stored on its own: Seq is its
// number in the record (unique there, never reused; the storage key),
// Entry its encoding (SkippedKeyEntrySize bytes). Entry holds a message
// key: seal it at rest.
type SkippedKey struct {
	Seq   uint64
	Entry []byte
}

func encodeSkippedEntry(id SessionID, k skippedKey) SkippedKey {
	b := make([]byte, 0, SkippedKeyEntrySize)
	b = append(b, skippedKeyEntryVersion)
	b = append(b, id[:]...)
	b = append(b, k.dh[:]...)
	b = binary.BigEndian.AppendUint32(b, k.n)
	b = binary.BigEndian.AppendUint64(b, uint64(k.at))
	b = append(b, k.mk[:]...)
	return SkippedKey{Seq: k.seq, Entry: b}
}

// decodeSkippedEntry decodes an entry stored under seq. Errors match
// messages.ErrMalformed (ErrUnsupportedVersion for another version).
func decodeSkippedEntry(seq uint64, b []byte) (SessionID, skippedKey, error) {
	const what = "ratchet skipped key"
	var id SessionID
	var k skippedKey
	if len(b) > 0 && b[0] != skippedKeyEntryVersion {
		return id, k, &messages.DecodeError{What: what, Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", b[0])}
	}
	if len(b) != SkippedKeyEntrySize {
		return id, k, decodeError(what, fmt.Errorf("%d bytes, want %d", len(b), SkippedKeyEntrySize))
	}
	if seq == 0 {
		return id, k, decodeError(what, fmt.Errorf("number 0"))
	}
	p := b[1:]
	copy(id[:], p[:32])
	copy(k.dh[:], p[32:64])
	k.n = binary.BigEndian.Uint32(p[64:68])
	k.at = int64(binary.BigEndian.Uint64(p[68:76]))
	copy(k.mk[:], p[76:108])
	k.seq = seq
	return id, k, nil
}

// numbered gives the keys session i skipped in this step (seq 0, at the
// end of its list) the record's next numbers, in order. Such keys are
// only in a list the step built (appendSkipped copies), so numbering them
// in place changes no value shared with another record.
func (r SessionRecord) numbered(i int) SessionRecord {
	if i < 0 || i >= len(r.sessions) {
		return r
	}
	s := r.sessions[i]
	next := max(r.nextSeq, 1)
	for j := range s.skipped {
		if s.skipped[j].seq == 0 {
			s.skipped[j].seq = next
			next++
		}
	}
	r.nextSeq = next
	return r
}

// SkippedKeyCount is the number of skipped message keys rec holds.
func (r SessionRecord) SkippedKeyCount() int {
	n := 0
	for _, s := range r.sessions {
		n += len(s.skipped)
	}
	return n
}

// SkippedKeys returns every skipped key of rec as entries, in number
// order (what a store writes when it splits a whole record).
func SkippedKeys(rec SessionRecord) []SkippedKey {
	var out []SkippedKey
	for _, s := range rec.sessions {
		for _, k := range s.skipped {
			out = append(out, encodeSkippedEntry(s.id, k))
		}
	}
	slices.SortFunc(out, func(a, b SkippedKey) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}

// SkippedKeyChanges returns what turns the stored skipped keys of base
// into those of next, where next is base after ratchet steps: the entries
// to put (keys added, or changed: a key loaded without a time is stamped)
// and the numbers to delete (keys consumed, evicted, expired, or of
// sessions dropped from the record). Sessions the steps did not touch are
// shared between the two records and cost nothing; a touched one costs a
// merge of its two lists, which are in number order.
func SkippedKeyChanges(base, next SessionRecord) (put []SkippedKey, del []uint64) {
	for _, ns := range next.sessions {
		if holds(base.sessions, ns) {
			continue
		}
		var old []skippedKey
		if bs := byID(base.sessions, ns.id); bs != nil {
			old = bs.skipped
		}
		put, del = diffSkipped(ns.id, old, ns.skipped, put, del)
	}
	for _, bs := range base.sessions {
		if !holds(next.sessions, bs) && byID(next.sessions, bs.id) == nil {
			for _, k := range bs.skipped {
				del = append(del, k.seq)
			}
		}
	}
	return put, del
}

// holds reports whether ss holds s itself (a session a step did not touch).
func holds(ss []*session, s *session) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// byID finds a session by id (ids are public: they travel in every
// header, so no constant-time compare is needed here).
func byID(ss []*session, id SessionID) *session {
	for _, x := range ss {
		if x.id == id {
			return x
		}
	}
	return nil
}

func diffSkipped(id SessionID, old, cur []skippedKey, put []SkippedKey, del []uint64) ([]SkippedKey, []uint64) {
	if len(old) == len(cur) && (len(old) == 0 || &old[0] == &cur[0]) {
		return put, del // the same list (an encryption copies the session, not its keys)
	}
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(old) && old[i].seq < cur[j].seq):
			del = append(del, old[i].seq)
			i++
		case i == len(old) || cur[j].seq < old[i].seq:
			put = append(put, encodeSkippedEntry(id, cur[j]))
			j++
		default:
			// A key's number fixes its chain, message number and key;
			// only a time stamped on a key loaded without one changes.
			if old[i].at != cur[j].at {
				put = append(put, encodeSkippedEntry(id, cur[j]))
			}
			i++
			j++
		}
	}
	return put, del
}

// UnmarshalStateWithKeys decodes a record stored without its keys
// (MarshalStateWithoutKeys) and joins the skipped keys stored beside it.
// Every key must be numbered below the record's next number, name a
// session of the record and be unique; errors match messages.ErrMalformed
// (ErrUnsupportedVersion for an entry of another version).
func UnmarshalStateWithKeys(state []byte, keys []SkippedKey) (SessionRecord, error) {
	const what = "ratchet session record"
	rec, err := UnmarshalState(state)
	if err != nil || len(keys) == 0 {
		return rec, err
	}
	seen := make(map[uint64]bool, len(keys))
	for _, s := range rec.sessions {
		for _, k := range s.skipped {
			seen[k.seq] = true
		}
	}
	touched := make([]bool, len(rec.sessions))
	for _, e := range keys {
		id, k, err := decodeSkippedEntry(e.Seq, e.Entry)
		if err != nil {
			return SessionRecord{}, err
		}
		if k.seq >= rec.nextSeq || seen[k.seq] {
			return SessionRecord{}, decodeError(what, fmt.Errorf("skipped key %d: duplicate or not below %d", k.seq, rec.nextSeq))
		}
		seen[k.seq] = true
		i := rec.find(id)
		if i < 0 {
			return SessionRecord{}, decodeError(what, fmt.Errorf("skipped key %d of a session the record does not hold", k.seq))
		}
		// The sessions were just decoded: nothing else holds them.
		rec.sessions[i].skipped = append(rec.sessions[i].skipped, k)
		touched[i] = true
	}
	for i, s := range rec.sessions {
		if touched[i] {
			slices.SortFunc(s.skipped, func(a, b skippedKey) int { return cmp.Compare(a.seq, b.seq) })
		}
	}
	return rec, nil
}
