package ratchet

import (
	"bytes"
	"crypto/ed25519"
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
	// MaxUnacknowledgedJump caps N, and PN + N, of an envelope before its
	// sender proved it holds the session: a prekey envelope, or any
	// envelope on a session we initiated that the peer has not answered.
	// Its chain steps are work done before authentication, so the cap is
	// small (measured: N = 25 000 cost 24–33 ms per forged envelope).
	// MaxForwardJump applies when it is smaller.
	MaxUnacknowledgedJump int
	// MaxSkippedKeysPerRecord caps the skipped message keys of all
	// sessions of one record together; past it the keys of the oldest
	// sessions go first, oldest first.
	MaxSkippedKeysPerRecord int
	// MaxSkippedKeyAge drops a skipped message key this long after it was
	// skipped (a message that late fails with ErrReplay).
	MaxSkippedKeyAge time.Duration
	// LegacyEnvelopes makes Encrypt write version-1 envelopes (no salt) on
	// a session until the peer has sent a version-2 one on it. Only for a
	// rolling upgrade while some peers still run a build that cannot read
	// version 2: a version-1 sender whose state is rolled back or cloned
	// reuses AES-GCM (key, nonce) pairs (docs/protocol.md, "Envelope
	// version 2"). Decrypt reads both versions whatever it says.
	LegacyEnvelopes bool
	// Work, when set, counts the expensive operations Decrypt performs
	// (its caller's, one per call: see Work). Not a limit.
	Work *Work
}

// DefaultConfig returns the defaults: MaxForwardJump 25 000,
// MaxSkippedKeys 2 000 (libsignal's MAX_FORWARD_JUMPS and
// MAX_MESSAGE_KEYS), 32 old chains, 40 archived sessions, 256 retired ids,
// 512 steps before the peer answered, 2 000 skipped keys per record, kept
// at most 30 days.
func DefaultConfig() Config {
	return Config{
		MaxForwardJump:          25_000,
		MaxSkippedKeys:          2_000,
		MaxOldChains:            32,
		MaxArchivedSessions:     40,
		MaxRetiredSessionIDs:    256,
		MaxUnacknowledgedJump:   512,
		MaxSkippedKeysPerRecord: 2_000,
		MaxSkippedKeyAge:        30 * 24 * time.Hour,
	}
}

// Validate reports whether every limit is usable.
func (c Config) Validate() error {
	if c.MaxForwardJump <= 0 || c.MaxSkippedKeys <= 0 || c.MaxOldChains <= 0 ||
		c.MaxArchivedSessions < 0 || c.MaxArchivedSessions > 1000 || c.MaxRetiredSessionIDs < 0 ||
		c.MaxUnacknowledgedJump <= 0 ||
		c.MaxSkippedKeysPerRecord <= 0 || c.MaxSkippedKeyAge <= 0 {
		return fmt.Errorf("%w: %+v", ErrInvalidConfig, c)
	}
	return nil
}

func (c Config) unacknowledgedJump() int { return min(c.MaxUnacknowledgedJump, c.MaxForwardJump) }

// Route names the two devices of a session step: From is the sender and
// To the receiver. On Decrypt, From must be the sender the transport
// authenticated (never an address the envelope names itself) and To this
// device; on Initiate, From is this device and To the peer. Both go into
// the initiation, so into its signature, its session id and the associated
// data of every envelope of the session: replayed from or to another
// address, an envelope fails to decrypt.
type Route struct {
	From, To messages.DeviceAddress
}

// checkInitiation requires an initiation's addresses to be the route's.
// A zero To on the receiving side is not checked (a caller that does not
// know its own address); From always is.
func (r Route) checkInitiation(in *messages.PrekeyInitiation) error {
	if in.From != r.From {
		return fmt.Errorf("%w: initiation from %s received from %s", ErrWrongAddress, in.From, r.From)
	}
	if r.To != (messages.DeviceAddress{}) && in.To != r.To {
		return fmt.Errorf("%w: initiation for %s received at %s", ErrWrongAddress, in.To, r.To)
	}
	return nil
}

