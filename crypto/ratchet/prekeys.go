package ratchet

import (
	"crypto/ecdh"
	"crypto/mlkem"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// PrekeyConfig sets the responder's prekey schedule (PQXDH §4.x "Signed
// prekey rotation", libsignal's defaults where they exist).
type PrekeyConfig struct {
	// RotationInterval is how long a signed prekey (and the signed KEM
	// prekey, rotated with it) stays current.
	RotationInterval time.Duration
	// GracePeriod is how long a replaced signed prekey still completes
	// initiations that name it.
	GracePeriod time.Duration
	// OneTimeBatch is how many one-time prekeys one replenishment generates.
	OneTimeBatch int
	// OneTimeThreshold triggers replenishment when fewer unissued one-time
	// prekeys remain.
	OneTimeThreshold int
	// MaxOneTime caps the one-time prekeys held; when a replenishment would
	// exceed it, the oldest issued (handed out, never used) ones are
	// dropped — only those issued at least MinIssuedAge ago.
	MaxOneTime int
	// MinIssuedAge is how long an issued one-time prekey is kept at least
	// before it may be evicted (a flood of bundle requests
	// must not push out the key of an initiation still in flight). When
	// every held key is unissued or too young, a replenishment adds only
	// what fits under MaxOneTime, and once none is left unissued bundles
	// carry no one-time prekey (initiators use the last-resort keys).
	// 0: DefaultMinIssuedAge.
	MinIssuedAge time.Duration
	// MaxAcceptedInitiations caps the ids of accepted last-resort
	// initiations remembered so a replay is refused (they are kept until
	// the prekeys they name expire). When the set is full, last-resort
	// initiations are refused (ErrInitiationLimit) and the next Refresh
	// rotates the signed prekey and closes every replaced one to
	// last-resort initiations, which empties the set; initiations with a
	// one-time prekey are never affected. 0: DefaultMaxAcceptedInitiations.
	MaxAcceptedInitiations int
}

// DefaultMaxAcceptedInitiations is PrekeyConfig.MaxAcceptedInitiations'
// default: 2 000 ids (80 KB in the prekey store).
const DefaultMaxAcceptedInitiations = 2000

const maxAcceptedLimit = 100_000

// DefaultMinIssuedAge is PrekeyConfig.MinIssuedAge's default.
const DefaultMinIssuedAge = 24 * time.Hour

func (c PrekeyConfig) minIssuedAge() time.Duration {
	if c.MinIssuedAge == 0 {
		return DefaultMinIssuedAge
	}
	return c.MinIssuedAge
}

func (c PrekeyConfig) maxAccepted() int {
	if c.MaxAcceptedInitiations == 0 {
		return DefaultMaxAcceptedInitiations
	}
	return c.MaxAcceptedInitiations
}

// DefaultPrekeyConfig returns the defaults: rotation every 7 days, 30 days
// of grace, batches of 100 one-time prekeys replenished under 25, at most
// 1 000 held.
func DefaultPrekeyConfig() PrekeyConfig {
	return PrekeyConfig{
		RotationInterval: 7 * 24 * time.Hour,
		GracePeriod:      30 * 24 * time.Hour,
		OneTimeBatch:     100,
		OneTimeThreshold: 25,
		MaxOneTime:       1000,
	}
}

const maxOneTimeLimit = 10000

func (c PrekeyConfig) validate() error {
	if c.RotationInterval <= 0 || c.GracePeriod < 0 || c.OneTimeBatch <= 0 || c.OneTimeThreshold < 0 ||
		c.MaxOneTime < c.OneTimeBatch || c.MaxOneTime > maxOneTimeLimit ||
		c.MaxAcceptedInitiations < 0 || c.MaxAcceptedInitiations > maxAcceptedLimit || c.MinIssuedAge < 0 {
		return fmt.Errorf("%w: prekey config %+v", ErrInvalidConfig, c)
	}
	return nil
}

type signedKey struct {
	id      uint32
	key     *ecdh.PrivateKey // immutable key object for priv, or nil
	priv    [32]byte
	pub     [32]byte
	sig     [64]byte
	created int64 // unix ns
	expires int64 // unix ns; 0 while current
	// closed: replaced when the accepted set was full; it completes only
	// initiations with a one-time prekey for the rest of its grace period.
	closed bool
}

type kemKey struct {
	id      uint32
	seed    [64]byte
	pub     []byte
	sig     [64]byte
	created int64
	expires int64
}

type oneTimeKey struct {
	id     uint32
	issued bool
	// issuedAt is when it was handed out (unix ns); 0: at an unknown time
	// (IssueBundle, or a store of version 2), old enough to evict.
	issuedAt int64
	priv     [32]byte
	pub      [32]byte
}

// PrekeyStore is the responder side's prekey state: the current and
// still-in-grace signed prekeys, the signed ML-KEM-768 last-resort prekeys
// (rotated together with the signed prekey), and the one-time prekeys. It
// is an immutable value: every operation returns a new store, and the
// caller persists it (MarshalPrekeyStore). The zero value holds nothing;
// create one with NewPrekeyStore.
type PrekeyStore struct {
	cfg     PrekeyConfig
	nextID  uint32
	signed  []signedKey // current is last
	kem     []kemKey    // current is last
	oneTime []oneTimeKey
	// accepted are the session ids of accepted last-resort initiations,
	// oldest first: such an initiation consumes nothing,
	// so without them a recorded one would be accepted again once the
	// session record forgot it (ResetSession, AcceptIdentity, eviction).
	// An initiation with a one-time prekey needs no entry: its key is gone.
	accepted []acceptedInit
}

// acceptedInit is one accepted last-resort initiation and the prekeys it
// named: it is kept while both are held.
type acceptedInit struct {
	id          SessionID
	signed, kem uint32
}

// AcceptedInitiation is an initiation Decrypt accepted, to apply to the
// stored prekey store with Accept in the transaction that persists the
// new session.
type AcceptedInitiation struct {
	session     SessionID
	signed, kem uint32
	oneTime     *uint32
}

// Session returns the id of the session the initiation created.
func (a AcceptedInitiation) Session() SessionID { return a.session }

// OneTimePrekeyID returns the one-time prekey it consumed (false: a
// last-resort initiation).
func (a AcceptedInitiation) OneTimePrekeyID() (uint32, bool) {
	if a.oneTime == nil {
		return 0, false
	}
	return *a.oneTime, true
}

func (s PrekeyStore) wasAccepted(id SessionID) bool {
	for i := range s.accepted {
		if s.accepted[i].id == id {
			return true
		}
	}
	return false
}

// AcceptedCount returns how many last-resort initiation ids are held.
func (s PrekeyStore) AcceptedCount() int { return len(s.accepted) }

// Accept returns the store after initiation a was accepted: its one-time
// prekey consumed (ErrUnknownPrekey when it is not held: unknown or
// already used), or, for a last-resort initiation, its session id
// recorded (ErrReplay when it is already; ErrInitiationLimit when the set
// is full or the signed prekey it names is closed to last-resort
// initiations). Decrypt applies it to its snapshot; the caller applies it
// again to the stored store when it commits, so two concurrent copies of
// one initiation are never both accepted (PQXDH §3.4).
func (s PrekeyStore) Accept(a AcceptedInitiation) (PrekeyStore, error) {
	if a.oneTime != nil {
		out, _, err := s.takeOneTime(*a.oneTime)
		return out, err
	}
	if s.wasAccepted(a.session) {
		return s, fmt.Errorf("%w: initiation of session %s was accepted before", ErrReplay, a.session)
	}
	for _, k := range s.signed {
		if k.id == a.signed && k.closed {
			return s, fmt.Errorf("%w: signed prekey %d is closed to last-resort initiations", ErrInitiationLimit, a.signed)
		}
	}
	if len(s.accepted) >= s.cfg.maxAccepted() {
		return s, fmt.Errorf("%w: %d accepted initiation ids held", ErrInitiationLimit, len(s.accepted))
	}
	acc := make([]acceptedInit, 0, len(s.accepted)+1)
	acc = append(acc, s.accepted...)
	s.accepted = append(acc, acceptedInit{id: a.session, signed: a.signed, kem: a.kem})
	return s, nil
}

// NewPrekeyStore creates a store with a fresh signed prekey, signed KEM
// prekey and a batch of one-time prekeys, all signed by id.
func NewPrekeyStore(id Identity, now time.Time, cfg PrekeyConfig) (PrekeyStore, error) {
	if err := cfg.validate(); err != nil {
		return PrekeyStore{}, err
	}
	var start [4]byte
	if _, err := rand.Read(start[:]); err != nil {
		return PrekeyStore{}, err
	}
	// Random 24-bit starting id (as libsignal): a reinstalled device does
	// not reuse the ids of old bundles still in circulation.
	s := PrekeyStore{cfg: cfg, nextID: binary.BigEndian.Uint32(start[:])&0xffffff + 1}
	var err error
	if s, err = s.rotate(id, now); err != nil {
		return PrekeyStore{}, err
	}
	return s.replenish(now)
}

// Config returns the store's schedule.
func (s PrekeyStore) Config() PrekeyConfig { return s.cfg }

// WithConfig returns the store with a new schedule; it takes effect at
// the next Refresh.
func (s PrekeyStore) WithConfig(cfg PrekeyConfig) (PrekeyStore, error) {
	if err := cfg.validate(); err != nil {
		return s, err
	}
	s.cfg = cfg
	return s, nil
}

func (s *PrekeyStore) allocID() uint32 {
	id := s.nextID
	s.nextID++
	if s.nextID == 0 {
		s.nextID = 1
	}
	return id
}

// rotate installs a new current signed prekey and KEM prekey; the previous
// ones enter their grace period.
func (s PrekeyStore) rotate(id Identity, now time.Time) (PrekeyStore, error) {
	t := now.UnixNano()
	expires := now.Add(s.cfg.GracePeriod).UnixNano()
	if expires == 0 {
		expires = 1
	}
	xk, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return s, err
	}
	dk, err := mlkem.GenerateKey768()
	if err != nil {
		return s, err
	}
	spk := signedKey{id: s.allocID(), created: t, key: xk}
	copy(spk.priv[:], xk.Bytes())
	copy(spk.pub[:], xk.PublicKey().Bytes())
	spk.sig = id.sign(signedPrekeyMessage(sigContextSPK, id.pub.DH, spk.id, spk.pub[:]))
	kk := kemKey{id: s.allocID(), created: t, pub: dk.EncapsulationKey().Bytes()}
	copy(kk.seed[:], dk.Bytes())
	kk.sig = id.sign(signedPrekeyMessage(sigContextKEM, id.pub.DH, kk.id, kk.pub))

	signed := make([]signedKey, 0, len(s.signed)+1)
	for _, k := range s.signed {
		if k.expires == 0 {
			k.expires = expires
		}
		signed = append(signed, k)
	}
	s.signed = append(signed, spk)
	kems := make([]kemKey, 0, len(s.kem)+1)
	for _, k := range s.kem {
		if k.expires == 0 {
			k.expires = expires
		}
		kems = append(kems, k)
	}
	s.kem = append(kems, kk)
	return s, nil
}

