package ratchet

import (
	"crypto/ecdh"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"

	"github.com/syncmesh/syncmesh/messages"
)

// HKDF info strings of the Double Ratchet (DR §5.2).
const (
	infoRoot    = "syncmesh_Ratchet_Root_v1"
	infoMessage = "syncmesh_Ratchet_Message_v1"
)

type skippedKey struct {
	// seq numbers the key in its record (0: not numbered yet, a key this
	// step just skipped; SessionRecord.numbered). It is the key's storage
	// address when skipped keys are stored on their own (SkippedKey).
	seq uint64
	dh  [32]byte
	n   uint32
	at  int64 // unix ns when it was skipped; 0: loaded from a record that kept no times
	mk  [32]byte
}

// oldChain remembers a retired receiving chain so a late copy of one of its
// messages is reported as a replay rather than an authentication failure.
type oldChain struct {
	dh  [32]byte
	end uint32 // first message number that never existed on the chain
}

// session is one Double Ratchet state (DR §3.2 "State variables"). A
// *session held by a SessionRecord is never modified: every step copies it.
type session struct {
	id        SessionID
	initiator bool
	// pending is the initiation attached to every envelope we send until
	// the peer answers on this session (libsignal's "unacknowledged prekey
	// message"); pendingEnc is its canonical encoding.
	pending    *messages.PrekeyInitiation
	pendingEnc []byte
	local      IdentityPublic
	remote     IdentityPublic

	rk              [32]byte
	dhsPriv, dhsPub [32]byte
	dhsKey          *ecdh.PrivateKey // immutable key object for dhsPriv, or nil (built on demand)
	// needSendRatchet: a new remote ratchet key arrived; the next Encrypt
	// generates our new key pair and sending chain (the second half of DR
	// §3.5 DHRatchet, done lazily).
	needSendRatchet bool
	dhr             [32]byte
	hasDHr          bool
	cks, ckr        [32]byte
	hasCKs, hasCKr  bool
	ns, nr, pn      uint32
	skipped         []skippedKey // oldest first
	oldChains       []oldChain   // oldest first
	// peerSalted: the peer has sent a version-2 envelope on this session,
	// so it reads them; under Config.LegacyEnvelopes we then send version
	// 2 too. Kept in memory only: after a reload the next version-2
	// envelope from the peer sets it again.
	peerSalted bool
}

func (s *session) info() SessionInfo {
	return SessionInfo{ID: s.id, Local: s.local, Remote: s.remote, Initiator: s.initiator, Acknowledged: s.pending == nil}
}

// dhRatchetStep is one half of DHRatchet (DR §3.5): the root KDF over
// DH(ours, theirs). The DH output is wiped before it returns, whatever
// happens.
func dhRatchetStep(rk [32]byte, ours *ecdh.PrivateKey, theirs [32]byte) (newRK, ck [32]byte, err error) {
	dhOut, err := x25519(ours, theirs)
	if err != nil {
		return newRK, ck, err
	}
	defer wipe(dhOut)
	return kdfRK(rk, dhOut)
}

// kdfRK is KDF_RK (DR §5.2): HKDF-SHA256 with the root key as salt.
func kdfRK(rk [32]byte, dhOut []byte) (newRK, ck [32]byte, err error) {
	if len(dhOut) > hmacMaxMsg {
		return newRK, ck, fmt.Errorf("%w: DH output of %d bytes", ErrTampered, len(dhOut))
	}
	var okm [64]byte
	if err := hkdfSHA256(okm[:], dhOut, rk[:], infoRoot); err != nil {
		return newRK, ck, err
	}
	copy(newRK[:], okm[:32])
	copy(ck[:], okm[32:])
	clear(okm[:])
	return newRK, ck, nil
}

// hmacMaxMsg bounds the messages hmacSHA256 takes (and so HKDF's input
// key material and info here): every caller's input is a key or a chain
// step of at most this size.
const hmacMaxMsg = 96

// hmacMaxKey is the longest key hmacSHA256 takes: one SHA-256 block. A
// longer key would have to be hashed first (RFC 2104 §2); no caller has
// one, so it is refused rather than computed on a path nothing tests.
const hmacMaxKey = sha256.BlockSize

