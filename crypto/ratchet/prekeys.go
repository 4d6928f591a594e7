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
	// exceed it, the oldest issued (handed out, never used) ones are dropped.
	MaxOneTime int
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
		c.MaxOneTime < c.OneTimeBatch || c.MaxOneTime > maxOneTimeLimit {
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
	priv   [32]byte
	pub    [32]byte
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
// remain unissued, dropping the oldest issued ones beyond MaxOneTime.
func (s PrekeyStore) replenish(_ time.Time) (PrekeyStore, error) {
	if s.unissued() >= s.cfg.OneTimeThreshold && len(s.oneTime) > 0 {
		return s, nil
	}
	batch := make([]oneTimeKey, 0, s.cfg.OneTimeBatch)
	for range s.cfg.OneTimeBatch {
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
		if excess > 0 && k.issued {
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
	if now.Sub(time.Unix(0, cur.created)) >= s.cfg.RotationInterval {
		if out, err = out.rotate(id, now); err != nil {
			return s, false, err
		}
		changed = true
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
	before := len(out.oneTime)
	if out, err = out.replenish(now); err != nil {
		return s, false, err
	}
	if len(out.oneTime) != before {
		changed = true
	}
	return out, changed, nil
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
func (s PrekeyStore) IssueBundle(id IdentityPublic) (PrekeyStore, messages.PrekeyBundle, error) {
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
		ot[i].issued = true
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

const prekeyStoreVersion = 1

const maxPrekeyStoreSize = 4 << 20

type wireSignedKey struct {
	_       struct{} `cbor:",toarray"`
	ID      uint32
	Priv    []byte
	Sig     []byte
	Created int64
	Expires int64
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

const oneTimeEntry = 4 + 1 + 32 + 32

// MarshalPrekeyStore returns the deterministic encoding of s (private keys
// included: seal it at rest).
func MarshalPrekeyStore(s PrekeyStore) ([]byte, error) {
	w := wirePrekeyStore{
		V:      prekeyStoreVersion,
		Cfg:    [5]int64{int64(s.cfg.RotationInterval), int64(s.cfg.GracePeriod), int64(s.cfg.OneTimeBatch), int64(s.cfg.OneTimeThreshold), int64(s.cfg.MaxOneTime)},
		NextID: s.nextID,
		Signed: make([]wireSignedKey, len(s.signed)),
		KEM:    make([]wireKEMKey, len(s.kem)),
	}
	for i, k := range s.signed {
		w.Signed[i] = wireSignedKey{ID: k.id, Priv: k.priv[:], Sig: k.sig[:], Created: k.created, Expires: k.expires}
	}
	for i, k := range s.kem {
		w.KEM[i] = wireKEMKey{ID: k.id, Seed: k.seed[:], Sig: k.sig[:], Created: k.created, Expires: k.expires}
	}
	w.OneTime = make([]byte, 0, len(s.oneTime)*oneTimeEntry)
	for _, k := range s.oneTime {
		w.OneTime = binary.BigEndian.AppendUint32(w.OneTime, k.id)
		if k.issued {
			w.OneTime = append(w.OneTime, 1)
		} else {
			w.OneTime = append(w.OneTime, 0)
		}
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
	var w wirePrekeyStore
	if err := messages.Unmarshal(what, b, &w, maxPrekeyStoreSize); err != nil {
		return PrekeyStore{}, err
	}
	if w.V != prekeyStoreVersion {
		return PrekeyStore{}, &messages.DecodeError{What: what, Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", w.V)}
	}
	s := PrekeyStore{
		cfg: PrekeyConfig{
			RotationInterval: time.Duration(w.Cfg[0]), GracePeriod: time.Duration(w.Cfg[1]),
			OneTimeBatch: int(w.Cfg[2]), OneTimeThreshold: int(w.Cfg[3]), MaxOneTime: int(w.Cfg[4]),
		},
		nextID: w.NextID,
	}
	if err := s.cfg.validate(); err != nil {
		return PrekeyStore{}, decodeError(what, err)
	}
	if len(w.Signed) == 0 || len(w.KEM) == 0 || len(w.OneTime)%oneTimeEntry != 0 {
		return PrekeyStore{}, decodeError(what, fmt.Errorf("missing keys or bad one-time block"))
	}
	for _, wk := range w.Signed {
		if len(wk.Priv) != 32 || len(wk.Sig) != 64 {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("signed prekey %d: wrong sizes", wk.ID))
		}
		k := signedKey{id: wk.ID, created: wk.Created, expires: wk.Expires}
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
	seen := make(map[uint32]bool, len(w.OneTime)/oneTimeEntry)
	for p := w.OneTime; len(p) > 0; p = p[oneTimeEntry:] {
		k := oneTimeKey{id: binary.BigEndian.Uint32(p), issued: p[4] == 1}
		if p[4] > 1 || seen[k.id] {
			return PrekeyStore{}, decodeError(what, fmt.Errorf("one-time prekey %d: bad flag or duplicate", k.id))
		}
		seen[k.id] = true
		copy(k.priv[:], p[5:37])
		copy(k.pub[:], p[37:69])
		s.oneTime = append(s.oneTime, k)
	}
	wipe(w.OneTime)
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