func (s PrekeyStore) unissued() int {
	n := 0
	for _, k := range s.oneTime {
		if !k.issued {
			n++
		}
	}
	return n
}

// replenish adds a batch of one-time prekeys when fewer than the threshold
// remain unissued, dropping the oldest issued ones beyond MaxOneTime that
// were issued at least MinIssuedAge before now; the batch is cut to what
// then fits under MaxOneTime.
func (s PrekeyStore) replenish(now time.Time) (PrekeyStore, error) {
	if s.unissued() >= s.cfg.OneTimeThreshold && len(s.oneTime) > 0 {
		return s, nil
	}
	cutoff := now.Add(-s.cfg.minIssuedAge()).UnixNano()
	evictable := 0
	for _, k := range s.oneTime {
		if k.issued && k.issuedAt <= cutoff {
			evictable++
		}
	}
	n := min(s.cfg.OneTimeBatch, s.cfg.MaxOneTime-len(s.oneTime)+evictable)
	if n <= 0 {
		return s, nil
	}
	batch := make([]oneTimeKey, 0, n)
	for range n {
		k, err := ecdh.X25519().GenerateKey(rand.Reader)
		if err != nil {
			return s, err
		}
		o := oneTimeKey{id: s.allocID()}
		copy(o.priv[:], k.Bytes())
		copy(o.pub[:], k.PublicKey().Bytes())
		batch = append(batch, o)
	}
	excess := len(s.oneTime) + len(batch) - s.cfg.MaxOneTime
	kept := make([]oneTimeKey, 0, len(s.oneTime)+len(batch))
	for _, k := range s.oneTime {
		if excess > 0 && k.issued && k.issuedAt <= cutoff {
			excess--
			continue
		}
		kept = append(kept, k)
	}
	s.oneTime = append(kept, batch...)
	return s, nil
}

