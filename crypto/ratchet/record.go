package ratchet

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// Config bounds the per-record state. The zero value is invalid; start
// from DefaultConfig.
type Config struct {
	// MaxForwardJump is MAX_SKIP (DR §3.5): the most message keys one
	// envelope may make us skip in one chain. Beyond it: ErrTooManySkipped.
	MaxForwardJump int
	// MaxSkippedKeys caps the skipped message keys stored per session; the
	// oldest are evicted first, and a message whose key was evicted then
	// fails with ErrReplay.
	MaxSkippedKeys int
	// MaxOldChains caps the retired receiving chains remembered per session
	// for replay classification.
	MaxOldChains int
	// MaxArchivedSessions caps the previous/alternate sessions kept
	// decryptable besides the current one (libsignal keeps 40).
	MaxArchivedSessions int
	// MaxRetiredSessionIDs caps the ids of sessions evicted from the archive
	// that are remembered so their initiations are refused as replays.
	MaxRetiredSessionIDs int
}

// DefaultConfig returns the defaults of the issue: MaxForwardJump 25 000,
// MaxSkippedKeys 2 000 (libsignal's MAX_FORWARD_JUMPS and
// MAX_MESSAGE_KEYS), 32 old chains, 40 archived sessions, 256 retired ids.
func DefaultConfig() Config {
	return Config{
		MaxForwardJump:       25_000,
		MaxSkippedKeys:       2_000,
		MaxOldChains:         32,
		MaxArchivedSessions:  40,
		MaxRetiredSessionIDs: 256,
	}
}

// Validate reports whether every limit is usable.
func (c Config) Validate() error {
	if c.MaxForwardJump <= 0 || c.MaxSkippedKeys <= 0 || c.MaxOldChains <= 0 ||
		c.MaxArchivedSessions < 0 || c.MaxArchivedSessions > 1000 || c.MaxRetiredSessionIDs < 0 {
		return fmt.Errorf("%w: %+v", ErrInvalidConfig, c)
	}
	return nil
}

// SessionInfo describes one session of a record.
type SessionInfo struct {
	ID     SessionID
	Local  IdentityPublic
	Remote IdentityPublic // the peer's identity: pin this (CheckPin)
	// Initiator reports whether this device started the session.
	Initiator bool
	// Acknowledged reports whether the peer has answered on the session
	// (always true for a session we accepted).
	Acknowledged bool
}

// SessionRecord holds everything this device keeps about one remote
// device: the current session and a bounded list of archived ones (newest
// first), all still decryptable, plus the ids of sessions evicted from the
// archive. It is an immutable value; the zero value is an empty record.
type SessionRecord struct {
	sessions []*session // [0] is current
	retired  []SessionID
}

// IsEmpty reports whether the record holds no session.
func (r SessionRecord) IsEmpty() bool { return len(r.sessions) == 0 }

// Current describes the session Encrypt uses.
func (r SessionRecord) Current() (SessionInfo, bool) {
	if len(r.sessions) == 0 {
		return SessionInfo{}, false
	}
	return r.sessions[0].info(), true
}

// Sessions describes every session, current first.
func (r SessionRecord) Sessions() []SessionInfo {
	out := make([]SessionInfo, len(r.sessions))
	for i, s := range r.sessions {
		out[i] = s.info()
	}
	return out
}

// RemoteIdentity returns the identity of the current session's peer: the
// identity this record is pinned to.
func (r SessionRecord) RemoteIdentity() (IdentityPublic, bool) {
	if len(r.sessions) == 0 {
		return IdentityPublic{}, false
	}
	return r.sessions[0].remote, true
}

func (r SessionRecord) find(id SessionID) int {
	for i, s := range r.sessions {
		if subtle.ConstantTimeCompare(s.id[:], id[:]) == 1 {
			return i
		}
	}
	return -1
}

func (r SessionRecord) isRetired(id SessionID) bool {
	for _, x := range r.retired {
		if x == id {
			return true
		}
	}
	return false
}

// withReplaced returns r with session i replaced by s.
func (r SessionRecord) withReplaced(i int, s *session) SessionRecord {
	ss := make([]*session, len(r.sessions))
	copy(ss, r.sessions)
	ss[i] = s
	r.sessions = ss
	return r
}