// hkdfMaxInfo is the longest info hkdfSHA256 takes: T(i-1) || info || i
// must fit one hmacSHA256 message.
const hkdfMaxInfo = hmacMaxMsg - sha256.Size - 1

// hkdfMaxOut is the longest output of HKDF-SHA256 (RFC 5869 §2.3:
// L <= 255*HashLen).
const hkdfMaxOut = 255 * sha256.Size

// errKDFRange marks input outside the bounds of the allocation-free
// HMAC and HKDF below. Refusing it is what keeps them from silently
// computing something other than HMAC or HKDF (a truncated key or
// message) or indexing past their buffers.
var errKDFRange = errors.New("ratchet: KDF input out of range")

// hmacSHA256 is HMAC-SHA256 (RFC 2104) for a key of at most one block
// (hmacMaxKey bytes) and a message of at most hmacMaxMsg bytes, computed
// on stack buffers: H((K ⊕ opad) || H((K ⊕ ipad) || m)) with K
// zero-padded. The per-message key derivations run it with a fresh key
// every time, where crypto/hmac would allocate two hash states and their
// marshalled copies per call. A longer key or message is refused with
// errKDFRange.
func hmacSHA256(key, msg []byte) (sum [32]byte, err error) {
	if len(key) > hmacMaxKey {
		return sum, fmt.Errorf("%w: HMAC key of %d bytes, limit %d", errKDFRange, len(key), hmacMaxKey)
	}
	if len(msg) > hmacMaxMsg {
		return sum, fmt.Errorf("%w: HMAC message of %d bytes, limit %d", errKDFRange, len(msg), hmacMaxMsg)
	}
	var k [64]byte
	copy(k[:], key)
	var buf [64 + hmacMaxMsg]byte
	for i := range k {
		buf[i] = k[i] ^ 0x36
	}
	n := copy(buf[64:], msg)
	inner := sha256.Sum256(buf[:64+n])
	for i := range k {
		buf[i] = k[i] ^ 0x5c
	}
	copy(buf[64:], inner[:])
	sum = sha256.Sum256(buf[:64+len(inner)])
	clear(k[:])
	clear(buf[:])
	clear(inner[:])
	return sum, nil
}

// hkdfSHA256 fills out (at most hkdfMaxOut bytes) with HKDF-SHA256
// (RFC 5869) of secret (at most hmacMaxMsg bytes) under salt (at most
// hmacMaxKey bytes) and info (at most hkdfMaxInfo bytes), without
// allocating: Extract PRK = HMAC(salt, secret), then Expand T(i) =
// HMAC(PRK, T(i-1) || info || i). Input past a bound is refused with
// errKDFRange and out is left unwritten. TestHKDFMatchesCryptoHKDF checks
// it against crypto/hkdf.
func hkdfSHA256(out, secret, salt []byte, info string) error {
	switch {
	case len(out) > hkdfMaxOut:
		return fmt.Errorf("%w: HKDF output of %d bytes, limit %d", errKDFRange, len(out), hkdfMaxOut)
	case len(info) > hkdfMaxInfo:
		return fmt.Errorf("%w: HKDF info of %d bytes, limit %d", errKDFRange, len(info), hkdfMaxInfo)
	case len(salt) > hmacMaxKey:
		return fmt.Errorf("%w: HKDF salt of %d bytes, limit %d", errKDFRange, len(salt), hmacMaxKey)
	case len(secret) > hmacMaxMsg:
		return fmt.Errorf("%w: HKDF input key material of %d bytes, limit %d", errKDFRange, len(secret), hmacMaxMsg)
	}
	prk, err := hmacSHA256(salt, secret)
	if err != nil {
		return err
	}
	var m [hmacMaxMsg]byte
	var t [32]byte
	prev := 0
	for i, done := byte(1), 0; done < len(out); i++ {
		n := copy(m[:], t[:prev])
		n += copy(m[n:], info)
		m[n] = i
		// Within the bounds checked above this cannot fail.
		if t, err = hmacSHA256(prk[:], m[:n+1]); err != nil {
			break
		}
		prev = len(t)
		done += copy(out[done:], t[:])
	}
	clear(prk[:])
	clear(m[:])
	clear(t[:])
	return err
}