// Refresh applies the schedule at time now: it rotates the signed prekey
// and KEM prekey when the current ones are RotationInterval old, forgets
// replaced ones whose grace period has ended, and replenishes one-time
// prekeys. changed reports whether the store must be persisted (and a new
// bundle published).
func (s PrekeyStore) Refresh(id Identity, now time.Time) (out PrekeyStore, changed bool, err error) {
	if len(s.signed) == 0 || len(s.kem) == 0 {
		return s, false, fmt.Errorf("%w: prekey store not initialized", ErrInvalidConfig)
	}
	out = s
	cur := s.signed[len(s.signed)-1]
	full := len(s.accepted) >= s.cfg.maxAccepted()
	if full || now.Sub(time.Unix(0, cur.created)) >= s.cfg.RotationInterval {
		if out, err = out.rotate(id, now); err != nil {
			return s, false, err
		}
		changed = true
	}
	if full {
		// The set is full: every replaced signed prekey now completes only
		// initiations with a one-time prekey, so no last-resort initiation
		// naming it can be accepted again, and its ids can go.
		signed := make([]signedKey, len(out.signed))
		copy(signed, out.signed)
		for i := range signed[:len(signed)-1] {
			signed[i].closed = true
		}
		out.signed = signed
	}
	t := now.UnixNano()
	if n := countExpired(out.signed, t); n > 0 {
		kept := make([]signedKey, 0, len(out.signed)-n)
		for _, k := range out.signed {
			if !(k.expires != 0 && t >= k.expires) {
				kept = append(kept, k)
			}
		}
		out.signed, changed = kept, true
	}
	var keptKEM []kemKey
	for _, k := range out.kem {
		if !(k.expires != 0 && t >= k.expires) {
			keptKEM = append(keptKEM, k)
		}
	}
	if len(keptKEM) != len(out.kem) {
		out.kem, changed = keptKEM, true
	}
	if kept := out.liveAccepted(); len(kept) != len(out.accepted) {
		out.accepted, changed = kept, true
	}
	before := len(out.oneTime)
	if out, err = out.replenish(now); err != nil {
		return s, false, err
	}
	if len(out.oneTime) != before {
		changed = true
	}
	return out, changed, nil
}

