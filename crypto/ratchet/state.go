package ratchet

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// StateVersion is the version of the SessionRecord encoding. Version 3
// numbers every skipped key with a sequence unique in its record (the
// key under which it is stored on its own: MarshalStateWithoutKeys,
// SkippedKeyChanges) and stores the next number. Version 2 stores the
// time each skipped key was skipped; versions 1 and 2 are still read
// (their keys are numbered in order on load; version-1 keys are stamped
// at the next step), and a session whose unanswered initiation is of
// version 1 is dropped on load (no current peer accepts it:
// docs/delivery.md, "Initiation version 2").
const StateVersion = 3

// MaxStateSize is the largest encoded SessionRecord UnmarshalState accepts.
const MaxStateSize = 64 << 20

type wireSession struct {
	_          struct{} `cbor:",toarray"`
	ID         []byte
	Initiator  bool
	Pending    []byte // encoded initiation, or null once acknowledged
	Local      []byte // 64: sign || dh
	Remote     []byte // 64
	RK         []byte
	DHsPriv    []byte
	DHsPub     []byte
	NeedSend   bool
	DHr        []byte // null when absent
	CKs        []byte // null when absent
	CKr        []byte // null when absent
	Ns, Nr, PN uint32
	// Skipped packs seq (u64 BE) || dh (32) || n (u32 BE) || at (i64 BE,
	// unix ns) || mk (32) per key, oldest first (version 2: without seq;
	// version 1: without seq and at).
	Skipped []byte
	// OldChains packs dh (32) || end (u32 BE) per chain, oldest first.
	OldChains []byte
}

// wireRecordV2 is the record of versions 1 and 2.
type wireRecordV2 struct {
	_        struct{} `cbor:",toarray"`
	V        uint64
	Sessions []wireSession
	// Retired packs 32-byte session ids, oldest first.
	Retired []byte
}

type wireRecord struct {
	_        struct{} `cbor:",toarray"`
	V        uint64
	Sessions []wireSession
	// Retired packs 32-byte session ids, oldest first.
	Retired []byte
	// NextSkipped is the sequence number the next skipped key gets.
	NextSkipped uint64
}

const (
	skippedEntry   = 8 + 32 + 4 + 8 + 32
	skippedEntryV2 = 32 + 4 + 8 + 32
	skippedEntryV1 = 32 + 4 + 32
	oldChainEntry  = 32 + 4
)

func opt(has bool, b [32]byte) []byte {
	if !has {
		return nil
	}
	return append([]byte(nil), b[:]...)
}

// MarshalState returns the deterministic encoding of rec (Core
// Deterministic CBOR, versioned), its skipped keys included. It holds
// secrets: seal it at rest. A store that keeps skipped keys on their own
// writes MarshalStateWithoutKeys instead.
func MarshalState(rec SessionRecord) ([]byte, error) { return marshalState(rec, true) }

// MarshalStateWithoutKeys is MarshalState without the skipped message
// keys: the small state record a ratchet step rewrites. The keys are
// stored as entries of their own (SkippedKeys, SkippedKeyChanges) and
// joined again by UnmarshalStateWithKeys, so a step writes only the keys
// it added or consumed.
func MarshalStateWithoutKeys(rec SessionRecord) ([]byte, error) { return marshalState(rec, false) }