// kdfCK is KDF_CK (DR §5.2): message key = HMAC-SHA256(CK, 0x01), next
// chain key = HMAC-SHA256(CK, 0x02). The chain key changes every step, so
// a keyed HMAC object cannot be reused across steps; HMAC (RFC 2104) is
// computed here on stack buffers instead — H((K ⊕ opad) || H((K ⊕ ipad) ||
// m)) with K zero-padded to the 64-byte block — so a chain walk of N steps
// allocates nothing (hmac.New per step churned ~40 MiB in the
// worst case). TestKDFCKVectors checks it against crypto/hmac.
func kdfCK(ck [32]byte) (mk, next [32]byte) {
	var in [64 + 1]byte   // (K ⊕ ipad) || m
	var out [64 + 32]byte // (K ⊕ opad) || inner hash
	for i := range 64 {
		var k byte
		if i < len(ck) {
			k = ck[i]
		}
		in[i], out[i] = k^0x36, k^0x5c
	}
	in[64] = 0x01
	inner := sha256.Sum256(in[:])
	copy(out[64:], inner[:])
	mk = sha256.Sum256(out[:])
	in[64] = 0x02
	inner = sha256.Sum256(in[:])
	copy(out[64:], inner[:])
	next = sha256.Sum256(out[:])
	clear(in[:])
	clear(out[:])
	clear(inner[:])
	return mk, next
}

func seal(mk [32]byte, salt *[messages.HeaderSaltSize]byte, pt, ad []byte) ([]byte, error) {
	aead, nonce, err := messageAEAD(mk, salt, true)
	if err != nil {
		return nil, err
	}
	return aead.Seal(nil, nonce[:], pt, ad), nil
}

func open(mk [32]byte, salt *[messages.HeaderSaltSize]byte, ct, ad []byte) ([]byte, error) {
	aead, nonce, err := messageAEAD(mk, salt, false)
	if err != nil {
		return nil, err
	}
	pt, err := aead.Open(nil, nonce[:], ct, ad)
	if err != nil {
		return nil, ErrTampered
	}
	return pt, nil
}

// associatedData is encoded header || encoded initiation (prekey
// envelopes) || sender identity || receiver identity (DR §3.4 AD, PQXDH
// §3.3 AD = IK_A || IK_B).
func associatedData(hdr, init []byte, sender, receiver IdentityPublic) []byte {
	ad := make([]byte, 0, len(hdr)+len(init)+128)
	ad = append(ad, hdr...)
	ad = append(ad, init...)
	ad = append(ad, sender.Sign[:]...)
	ad = append(ad, sender.DH[:]...)
	ad = append(ad, receiver.Sign[:]...)
	return append(ad, receiver.DH[:]...)
}

// skipKeys advances chain ck from message number from to to, returning the
// chain key at to and the keys of from..to-1, of which only the last limit
// are kept (the rest would be evicted at once).
func skipKeys(ck [32]byte, dh [32]byte, from, to uint32, limit int, now int64) ([32]byte, []skippedKey) {
	if to <= from {
		return ck, nil
	}
	count := int(to - from)
	keep := min(count, limit)
	out := make([]skippedKey, 0, keep)
	for n := from; n < to; n++ {
		mk, next := kdfCK(ck)
		if int(to-n) <= keep {
			out = append(out, skippedKey{dh: dh, n: n, at: now, mk: mk})
		}
		ck = next
	}
	return ck, out
}

// appendSkipped returns old + add as a new slice, evicting the oldest keys
// beyond limit (libsignal evicts oldest first).
func appendSkipped(old, add []skippedKey, limit int) []skippedKey {
	if len(add) == 0 {
		return old
	}
	total := len(old) + len(add)
	drop := max(0, total-limit)
	out := make([]skippedKey, 0, total-drop)
	if drop < len(old) {
		out = append(out, old[drop:]...)
		out = append(out, add...)
	} else {
		out = append(out, add[drop-len(old):]...)
	}
	return out
}

func (s *session) findSkipped(dh [32]byte, n uint32) int {
	for i := range s.skipped {
		if s.skipped[i].n == n && s.skipped[i].dh == dh {
			return i
		}
	}
	return -1
}