// liveAccepted returns the accepted ids whose signed and KEM prekeys are
// still held and open to last-resort initiations: an initiation naming a
// forgotten or closed prekey is refused anyway.
func (s PrekeyStore) liveAccepted() []acceptedInit {
	open := func(id uint32) bool {
		for _, k := range s.signed {
			if k.id == id {
				return !k.closed
			}
		}
		return false
	}
	held := func(id uint32) bool {
		for _, k := range s.kem {
			if k.id == id {
				return true
			}
		}
		return false
	}
	var kept []acceptedInit
	for _, a := range s.accepted {
		if open(a.signed) && held(a.kem) {
			kept = append(kept, a)
		}
	}
	if len(kept) == len(s.accepted) {
		return s.accepted
	}
	return kept
}

func countExpired(ks []signedKey, t int64) int {
	n := 0
	for _, k := range ks {
		if k.expires != 0 && t >= k.expires {
			n++
		}
	}
	return n
}

// IssueBundle returns the bundle to hand to the next initiator: the current
// signed prekey and KEM prekey and, when one is left, a one-time prekey
// that has not been handed out before (marked issued in the returned
// store, so persist it). Without one, the bundle carries none and
// initiators fall back to the last-resort keys (PQXDH §3.3).
//
// The key is marked issued at an unknown time, so it may be evicted at
// once; a device issuing bundles uses IssueBundleAt.
func (s PrekeyStore) IssueBundle(id IdentityPublic) (PrekeyStore, messages.PrekeyBundle, error) {
	return s.issueBundle(id, 0)
}