func marshalState(rec SessionRecord, keys bool) ([]byte, error) {
	w := wireRecord{V: StateVersion, Sessions: make([]wireSession, len(rec.sessions)), NextSkipped: rec.nextSeq}
	var scratch [][]byte
	defer func() { wipeAll(scratch) }()
	for i, s := range rec.sessions {
		ws := wireSession{
			ID: s.id[:], Initiator: s.initiator, Pending: s.pendingEnc,
			Local: s.local.Bytes(), Remote: s.remote.Bytes(),
			RK: append([]byte(nil), s.rk[:]...), DHsPriv: append([]byte(nil), s.dhsPriv[:]...), DHsPub: s.dhsPub[:],
			NeedSend: s.needSendRatchet,
			DHr:      opt(s.hasDHr, s.dhr), CKs: opt(s.hasCKs, s.cks), CKr: opt(s.hasCKr, s.ckr),
			Ns: s.ns, Nr: s.nr, PN: s.pn,
		}
		if keys && len(s.skipped) > 0 {
			ws.Skipped = make([]byte, 0, len(s.skipped)*skippedEntry)
			for _, k := range s.skipped {
				ws.Skipped = binary.BigEndian.AppendUint64(ws.Skipped, k.seq)
				ws.Skipped = append(ws.Skipped, k.dh[:]...)
				ws.Skipped = binary.BigEndian.AppendUint32(ws.Skipped, k.n)
				ws.Skipped = binary.BigEndian.AppendUint64(ws.Skipped, uint64(k.at))
				ws.Skipped = append(ws.Skipped, k.mk[:]...)
			}
		}
		if len(s.oldChains) > 0 {
			ws.OldChains = make([]byte, 0, len(s.oldChains)*oldChainEntry)
			for _, c := range s.oldChains {
				ws.OldChains = append(ws.OldChains, c.dh[:]...)
				ws.OldChains = binary.BigEndian.AppendUint32(ws.OldChains, c.end)
			}
		}
		scratch = append(scratch, ws.RK, ws.DHsPriv, ws.CKs, ws.CKr, ws.Skipped)
		w.Sessions[i] = ws
	}
	if len(rec.retired) > 0 {
		w.Retired = make([]byte, 0, 32*len(rec.retired))
		for _, id := range rec.retired {
			w.Retired = append(w.Retired, id[:]...)
		}
	}
	return messages.Marshal(&w)
}

func get32(dst *[32]byte, b []byte) bool {
	if len(b) != 32 {
		return false
	}
	copy(dst[:], b)
	return true
}

func getOpt32(dst *[32]byte, has *bool, b []byte) bool {
	if b == nil {
		*has = false
		return true
	}
	*has = true
	return get32(dst, b)
}

func getIdentity(dst *IdentityPublic, b []byte) bool {
	if len(b) != 64 {
		return false
	}
	copy(dst.Sign[:], b[:32])
	copy(dst.DH[:], b[32:])
	return true
}

