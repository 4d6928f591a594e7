package ratchet

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/mlkem"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// InfoPQXDH is the HKDF info string of the PQXDH key derivation (PQXDH
// §2.2: application name, curve, hash and KEM).
const InfoPQXDH = "syncmesh_PQXDH_CURVE25519_SHA-256_ML-KEM-768"

// sessionIDContext names the version-2 initiation the id hashes (its
// addresses and signature included).
const sessionIDContext = "syncmesh-ratchet-session-v2"

// SessionIDOf returns the id of the session an initiation creates:
// SHA-256(sessionIDContext || canonical encoding of the initiation).
func SessionIDOf(in *messages.PrekeyInitiation) (SessionID, error) {
	b, err := messages.EncodePrekeyInitiation(in)
	if err != nil {
		return SessionID{}, err
	}
	return sessionIDOfEncoded(b), nil
}

func sessionIDOfEncoded(b []byte) SessionID {
	h := sha256.New()
	h.Write([]byte(sessionIDContext))
	h.Write(b)
	var id SessionID
	h.Sum(id[:0])
	return id
}

// x25519 computes DH(priv, pub); a degenerate (all-zero) output is an
// authentication failure (RFC 7748 §6.1).
func x25519(sk *ecdh.PrivateKey, pub [32]byte) ([]byte, error) {
	pk, err := ecdh.X25519().NewPublicKey(pub[:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	out, err := sk.ECDH(pk)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	return out, nil
}

func newX25519() (key *ecdh.PrivateKey, priv, pub [32]byte, err error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, priv, pub, err
	}
	copy(priv[:], k.Bytes())
	copy(pub[:], k.PublicKey().Bytes())
	return k, priv, pub, nil
}

// privateKey returns the key object for raw scalar priv, reusing cached
// when set (crypto/ecdh computes the public key eagerly, one scalar
// multiplication per construction).
func privateKey(cached *ecdh.PrivateKey, priv [32]byte) (*ecdh.PrivateKey, error) {
	if cached != nil {
		return cached, nil
	}
	return ecdh.X25519().NewPrivateKey(priv[:])
}

// kemEncapsulationKey parses a peer's ML-KEM-768 encapsulation key with
// FIPS 203 §7.2's input checks (length, every coefficient reduced modulo
// q): a bundle's KEM prekey passes here before anything is encapsulated
// to it.
func kemEncapsulationKey(pub []byte) (*mlkem.EncapsulationKey768, error) {
	return mlkem.NewEncapsulationKey768(pub)
}

// kemDecapsulate is ML-KEM-768.Decaps (FIPS 203 §7.3) under the
// decapsulation key stored as its 64-byte seed (d || z). A ciphertext of
// the wrong length is ErrTampered; a wrong ciphertext of the right length
// yields the implicit-rejection key, which then fails the AEAD.
func kemDecapsulate(seed, ct []byte) ([]byte, error) {
	dk, err := mlkem.NewDecapsulationKey768(seed)
	if err != nil {
		return nil, err
	}
	ss, err := dk.Decapsulate(ct)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTampered, err)
	}
	return ss, nil
}

// pqxdhKDF derives SK from the concatenated DH outputs and the KEM shared
// secret (PQXDH §2.2 and §3.3): HKDF-SHA256 with F = 32 0xFF bytes
// prepended, a zero salt of hash length and info InfoPQXDH.
func pqxdhKDF(dhs [][]byte, ss []byte) ([32]byte, error) {
	km := make([]byte, 0, 32*(len(dhs)+2))
	for range 32 {
		km = append(km, 0xFF)
	}
	for _, d := range dhs {
		km = append(km, d...)
	}
	km = append(km, ss...)
	var salt [32]byte
	okm, err := hkdf.Key(sha256.New, km, salt[:], InfoPQXDH, 32)
	wipe(km)
	var sk [32]byte
	if err != nil {
		return sk, err
	}
	copy(sk[:], okm)
	wipe(okm)
	return sk, nil
}

type dhPair struct {
	priv *ecdh.PrivateKey
	pub  [32]byte
}

func wipeAll(bs [][]byte) {
	for _, b := range bs {
		wipe(b)
	}
}