// IssueBundleAt is IssueBundle at time now: the one-time prekey it hands
// out is kept at least MinIssuedAge from now (PrekeyConfig.MinIssuedAge).
func (s PrekeyStore) IssueBundleAt(id IdentityPublic, now time.Time) (PrekeyStore, messages.PrekeyBundle, error) {
	return s.issueBundle(id, now.UnixNano())
}

func (s PrekeyStore) issueBundle(id IdentityPublic, at int64) (PrekeyStore, messages.PrekeyBundle, error) {
	if len(s.signed) == 0 || len(s.kem) == 0 {
		return s, messages.PrekeyBundle{}, fmt.Errorf("%w: prekey store not initialized", ErrInvalidConfig)
	}
	spk := s.signed[len(s.signed)-1]
	kk := s.kem[len(s.kem)-1]
	b := messages.PrekeyBundle{
		Identity:     id,
		SignedPrekey: messages.SignedPrekey{ID: spk.id, Public: spk.pub, Signature: spk.sig},
		KEMPrekey:    messages.KEMPrekey{ID: kk.id, Public: append([]byte(nil), kk.pub...), Signature: kk.sig},
	}
	for i, k := range s.oneTime {
		if k.issued {
			continue
		}
		ot := make([]oneTimeKey, len(s.oneTime))
		copy(ot, s.oneTime)
		ot[i].issued, ot[i].issuedAt = true, at
		s.oneTime = ot
		b.OneTimePrekey = &messages.OneTimePrekey{ID: k.id, Public: k.pub}
		break
	}
	return s, b, nil
}

// OneTimeCount returns how many one-time prekeys are held (issued or not).
func (s PrekeyStore) OneTimeCount() int { return len(s.oneTime) }

// UnissuedOneTimeCount returns how many one-time prekeys have not been handed out.
func (s PrekeyStore) UnissuedOneTimeCount() int { return s.unissued() }

// HasOneTime reports whether one-time prekey id is still held (not consumed).
func (s PrekeyStore) HasOneTime(id uint32) bool {
	for _, k := range s.oneTime {
		if k.id == id {
			return true
		}
	}
	return false
}

// CurrentSignedPrekeyID returns the id of the current signed prekey.
func (s PrekeyStore) CurrentSignedPrekeyID() uint32 {
	if len(s.signed) == 0 {
		return 0
	}
	return s.signed[len(s.signed)-1].id
}

// SignedPrekeyIDs returns the ids of every signed prekey still accepted at
// some time (current last).
func (s PrekeyStore) SignedPrekeyIDs() []uint32 {
	ids := make([]uint32, len(s.signed))
	for i, k := range s.signed {
		ids[i] = k.id
	}
	return ids
}

func (s PrekeyStore) lookupSigned(id uint32, now time.Time) (signedKey, error) {
	return lookupPrekey(s.signed, "signed", id, now, func(k signedKey) (uint32, int64) { return k.id, k.expires })
}

func (s PrekeyStore) lookupKEM(id uint32, now time.Time) (kemKey, error) {
	return lookupPrekey(s.kem, "KEM", id, now, func(k kemKey) (uint32, int64) { return k.id, k.expires })
}

// lookupPrekey finds prekey id among keys, refusing one past its grace
// period (expires 0: the current key, no expiry).
func lookupPrekey[K any](keys []K, kind string, id uint32, now time.Time, idOf func(K) (uint32, int64)) (K, error) {
	var zero K
	for _, k := range keys {
		if kid, expires := idOf(k); kid == id {
			if expires != 0 && now.UnixNano() >= expires {
				return zero, fmt.Errorf("%w: %s prekey %d past its grace period", ErrUnknownPrekey, kind, id)
			}
			return k, nil
		}
	}
	return zero, fmt.Errorf("%w: %s prekey %d", ErrUnknownPrekey, kind, id)
}