// withInserted returns r with s at position pos (0 = current), trimming the
// archive to cfg.MaxArchivedSessions and remembering evicted ids.
func (r SessionRecord) withInserted(cfg Config, pos int, s *session) SessionRecord {
	ss := make([]*session, 0, len(r.sessions)+1)
	ss = append(ss, r.sessions[:pos]...)
	ss = append(ss, s)
	ss = append(ss, r.sessions[pos:]...)
	if limit := 1 + cfg.MaxArchivedSessions; len(ss) > limit {
		retired := make([]SessionID, 0, len(r.retired)+len(ss)-limit)
		retired = append(retired, r.retired...)
		for _, old := range ss[limit:] {
			retired = append(retired, old.id)
		}
		if drop := len(retired) - cfg.MaxRetiredSessionIDs; drop > 0 {
			retired = retired[drop:]
		}
		r.retired = retired
		ss = ss[:limit]
	}
	r.sessions = ss
	return r
}

// Initiate starts a new session with the device that published bundle
// (PQXDH §3.3) and makes it current; a previous current session is
// archived. Every envelope Encrypt produces on it carries the initiation
// until the peer answers. It fails with ErrBadPrekeySignature on a bad
// bundle and with *IdentityChangedError when the record already belongs to
// another identity (start from an empty record to accept a new one).
func (c Config) Initiate(rec SessionRecord, local Identity, bundle *messages.PrekeyBundle) (SessionRecord, SessionInfo, error) {
	if err := c.Validate(); err != nil {
		return rec, SessionInfo{}, err
	}
	if pinned, ok := rec.RemoteIdentity(); ok {
		if err := CheckPin(pinned, bundle.Identity); err != nil {
			return rec, SessionInfo{}, err
		}
	}
	sk, in, err := initiatorAgreement(local, bundle)
	if err != nil {
		return rec, SessionInfo{}, err
	}
	defer wipe(sk[:])
	inEnc, err := messages.EncodePrekeyInitiation(in)
	if err != nil {
		return rec, SessionInfo{}, err
	}
	s := &session{
		id: sessionIDOfEncoded(inEnc), initiator: true, pending: in, pendingEnc: inEnc,
		local: local.pub, remote: bundle.Identity,
		dhr: bundle.SignedPrekey.Public, hasDHr: true,
	}
	// Alice's first DH ratchet step against Bob's signed prekey (DR §3.3
	// RatchetInitAlice).
	if s.dhsKey, s.dhsPriv, s.dhsPub, err = newX25519(); err != nil {
		return rec, SessionInfo{}, err
	}
	dhOut, err := x25519(s.dhsKey, s.dhr)
	if err != nil {
		return rec, SessionInfo{}, err
	}
	s.rk, s.cks, err = kdfRK(sk, dhOut)
	wipe(dhOut)
	if err != nil {
		return rec, SessionInfo{}, err
	}
	s.hasCKs = true
	return rec.withInserted(c, 0, s), s.info(), nil
}

// Encrypt encrypts plaintext (normally an encoded SecurePayload) on the
// current session and returns the new record and the encoded envelope.
func (c Config) Encrypt(rec SessionRecord, plaintext []byte) (SessionRecord, []byte, error) {
	if len(rec.sessions) == 0 {
		return rec, nil, fmt.Errorf("%w: no current session", ErrUnknownSession)
	}
	ns, env, err := rec.sessions[0].encrypt(plaintext)
	if err != nil {
		return rec, nil, err
	}
	return rec.withReplaced(0, ns), env, nil
}

// DecryptResult is what Decrypt returns. Nothing is changed until the caller
// persists Record (and Prekeys when PrekeysChanged) — in the same storage
// transaction as the pending message.
type DecryptResult struct {
	Record SessionRecord
	// Prekeys is the responder's prekey store after the envelope; it
	// differs from the input (PrekeysChanged) when a one-time prekey was
	// consumed.
	Prekeys        PrekeyStore
	PrekeysChanged bool
	Plaintext      []byte
	// Session describes the session that decrypted the envelope; its
	// Remote identity is the one to pin.
	Session SessionInfo
	// Established reports that this envelope created the session (an
	// accepted initiation).
	Established bool
	// Current reports whether that session is now the record's current one.
	Current bool
}