// UnmarshalState decodes what MarshalState wrote. Errors match
// messages.ErrMalformed (ErrUnsupportedVersion for another version).
func UnmarshalState(b []byte) (SessionRecord, error) {
	const what = "ratchet session record"
	var w wireRecord
	err := messages.Unmarshal(what, b, &w, MaxStateSize)
	if err == nil && w.V != StateVersion {
		return SessionRecord{}, &messages.DecodeError{What: what, Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", w.V)}
	}
	if err != nil {
		// Versions 1 and 2: three fields.
		var w2 wireRecordV2
		if messages.Unmarshal(what, b, &w2, MaxStateSize) != nil {
			return SessionRecord{}, err
		}
		if w2.V != 2 && w2.V != 1 {
			return SessionRecord{}, &messages.DecodeError{What: what, Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", w2.V)}
		}
		w = wireRecord{V: w2.V, Sessions: w2.Sessions, Retired: w2.Retired}
	}
	entry := skippedEntry
	switch w.V {
	case 1:
		entry = skippedEntryV1
	case 2:
		entry = skippedEntryV2
	}
	if len(w.Retired)%32 != 0 {
		return SessionRecord{}, decodeError(what, fmt.Errorf("retired ids not a multiple of 32 bytes"))
	}
	rec := SessionRecord{nextSeq: w.NextSkipped}
	seqs := map[uint64]bool{}
	for p := w.Retired; len(p) > 0; p = p[32:] {
		rec.retired = append(rec.retired, SessionID(p[:32]))
	}
	seen := make(map[SessionID]bool, len(w.Sessions))
	for i := range w.Sessions {
		ws := &w.Sessions[i]
		s := &session{initiator: ws.Initiator, needSendRatchet: ws.NeedSend, ns: ws.Ns, nr: ws.Nr, pn: ws.PN}
		var id [32]byte
		ok := get32(&id, ws.ID) && getIdentity(&s.local, ws.Local) && getIdentity(&s.remote, ws.Remote) &&
			get32(&s.rk, ws.RK) && get32(&s.dhsPriv, ws.DHsPriv) && get32(&s.dhsPub, ws.DHsPub) &&
			getOpt32(&s.dhr, &s.hasDHr, ws.DHr) && getOpt32(&s.cks, &s.hasCKs, ws.CKs) && getOpt32(&s.ckr, &s.hasCKr, ws.CKr) &&
			len(ws.Skipped)%entry == 0 && len(ws.OldChains)%oldChainEntry == 0
		if !ok {
			return SessionRecord{}, decodeError(what, fmt.Errorf("session %d: wrong field sizes", i))
		}
		s.id = SessionID(id)
		if seen[s.id] {
			return SessionRecord{}, decodeError(what, fmt.Errorf("duplicate session %s", s.id))
		}
		seen[s.id] = true
		if ws.Pending != nil {
			in, err := messages.DecodePrekeyInitiation(ws.Pending)
			if w.V == 1 && errors.Is(err, messages.ErrUnsupportedVersion) {
				// Our own unanswered version-1 initiation: no peer of
				// this version accepts it, so the session can never be
				// answered. Forget it; the next send initiates afresh.
				wipe(ws.RK)
				wipe(ws.DHsPriv)
				wipe(ws.CKs)
				wipe(ws.CKr)
				wipe(ws.Skipped)
				continue
			}
			if err != nil {
				return SessionRecord{}, decodeError(what, fmt.Errorf("session %d: bad pending initiation: %w", i, err))
			}
			s.pending, s.pendingEnc = in, ws.Pending
			if sessionIDOfEncoded(ws.Pending) != s.id {
				return SessionRecord{}, decodeError(what, fmt.Errorf("session %d: pending initiation does not match its id", i))
			}
		}
		for p := ws.Skipped; len(p) > 0; p = p[entry:] {
			var k skippedKey
			q := p
			if w.V == StateVersion {
				k.seq = binary.BigEndian.Uint64(q[:8])
				q = q[8:]
				if k.seq == 0 || k.seq >= rec.nextSeq || seqs[k.seq] ||
					(len(s.skipped) > 0 && s.skipped[len(s.skipped)-1].seq >= k.seq) {
					return SessionRecord{}, decodeError(what, fmt.Errorf("session %d: skipped key number %d out of order or not below %d", i, k.seq, rec.nextSeq))
				}
			} else {
				// Versions 1 and 2 kept no numbers: number in order.
				rec.nextSeq = max(rec.nextSeq, 1)
				k.seq = rec.nextSeq
				rec.nextSeq++
			}
			seqs[k.seq] = true
			copy(k.dh[:], q[:32])
			k.n = binary.BigEndian.Uint32(q[32:36])
			if w.V == 1 {
				copy(k.mk[:], q[36:68])
			} else {
				k.at = int64(binary.BigEndian.Uint64(q[36:44]))
				copy(k.mk[:], q[44:76])
			}
			s.skipped = append(s.skipped, k)
		}
		for p := ws.OldChains; len(p) > 0; p = p[oldChainEntry:] {
			var c oldChain
			copy(c.dh[:], p[:32])
			c.end = binary.BigEndian.Uint32(p[32:36])
			s.oldChains = append(s.oldChains, c)
		}
		rec.sessions = append(rec.sessions, s)
		wipe(ws.RK)
		wipe(ws.DHsPriv)
		wipe(ws.CKs)
		wipe(ws.CKr)
		wipe(ws.Skipped)
	}
	return rec, nil
}