// takeOneTime returns one-time prekey id and the store without it (PQXDH
// §3.4: "Bob deletes any one-time prekey private key that was used").
func (s PrekeyStore) takeOneTime(id uint32) (PrekeyStore, oneTimeKey, error) {
	for i, k := range s.oneTime {
		if k.id == id {
			ot := make([]oneTimeKey, 0, len(s.oneTime)-1)
			ot = append(ot, s.oneTime[:i]...)
			s.oneTime = append(ot, s.oneTime[i+1:]...)
			return s, k, nil
		}
	}
	return s, oneTimeKey{}, fmt.Errorf("%w: one-time prekey %d (unknown or already used)", ErrUnknownPrekey, id)
}

// ---------------------------------------------------------------------------
// Encoding

// prekeyStoreVersion 2 adds the accepted last-resort initiation ids, the
// closed flag of signed prekeys and MaxAcceptedInitiations; version 3 the
// time each one-time prekey was issued and MinIssuedAge. Versions 1 and 2
// are still read (nothing accepted, nothing closed; issue times unknown).
const prekeyStoreVersion = 3

const maxPrekeyStoreSize = 4 << 20

type wireSignedKey struct {
	_       struct{} `cbor:",toarray"`
	ID      uint32
	Priv    []byte
	Sig     []byte
	Created int64
	Expires int64
}

type wireSignedKeyV2 struct {
	_       struct{} `cbor:",toarray"`
	ID      uint32
	Priv    []byte
	Sig     []byte
	Created int64
	Expires int64
	Closed  bool
}

type wireKEMKey struct {
	_       struct{} `cbor:",toarray"`
	ID      uint32
	Seed    []byte
	Sig     []byte
	Created int64
	Expires int64
}

type wirePrekeyStore struct {
	_      struct{} `cbor:",toarray"`
	V      uint64
	Cfg    [5]int64
	NextID uint32
	Signed []wireSignedKey
	KEM    []wireKEMKey
	// OneTime packs id (u32 BE) || issued (u8) || private key (32) ||
	// public key (32) per key; storing the public key keeps loading cheap.
	OneTime []byte
}

type wirePrekeyStoreV2 struct {
	_      struct{} `cbor:",toarray"`
	V      uint64
	Cfg    [6]int64
	NextID uint32
	Signed []wireSignedKeyV2
	KEM    []wireKEMKey
	// OneTime as in version 1.
	OneTime []byte
	// Accepted packs session id (32) || signed prekey id (u32 BE) || KEM
	// prekey id (u32 BE) per accepted last-resort initiation, oldest first.
	Accepted []byte
}

// wirePrekeyStoreV3 is version 2 with MinIssuedAge in Cfg[6] and the
// issue time in each one-time entry.
type wirePrekeyStoreV3 struct {
	_      struct{} `cbor:",toarray"`
	V      uint64
	Cfg    [7]int64
	NextID uint32
	Signed []wireSignedKeyV2
	KEM    []wireKEMKey
	// OneTime packs id (u32 BE) || issued (u8) || issued at (i64 BE, unix
	// ns, 0 unknown) || private key (32) || public key (32) per key.
	OneTime  []byte
	Accepted []byte
}

const acceptedEntry = 32 + 4 + 4

const oneTimeEntryV3 = 4 + 1 + 8 + 32 + 32

const oneTimeEntry = 4 + 1 + 32 + 32