// decrypt is RatchetDecrypt (DR §3.5) on an immutable session: it returns a
// new session and the plaintext, or an error and nothing.
func (s *session) decrypt(cfg Config, env *messages.Envelope, hdrEnc, initEnc []byte, now int64) (*session, []byte, error) {
	h := &env.Header
	ad := associatedData(hdrEnc, initEnc, s.remote, s.local)
	// Before the peer proved it holds this session (an envelope still
	// carrying its initiation, or our own initiation it has not answered),
	// a forged header costs us every chain step it names: keep that small.
	jump, preAuth := cfg.MaxForwardJump, initEnc != nil || s.pending != nil
	if preAuth {
		jump = cfg.unacknowledgedJump()
	}

	// TrySkippedMessageKeys: a used key is deleted, so a replay misses.
	if i := s.findSkipped(h.DH, h.N); i >= 0 {
		cfg.Work.kdf(1)
		pt, err := open(s.skipped[i].mk, h.Salt, env.Ciphertext, ad)
		if err != nil {
			return nil, nil, err
		}
		ns := *s
		ns.skipped = make([]skippedKey, 0, len(s.skipped)-1)
		ns.skipped = append(ns.skipped, s.skipped[:i]...)
		ns.skipped = append(ns.skipped, s.skipped[i+1:]...)
		return &ns, pt, nil
	}

	if s.hasDHr && h.DH == s.dhr {
		if !s.hasCKr {
			// Our first ratchet target (the responder's signed prekey) is
			// never a sending key of the peer.
			return nil, nil, ErrTampered
		}
		if h.N < s.nr {
			return nil, nil, fmt.Errorf("%w: message %d of the current chain", ErrReplay, h.N)
		}
		if uint64(h.N-s.nr) > uint64(jump) {
			return nil, nil, fmt.Errorf("%w: %d in one chain", ErrTooManySkipped, h.N-s.nr)
		}
		cfg.Work.kdf(int(h.N-s.nr) + 2) // skipped steps, this message's step and its HKDF
		ck, skipped := skipKeys(s.ckr, h.DH, s.nr, h.N, cfg.MaxSkippedKeys, now)
		mk, next := kdfCK(ck)
		pt, err := open(mk, h.Salt, env.Ciphertext, ad)
		wipe(mk[:])
		if err != nil {
			return nil, nil, err
		}
		ns := *s
		ns.ckr, ns.nr = next, h.N+1
		ns.skipped = appendSkipped(s.skipped, skipped, cfg.MaxSkippedKeys)
		return &ns, pt, nil
	}

	for _, oc := range s.oldChains {
		if oc.dh == h.DH {
			if h.N < oc.end {
				return nil, nil, fmt.Errorf("%w: message %d of a previous chain", ErrReplay, h.N)
			}
			return nil, nil, fmt.Errorf("%w: message %d beyond the end of a previous chain", ErrTampered, h.N)
		}
	}

	// A new remote ratchet key: skip the rest of the current receiving
	// chain up to PN, then DH ratchet (DR §3.5 SkipMessageKeys, DHRatchet).
	var skippedOld []skippedKey
	var prev uint64
	if s.hasCKr && h.PN > s.nr {
		prev = uint64(h.PN - s.nr)
	}
	if prev > uint64(jump) {
		return nil, nil, fmt.Errorf("%w: %d in the previous chain", ErrTooManySkipped, prev)
	}
	if uint64(h.N) > uint64(jump) {
		return nil, nil, fmt.Errorf("%w: %d in a new chain", ErrTooManySkipped, h.N)
	}
	if preAuth && prev+uint64(h.N) > uint64(jump) {
		return nil, nil, fmt.Errorf("%w: %d + %d before the peer answered", ErrTooManySkipped, prev, h.N)
	}
	if prev > 0 {
		cfg.Work.kdf(int(prev))
		_, skippedOld = skipKeys(s.ckr, s.dhr, s.nr, h.PN, cfg.MaxSkippedKeys, now)
	}
	if s.dhsKey == nil {
		cfg.Work.dh(1)
	}
	dhsKey, err := privateKey(s.dhsKey, s.dhsPriv)
	if err != nil {
		return nil, nil, err
	}
	cfg.Work.dh(1)
	cfg.Work.kdf(1 + int(h.N) + 2) // KDF_RK, skipped steps, this message's step and its HKDF
	rk, ckr, err := dhRatchetStep(s.rk, dhsKey, h.DH)
	if err != nil {
		return nil, nil, err
	}
	ck, skippedNew := skipKeys(ckr, h.DH, 0, h.N, cfg.MaxSkippedKeys, now)
	mk, next := kdfCK(ck)
	pt, err := open(mk, h.Salt, env.Ciphertext, ad)
	wipe(mk[:])
	if err != nil {
		return nil, nil, err
	}
	ns := *s
	if s.hasDHr && s.hasCKr {
		end := max(s.nr, h.PN)
		chains := make([]oldChain, 0, len(s.oldChains)+1)
		if drop := len(s.oldChains) + 1 - cfg.MaxOldChains; drop > 0 {
			chains = append(chains, s.oldChains[drop:]...)
		} else {
			chains = append(chains, s.oldChains...)
		}
		ns.oldChains = append(chains, oldChain{dh: s.dhr, end: end})
	}
	ns.dhsKey = dhsKey
	ns.rk, ns.dhr, ns.hasDHr = rk, h.DH, true
	ns.ckr, ns.hasCKr, ns.nr = next, true, h.N+1
	ns.needSendRatchet = true
	ns.skipped = appendSkipped(s.skipped, append(skippedOld, skippedNew...), cfg.MaxSkippedKeys)
	return &ns, pt, nil
}