// verifyInitiation checks the initiator's signature over the initiation
// (the Ed25519 half of the identity is proven, so nobody
// can present a victim's signing key beside their own DH key).
func verifyInitiation(in *messages.PrekeyInitiation) error {
	msg, err := initiationSigningMessage(in)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTampered, err)
	}
	if !ed25519.Verify(ed25519.PublicKey(in.Identity.Sign[:]), msg, in.Signature[:]) {
		return fmt.Errorf("%w: initiation signature does not verify under its identity key", ErrTampered)
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
	nextSeq  uint64 // number of the next skipped key (0 and 1: the first)
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

// bounded returns r with skipped keys older than MaxSkippedKeyAge dropped
// and the record's total cut to MaxSkippedKeysPerRecord, evicting from the
// oldest sessions first (oldest keys first within one). Keys loaded
// without a time are stamped now. Sessions it does not change are shared.
func (r SessionRecord) bounded(c Config, now int64) SessionRecord {
	cutoff := now - int64(c.MaxSkippedKeyAge)
	total, dirty := 0, false
	for _, s := range r.sessions {
		total += len(s.skipped)
		for _, k := range s.skipped {
			if k.at == 0 || k.at < cutoff {
				dirty = true
				break
			}
		}
	}
	if !dirty && total <= c.MaxSkippedKeysPerRecord {
		return r
	}
	ss := make([]*session, len(r.sessions))
	copy(ss, r.sessions)
	kept := make([][]skippedKey, len(ss))
	changed := make([]bool, len(ss))
	total = 0
	for i, s := range ss {
		keep := s.skipped
		for j, k := range s.skipped {
			if k.at != 0 && k.at >= cutoff {
				continue
			}
			// First key to drop or stamp: rebuild this session's list.
			keep = append(make([]skippedKey, 0, len(s.skipped)), s.skipped[:j]...)
			for _, k := range s.skipped[j:] {
				if k.at == 0 {
					k.at = now
				} else if k.at < cutoff {
					continue
				}
				keep = append(keep, k)
			}
			changed[i] = true
			break
		}
		kept[i] = keep
		total += len(keep)
	}
	for i := len(ss) - 1; i >= 0 && total > c.MaxSkippedKeysPerRecord; i-- {
		if drop := min(len(kept[i]), total-c.MaxSkippedKeysPerRecord); drop > 0 {
			kept[i], changed[i] = kept[i][drop:], true
			total -= drop
		}
	}
	for i, s := range ss {
		if changed[i] {
			ns := *s
			ns.skipped = append([]skippedKey(nil), kept[i]...)
			ss[i] = &ns
		}
	}
	r.sessions = ss
	return r
}

// Initiate starts a new session with the device that published bundle
// (PQXDH §3.3) and makes it current; a previous current session is
// archived. route.From is this device's address and route.To the peer's;
// both are signed into the initiation with the identity's signing key.
// Every envelope Encrypt produces on it carries the initiation until the
// peer answers. It fails with ErrBadPrekeySignature on a bad bundle and
// with *IdentityChangedError when the record already belongs to another
// identity (start from an empty record to accept a new one).
func (c Config) Initiate(rec SessionRecord, local Identity, bundle *messages.PrekeyBundle, route Route) (SessionRecord, SessionInfo, error) {
	if err := c.Validate(); err != nil {
		return rec, SessionInfo{}, err
	}
	if err := route.From.Validate(); err != nil {
		return rec, SessionInfo{}, fmt.Errorf("%w: local address: %v", ErrInvalidConfig, err)
	}
	if err := route.To.Validate(); err != nil {
		return rec, SessionInfo{}, fmt.Errorf("%w: peer address: %v", ErrInvalidConfig, err)
	}
	if pinned, ok := rec.RemoteIdentity(); ok {
		if err := CheckPin(pinned, bundle.Identity); err != nil {
			return rec, SessionInfo{}, err
		}
	}
	sk, in, err := initiatorAgreement(local, bundle, route)
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
	ns, env, err := rec.sessions[0].encrypt(plaintext, c.LegacyEnvelopes)
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
	// Accepted is the initiation this envelope was accepted under, when it
	// established the session: apply it to the stored prekey store in the
	// transaction that persists Record (PrekeyStore.Accept), so two
	// concurrent copies of one initiation cannot both be accepted.
	Accepted *AcceptedInitiation
}

// Decrypt authenticates and decrypts one envelope from the device the
// record belongs to (DR §3.5, PQXDH §3.4 for prekey envelopes). route.From
// is the sender the transport authenticated and route.To this device. On
// error nothing changed: rec and prekeys are never modified, and the
// result is the zero value.
//
// An envelope names its session. A prekey envelope for a session the record
// does not hold establishes it from prekeys (consuming its one-time
// prekey, or recording a last-resort initiation as accepted); it must name
// route's addresses (else ErrWrongAddress), carry a valid signature of its
// identity (else ErrTampered), not have been accepted before (else
// ErrReplay, also after the session was reset), come from the record's
// identity (else *IdentityChangedError) and becomes current unless we hold
// our own unanswered initiation with a smaller session id (simultaneous
// initiation), in which case it is archived. These checks and the caps on
// N run before any Diffie-Hellman or KEM operation. A session we
// initiated is acknowledged by the first envelope the peer sends on it.
func (c Config) Decrypt(rec SessionRecord, local Identity, prekeys PrekeyStore, envelope []byte, route Route, now time.Time) (DecryptResult, error) {
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
	t := now.UnixNano()
	var initEnc []byte
	if env.Initiation != nil {
		if initEnc, err = messages.EncodePrekeyInitiation(env.Initiation); err != nil {
			return DecryptResult{}, fmt.Errorf("%w: %v", ErrTampered, err)
		}
		want := sessionIDOfEncoded(initEnc)
		if subtle.ConstantTimeCompare(want[:], env.Header.Session[:]) != 1 {
			return DecryptResult{}, fmt.Errorf("%w: session id does not match the initiation", ErrTampered)
		}
		if err := route.checkInitiation(env.Initiation); err != nil {
			return DecryptResult{}, err
		}
	}

	if i := rec.find(env.Header.Session); i >= 0 {
		s := rec.sessions[i]
		ns, pt, err := s.decrypt(c, env, hdrEnc, initEnc, t)
		if err != nil {
			return DecryptResult{}, err
		}
		if ns.pending != nil && env.Initiation == nil {
			// The peer answered: stop attaching the initiation.
			ns.pending, ns.pendingEnc = nil, nil
		}
		ns.peerSalted = ns.peerSalted || env.Header.Salt != nil
		return DecryptResult{
			Record: rec.withReplaced(i, ns).numbered(i).bounded(c, t), Prekeys: prekeys, Plaintext: pt,
			Session: ns.info(), Current: i == 0,
		}, nil
	}

	if env.Initiation == nil {
		return DecryptResult{}, fmt.Errorf("%w: %s", ErrUnknownSession, env.Header.Session)
	}
	in := env.Initiation
	if rec.isRetired(env.Header.Session) || prekeys.wasAccepted(env.Header.Session) {
		return DecryptResult{}, fmt.Errorf("%w: initiation of session %s was accepted before", ErrReplay, env.Header.Session)
	}
	if pinned, ok := rec.RemoteIdentity(); ok {
		if err := CheckPin(pinned, in.Identity); err != nil {
			return DecryptResult{}, err
		}
	}
	// Cheap refusals first: a fresh session's first
	// chain is all pre-authentication work.
	if h, jump := env.Header, uint64(c.unacknowledgedJump()); uint64(h.N) > jump || uint64(h.PN)+uint64(h.N) > jump {
		return DecryptResult{}, fmt.Errorf("%w: PN %d, N %d in a prekey envelope", ErrTooManySkipped, h.PN, h.N)
	}
	acc := AcceptedInitiation{session: env.Header.Session, signed: in.SignedPrekeyID, kem: in.KEMPrekeyID, oneTime: in.OneTimePrekeyID}
	newPrekeys, err := prekeys.Accept(acc)
	if err != nil {
		return DecryptResult{}, err
	}
	c.Work.verify()
	if err := verifyInitiation(in); err != nil {
		return DecryptResult{}, err
	}
	sk, spk, err := responderAgreement(local, prekeys, in, now, c.Work)
	if err != nil {
		return DecryptResult{}, err
	}
	// RatchetInitBob (DR §3.3): our ratchet key pair is the signed prekey.
	s := &session{
		id: env.Header.Session, local: local.pub, remote: in.Identity,
		rk: sk, dhsKey: spk.key, dhsPriv: spk.priv, dhsPub: spk.pub,
	}
	wipe(sk[:])
	ns, pt, err := s.decrypt(c, env, hdrEnc, initEnc, t)
	if err != nil {
		return DecryptResult{}, err
	}
	ns.peerSalted = env.Header.Salt != nil
	pos := 0
	if len(rec.sessions) > 0 {
		cur := rec.sessions[0]
		// Simultaneous initiation: both sides keep the smaller session id.
		if cur.initiator && cur.pending != nil && bytes.Compare(cur.id[:], ns.id[:]) < 0 {
			pos = 1
		}
	}
	return DecryptResult{
		Record: rec.withInserted(c, pos, ns).numbered(pos).bounded(c, t), Prekeys: newPrekeys,
		PrekeysChanged: true, Plaintext: pt,
		Session: ns.info(), Established: true, Current: pos == 0, Accepted: &acc,
	}, nil
}

// Initiate is DefaultConfig().Initiate.
func Initiate(rec SessionRecord, local Identity, bundle *messages.PrekeyBundle, route Route) (SessionRecord, SessionInfo, error) {
	return DefaultConfig().Initiate(rec, local, bundle, route)
}

// Encrypt is DefaultConfig().Encrypt.
func Encrypt(rec SessionRecord, plaintext []byte) (SessionRecord, []byte, error) {
	return DefaultConfig().Encrypt(rec, plaintext)
}

// Decrypt is DefaultConfig().Decrypt.
func Decrypt(rec SessionRecord, local Identity, prekeys PrekeyStore, envelope []byte, route Route, now time.Time) (DecryptResult, error) {
	return DefaultConfig().Decrypt(rec, local, prekeys, envelope, route, now)
}