// MarshalPrekeyStore returns the deterministic encoding of s (private keys
// included: seal it at rest).
func MarshalPrekeyStore(s PrekeyStore) ([]byte, error) {
	w := wirePrekeyStoreV3{
		V: prekeyStoreVersion,
		Cfg: [7]int64{int64(s.cfg.RotationInterval), int64(s.cfg.GracePeriod), int64(s.cfg.OneTimeBatch), int64(s.cfg.OneTimeThreshold),
			int64(s.cfg.MaxOneTime), int64(s.cfg.MaxAcceptedInitiations), int64(s.cfg.MinIssuedAge)},
		NextID: s.nextID,
		Signed: make([]wireSignedKeyV2, len(s.signed)),
		KEM:    make([]wireKEMKey, len(s.kem)),
	}
	for i, k := range s.signed {
		w.Signed[i] = wireSignedKeyV2{ID: k.id, Priv: k.priv[:], Sig: k.sig[:], Created: k.created, Expires: k.expires, Closed: k.closed}
	}
	if len(s.accepted) > 0 {
		w.Accepted = make([]byte, 0, len(s.accepted)*acceptedEntry)
		for _, a := range s.accepted {
			w.Accepted = append(w.Accepted, a.id[:]...)
			w.Accepted = binary.BigEndian.AppendUint32(w.Accepted, a.signed)
			w.Accepted = binary.BigEndian.AppendUint32(w.Accepted, a.kem)
		}
	}
	for i, k := range s.kem {
		w.KEM[i] = wireKEMKey{ID: k.id, Seed: k.seed[:], Sig: k.sig[:], Created: k.created, Expires: k.expires}
	}
	w.OneTime = make([]byte, 0, len(s.oneTime)*oneTimeEntryV3)
	for _, k := range s.oneTime {
		w.OneTime = binary.BigEndian.AppendUint32(w.OneTime, k.id)
		if k.issued {
			w.OneTime = append(w.OneTime, 1)
		} else {
			w.OneTime = append(w.OneTime, 0)
		}
		w.OneTime = binary.BigEndian.AppendUint64(w.OneTime, uint64(k.issuedAt))
		w.OneTime = append(w.OneTime, k.priv[:]...)
		w.OneTime = append(w.OneTime, k.pub[:]...)
	}
	b, err := messages.Marshal(&w)
	wipe(w.OneTime)
	return b, err
}