// encrypt is RatchetEncrypt (DR §3.4) on an immutable session, preceded by
// the deferred sending half of DHRatchet when a new remote key arrived.
func (s *session) encrypt(plaintext []byte, legacy bool) (*session, []byte, error) {
	ns := *s
	if ns.needSendRatchet || !ns.hasCKs {
		if !ns.hasDHr {
			return nil, nil, fmt.Errorf("%w: session has no remote ratchet key", ErrUnknownSession)
		}
		key, priv, pub, err := newX25519()
		if err != nil {
			return nil, nil, err
		}
		rk, cks, err := dhRatchetStep(ns.rk, key, ns.dhr)
		if err != nil {
			return nil, nil, err
		}
		ns.dhsKey, ns.dhsPriv, ns.dhsPub = key, priv, pub
		ns.rk, ns.cks, ns.hasCKs = rk, cks, true
		ns.pn, ns.ns = ns.ns, 0
		ns.needSendRatchet = false
	}
	if ns.ns == math.MaxUint32 {
		return nil, nil, ErrChainExhausted
	}
	mk, next := kdfCK(ns.cks)
	defer wipe(mk[:])
	hdr := messages.RatchetHeader{Session: ns.id, DH: ns.dhsPub, PN: ns.pn, N: ns.ns}
	if !legacy || ns.peerSalted {
		salt, err := ns.salt(mk, &hdr, plaintext)
		if err != nil {
			return nil, nil, err
		}
		hdr.Salt = &salt
	}
	hdrEnc, err := messages.EncodeRatchetHeader(&hdr)
	if err != nil {
		return nil, nil, err
	}
	ad := associatedData(hdrEnc, ns.pendingEnc, ns.local, ns.remote)
	ct, err := seal(mk, hdr.Salt, plaintext, ad)
	if err != nil {
		return nil, nil, err
	}
	env, err := messages.EncodeEnvelope(&messages.Envelope{Header: hdr, Initiation: ns.pending, Ciphertext: ct})
	if err != nil {
		return nil, nil, err
	}
	ns.cks, ns.ns = next, ns.ns+1
	return &ns, env, nil
}

// salt is the hedged salt of a version-2 envelope with header hdr (its
// Salt unset) and plaintext under message key mk (salt.go).
func (s *session) salt(mk [32]byte, hdr *messages.RatchetHeader, plaintext []byte) ([32]byte, error) {
	var r, zero [messages.HeaderSaltSize]byte
	if err := saltRandom(r[:]); err != nil {
		return zero, err
	}
	h0 := *hdr
	h0.Salt = &zero
	hdrEnc, err := messages.EncodeRatchetHeader(&h0)
	if err != nil {
		return zero, err
	}
	salt, err := messageSalt(mk, r, associatedData(hdrEnc, s.pendingEnc, s.local, s.remote), plaintext)
	clear(r[:])
	return salt, err
}