// initiatorAgreement runs the sending side of PQXDH (§3.3) against bundle b
// and returns SK and the initiation block to attach.
func initiatorAgreement(local Identity, b *messages.PrekeyBundle, route Route) ([32]byte, *messages.PrekeyInitiation, error) {
	var sk [32]byte
	if err := VerifyBundle(b); err != nil {
		return sk, nil, err
	}
	ek, err := kemEncapsulationKey(b.KEMPrekey.Public)
	if err != nil {
		return sk, nil, fmt.Errorf("ratchet: bundle KEM prekey: %w", err)
	}
	eKey, ePriv, ePub, err := newX25519()
	if err != nil {
		return sk, nil, err
	}
	wipe(ePriv[:])
	ik, err := local.dhKey()
	if err != nil {
		return sk, nil, err
	}
	pairs := []dhPair{
		{ik, b.SignedPrekey.Public},   // DH1 = DH(IK_A, SPK_B)
		{eKey, b.Identity.DH},         // DH2 = DH(EK_A, IK_B)
		{eKey, b.SignedPrekey.Public}, // DH3 = DH(EK_A, SPK_B)
	}
	in := &messages.PrekeyInitiation{
		Identity: local.pub, Ephemeral: ePub,
		SignedPrekeyID: b.SignedPrekey.ID, KEMPrekeyID: b.KEMPrekey.ID,
		From: route.From, To: route.To,
	}
	if o := b.OneTimePrekey; o != nil {
		pairs = append(pairs, dhPair{eKey, o.Public}) // DH4 = DH(EK_A, OPK_B)
		id := o.ID
		in.OneTimePrekeyID = &id
	}
	var dhs [][]byte
	defer func() { wipeAll(dhs) }()
	for _, p := range pairs {
		d, err := x25519(p.priv, p.pub)
		if err != nil {
			return sk, nil, fmt.Errorf("ratchet: bundle key: %w", err)
		}
		dhs = append(dhs, d)
	}
	ss, ct := ek.Encapsulate()
	defer wipe(ss)
	in.KEMCiphertext = ct
	msg, err := initiationSigningMessage(in)
	if err != nil {
		return sk, nil, err
	}
	in.Signature = local.sign(msg)
	sk, err = pqxdhKDF(dhs, ss)
	return sk, in, err
}

// responderAgreement runs the receiving side of PQXDH (§3.4): it looks up
// the named prekeys (ErrUnknownPrekey when one is missing, expired or
// consumed) and returns SK and the signed prekey (the responder's first
// ratchet key pair, DR §3.3 / X3DH §3.3). Consuming the one-time prekey is
// PrekeyStore.Accept's job.
func responderAgreement(local Identity, store PrekeyStore, in *messages.PrekeyInitiation, now time.Time, w *Work) ([32]byte, signedKey, error) {
	var sk [32]byte
	spk, err := store.lookupSigned(in.SignedPrekeyID, now)
	if err != nil {
		return sk, signedKey{}, err
	}
	kk, err := store.lookupKEM(in.KEMPrekeyID, now)
	if err != nil {
		return sk, signedKey{}, err
	}
	if spk.key == nil {
		w.dh(1)
	}
	spkKey, err := privateKey(spk.key, spk.priv)
	if err != nil {
		return sk, signedKey{}, err
	}
	spk.key = spkKey
	ik, err := local.dhKey()
	if err != nil {
		return sk, signedKey{}, err
	}
	pairs := []dhPair{
		{spkKey, in.Identity.DH}, // DH1
		{ik, in.Ephemeral},       // DH2
		{spkKey, in.Ephemeral},   // DH3
	}
	if in.OneTimePrekeyID != nil {
		_, ot, err := store.takeOneTime(*in.OneTimePrekeyID)
		if err != nil {
			return sk, signedKey{}, err
		}
		w.dh(1)
		otKey, err := privateKey(nil, ot.priv)
		if err != nil {
			return sk, signedKey{}, err
		}
		pairs = append(pairs, dhPair{otKey, in.Ephemeral}) // DH4
	}
	var dhs [][]byte
	defer func() { wipeAll(dhs) }()
	for _, p := range pairs {
		w.dh(1)
		d, err := x25519(p.priv, p.pub)
		if err != nil {
			return sk, signedKey{}, err
		}
		dhs = append(dhs, d)
	}
	w.kem()
	ss, err := kemDecapsulate(kk.seed[:], in.KEMCiphertext)
	if err != nil {
		return sk, signedKey{}, err
	}
	defer wipe(ss)
	w.kdf(1)
	sk, err = pqxdhKDF(dhs, ss)
	if err != nil {
		return sk, signedKey{}, err
	}
	return sk, spk, nil
}