// UnmarshalPrekeyStore decodes what MarshalPrekeyStore wrote. Errors match
// messages.ErrMalformed.
func UnmarshalPrekeyStore(b []byte) (PrekeyStore, error) {
	const what = "ratchet prekey store"
	var w wirePrekeyStoreV3
	entry := oneTimeEntryV3
	if err := messages.Unmarshal(what, b, &w, maxPrekeyStoreSize); err != nil || w.V != prekeyStoreVersion {
		var w2 wirePrekeyStoreV2
		if err2 := messages.Unmarshal(what, b, &w2, maxPrekeyStoreSize); err2 != nil {
			// Version 1 (before the accepted initiation ids).
			var w1 wirePrekeyStore
			if messages.Unmarshal(what, b, &w1, maxPrekeyStoreSize) != nil || w1.V != 1 {
				if err == nil {
					err = err2
				}
				return PrekeyStore{}, err
			}
			w2 = wirePrekeyStoreV2{V: w1.V, NextID: w1.NextID, KEM: w1.KEM, OneTime: w1.OneTime}
			copy(w2.Cfg[:], w1.Cfg[:])
			for _, k := range w1.Signed {
				w2.Signed = append(w2.Signed, wireSignedKeyV2{ID: k.ID, Priv: k.Priv, Sig: k.Sig, Created: k.Created, Expires: k.Expires})
			}
		} else if w2.V != 2 {
			return PrekeyStore{}, &messages.DecodeError{What: what, Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", w2.V)}
		}
		w = wirePrekeyStoreV3{V: w2.V, NextID: w2.NextID, Signed: w2.Signed, KEM: w2.KEM, OneTime: w2.OneTime, Accepted: w2.Accepted}
		copy(w.Cfg[:], w2.Cfg[:])
		entry = oneTimeEntry
	}
	s := PrekeyStore{
		cfg: PrekeyConfig{
			RotationInterval: time.Duration(w.Cfg[0]), GracePeriod: time.Duration(w.Cfg[1]),
			OneTimeBatch: int(w.Cfg[2]), OneTimeThreshold: int(w.Cfg[3]), MaxOneTime: int(w.Cfg[4]),
			MaxAcceptedInitiations: int(w.Cfg[5]), MinIssuedAge: time.Duration(w.Cfg[6]),
		},
		nextID: w.NextID,
	}
	// The cap is enforced by Accept; a store holding more (a lowered
	// MaxAcceptedInitiations) still loads and refuses new ones.
	if len(w.Accepted)%acceptedEntry != 0 || len(w.Accepted)/acceptedEntry > maxAcceptedLimit {
		return PrekeyStore{}, decodeError(what, fmt.Errorf("accepted initiation ids: bad size"))
	}
	if err := s.cfg.validate(); err != nil {
		return PrekeyStore{}, decodeError(what, err)
	}
	if len(w.Signed) == 0 || len(w.KEM) == 0 || len(w.OneTime)%entry != 0 {
		return PrekeyStore{}, decodeError(what, fmt.Errorf("missing keys or bad one-time block"))
	}
	for _, wk := range w.Signed {
		if len(wk.Priv) != 32 || len(wk.Sig) != 64 {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("signed prekey %d: wrong sizes", wk.ID))
		}
		k := signedKey{id: wk.ID, created: wk.Created, expires: wk.Expires, closed: wk.Closed}
		copy(k.priv[:], wk.Priv)
		copy(k.sig[:], wk.Sig)
		pk, err := ecdh.X25519().NewPrivateKey(k.priv[:])
		if err != nil {
			return PrekeyStore{}, decodeError(what, err)
		}
		copy(k.pub[:], pk.PublicKey().Bytes())
		k.key = pk
		s.signed = append(s.signed, k)
	}
	for _, wk := range w.KEM {
		if len(wk.Seed) != 64 || len(wk.Sig) != 64 {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("KEM prekey %d: wrong sizes", wk.ID))
		}
		k := kemKey{id: wk.ID, created: wk.Created, expires: wk.Expires}
		copy(k.seed[:], wk.Seed)
		copy(k.sig[:], wk.Sig)
		dk, err := mlkem.NewDecapsulationKey768(k.seed[:])
		if err != nil {
			return PrekeyStore{}, decodeError(what, err)
		}
		k.pub = dk.EncapsulationKey().Bytes()
		s.kem = append(s.kem, k)
	}
	seen := make(map[uint32]bool, len(w.OneTime)/entry)
	for p := w.OneTime; len(p) > 0; p = p[entry:] {
		k := oneTimeKey{id: binary.BigEndian.Uint32(p), issued: p[4] == 1}
		if p[4] > 1 || seen[k.id] {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("one-time prekey %d: bad flag or duplicate", k.id))
		}
		seen[k.id] = true
		keys := p[5:entry]
		if entry == oneTimeEntryV3 {
			k.issuedAt, keys = int64(binary.BigEndian.Uint64(p[5:13])), p[13:entry]
			if k.issuedAt != 0 && !k.issued {
				return PrekeyStore{}, decodeError(what, fmt.Errorf("one-time prekey %d: issue time of an unissued key", k.id))
			}
		}
		copy(k.priv[:], keys[:32])
		copy(k.pub[:], keys[32:64])
		s.oneTime = append(s.oneTime, k)
	}
	wipe(w.OneTime)
	seenAcc := make(map[SessionID]bool, len(w.Accepted)/acceptedEntry)
	for p := w.Accepted; len(p) > 0; p = p[acceptedEntry:] {
		a := acceptedInit{id: SessionID(p[:32]), signed: binary.BigEndian.Uint32(p[32:36]), kem: binary.BigEndian.Uint32(p[36:40])}
		if seenAcc[a.id] {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("accepted initiation %s twice", a.id))
		}
		seenAcc[a.id] = true
		s.accepted = append(s.accepted, a)
	}
	return s, nil
}

// ConsumeOneTime returns the store without one-time prekey id, or
// ErrUnknownPrekey when it holds no such key (unknown or already used).
// A receiver that decrypted an initiation against a snapshot of its
// prekey store applies the consumption to the stored store with it, so
// concurrent initiations merge without decrypting again and a one-time
// prekey is never accepted twice (PQXDH §3.4).
func (s PrekeyStore) ConsumeOneTime(id uint32) (PrekeyStore, error) {
	out, _, err := s.takeOneTime(id)
	return out, err
}