// Decrypt authenticates and decrypts one envelope from the device the
// record belongs to (DR §3.5, PQXDH §3.4 for prekey envelopes). On error
// nothing changed: rec and prekeys are never modified, and the result is
// the zero value.
//
// An envelope names its session. A prekey envelope for a session the record
// does not hold establishes it from prekeys (consuming its one-time
// prekey); it must come from the record's identity (else
// *IdentityChangedError) and becomes current unless we hold our own
// unanswered initiation with a smaller session id (simultaneous
// initiation), in which case it is archived. A session we initiated is
// acknowledged by the first envelope the peer sends on it.
func (c Config) Decrypt(rec SessionRecord, local Identity, prekeys PrekeyStore, envelope []byte, now time.Time) (DecryptResult, error) {
	if err := c.Validate(); err != nil {
		return DecryptResult{}, err
	}
	env, err := messages.DecodeEnvelope(envelope)
	if err != nil {
		return DecryptResult{}, err
	}
	hdrEnc, err := messages.EncodeRatchetHeader(&env.Header)
	if err != nil {
		return DecryptResult{}, err
	}
	var initEnc []byte
	if env.Initiation != nil {
		if initEnc, err = messages.EncodePrekeyInitiation(env.Initiation); err != nil {
			return DecryptResult{}, fmt.Errorf("%w: %v", ErrTampered, err)
		}
		want := sessionIDOfEncoded(initEnc)
		if subtle.ConstantTimeCompare(want[:], env.Header.Session[:]) != 1 {
			return DecryptResult{}, fmt.Errorf("%w: session id does not match the initiation", ErrTampered)
		}
	}

	if i := rec.find(env.Header.Session); i >= 0 {
		s := rec.sessions[i]
		ns, pt, err := s.decrypt(c, env, hdrEnc, initEnc)
		if err != nil {
			return DecryptResult{}, err
		}
		if ns.pending != nil && env.Initiation == nil {
			// The peer answered: stop attaching the initiation.
			ns.pending, ns.pendingEnc = nil, nil
		}
		return DecryptResult{
			Record: rec.withReplaced(i, ns), Prekeys: prekeys, Plaintext: pt,
			Session: ns.info(), Current: i == 0,
		}, nil
	}

	if env.Initiation == nil {
		return DecryptResult{}, fmt.Errorf("%w: %s", ErrUnknownSession, env.Header.Session)
	}
	if rec.isRetired(env.Header.Session) {
		return DecryptResult{}, fmt.Errorf("%w: initiation of retired session %s", ErrReplay, env.Header.Session)
	}
	in := env.Initiation
	if pinned, ok := rec.RemoteIdentity(); ok {
		if err := CheckPin(pinned, in.Identity); err != nil {
			return DecryptResult{}, err
		}
	}
	sk, spk, newPrekeys, err := responderAgreement(local, prekeys, in, now)
	if err != nil {
		return DecryptResult{}, err
	}
	// RatchetInitBob (DR §3.3): our ratchet key pair is the signed prekey.
	s := &session{
		id: env.Header.Session, local: local.pub, remote: in.Identity,
		rk: sk, dhsKey: spk.key, dhsPriv: spk.priv, dhsPub: spk.pub,
	}
	wipe(sk[:])
	ns, pt, err := s.decrypt(c, env, hdrEnc, initEnc)
	if err != nil {
		return DecryptResult{}, err
	}
	pos := 0
	if len(rec.sessions) > 0 {
		cur := rec.sessions[0]
		// Simultaneous initiation: both sides keep the smaller session id.
		if cur.initiator && cur.pending != nil && bytes.Compare(cur.id[:], ns.id[:]) < 0 {
			pos = 1
		}
	}
	return DecryptResult{
		Record: rec.withInserted(c, pos, ns), Prekeys: newPrekeys,
		PrekeysChanged: in.OneTimePrekeyID != nil, Plaintext: pt,
		Session: ns.info(), Established: true, Current: pos == 0,
	}, nil
}

// Initiate is DefaultConfig().Initiate.
func Initiate(rec SessionRecord, local Identity, bundle *messages.PrekeyBundle) (SessionRecord, SessionInfo, error) {
	return DefaultConfig().Initiate(rec, local, bundle)
}

// Encrypt is DefaultConfig().Encrypt.
func Encrypt(rec SessionRecord, plaintext []byte) (SessionRecord, []byte, error) {
	return DefaultConfig().Encrypt(rec, plaintext)
}

// Decrypt is DefaultConfig().Decrypt.
func Decrypt(rec SessionRecord, local Identity, prekeys PrekeyStore, envelope []byte, now time.Time) (DecryptResult, error) {
	return DefaultConfig().Decrypt(rec, local, prekeys, envelope, now)
}
