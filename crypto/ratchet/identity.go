package ratchet

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// IdentityPublic is a device's public identity (Ed25519 signing key and
// X25519 key). It is the value the layer above pins per DeviceAddress.
type IdentityPublic = messages.IdentityKey

// SessionID names a session; see SessionIDOf.
type SessionID = messages.SessionID

// Identity is a device's long-term identity key pair: an Ed25519 signing
// key (signs prekeys) and an X25519 key (PQXDH's IK). The zero value is
// not usable; create one with NewIdentity or UnmarshalIdentity.
type Identity struct {
	signSeed [ed25519.SeedSize]byte
	dhPriv   [32]byte
	dh       *ecdh.PrivateKey // immutable key object for dhPriv
	pub      IdentityPublic
}

func (id Identity) dhKey() (*ecdh.PrivateKey, error) { return privateKey(id.dh, id.dhPriv) }

// NewIdentity generates a fresh device identity.
func NewIdentity() (Identity, error) {
	var id Identity
	if _, err := rand.Read(id.signSeed[:]); err != nil {
		return Identity{}, err
	}
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return Identity{}, err
	}
	copy(id.dhPriv[:], k.Bytes())
	return id, id.derivePublic()
}

func (id *Identity) derivePublic() error {
	sk := ed25519.NewKeyFromSeed(id.signSeed[:])
	copy(id.pub.Sign[:], sk.Public().(ed25519.PublicKey))
	wipe(sk)
	k, err := ecdh.X25519().NewPrivateKey(id.dhPriv[:])
	if err != nil {
		return err
	}
	id.dh = k
	copy(id.pub.DH[:], k.PublicKey().Bytes())
	return nil
}

// Public returns the public half of the identity.
func (id Identity) Public() IdentityPublic { return id.pub }

func (id Identity) sign(msg []byte) [64]byte {
	sk := ed25519.NewKeyFromSeed(id.signSeed[:])
	var sig [64]byte
	copy(sig[:], ed25519.Sign(sk, msg))
	wipe(sk)
	return sig
}

// CheckPin compares the identity seen on a session or initiation with the
// pinned one in constant time and returns an *IdentityChangedError when
// they differ.
func CheckPin(pinned, seen IdentityPublic) error {
	if subtle.ConstantTimeCompare(pinned.Bytes(), seen.Bytes()) != 1 {
		return &IdentityChangedError{Pinned: pinned, Seen: seen}
	}
	return nil
}

// Domain-separation prefixes of prekey signatures.
const (
	sigContextSPK  = "syncmesh-pqxdh-v1 signed prekey"
	sigContextKEM  = "syncmesh-pqxdh-v1 kem prekey"
	sigContextInit = "syncmesh-pqxdh-v2 initiation"
)

// initiationSigningMessage is what the initiator's identity signs:
// context || 0x00 || the initiation's canonical encoding without the
// signature (both addresses, both identity keys, the ephemeral key, the
// prekey ids and the KEM ciphertext).
func initiationSigningMessage(in *messages.PrekeyInitiation) ([]byte, error) {
	body, err := messages.PrekeyInitiationSigningBytes(in)
	if err != nil {
		return nil, err
	}
	m := make([]byte, 0, len(sigContextInit)+1+len(body))
	m = append(m, sigContextInit...)
	m = append(m, 0)
	return append(m, body...), nil
}

// signedPrekeyMessage is what the identity key signs for a prekey:
// context || 0x00 || IK_dh || id (u32 big endian) || public key. Binding
// IK_dh keeps the two identity keys together (PQXDH §3.2 signs
// Encode(SPK); the extra fields only narrow what a signature covers).
func signedPrekeyMessage(context string, ikDH [32]byte, id uint32, pub []byte) []byte {
	m := make([]byte, 0, len(context)+1+32+4+len(pub))
	m = append(m, context...)
	m = append(m, 0)
	m = append(m, ikDH[:]...)
	m = binary.BigEndian.AppendUint32(m, id)
	return append(m, pub...)
}

// VerifyBundle checks both prekey signatures of b under its identity key
// and returns ErrBadPrekeySignature when one fails (PQXDH §3.3: "Bob's
// signatures are verified; if any fails, Alice aborts").
func VerifyBundle(b *messages.PrekeyBundle) error {
	pk := ed25519.PublicKey(b.Identity.Sign[:])
	spkMsg := signedPrekeyMessage(sigContextSPK, b.Identity.DH, b.SignedPrekey.ID, b.SignedPrekey.Public[:])
	if !ed25519.Verify(pk, spkMsg, b.SignedPrekey.Signature[:]) {
		return fmt.Errorf("%w: signed prekey %d", ErrBadPrekeySignature, b.SignedPrekey.ID)
	}
	kemMsg := signedPrekeyMessage(sigContextKEM, b.Identity.DH, b.KEMPrekey.ID, b.KEMPrekey.Public)
	if !ed25519.Verify(pk, kemMsg, b.KEMPrekey.Signature[:]) {
		return fmt.Errorf("%w: KEM prekey %d", ErrBadPrekeySignature, b.KEMPrekey.ID)
	}
	return nil
}

type wireIdentity struct {
	_        struct{} `cbor:",toarray"`
	V        uint64
	SignSeed []byte
	DHPriv   []byte
}

const identityVersion = 1

// MarshalIdentity encodes the identity's private keys for storage (seal it
// at rest; crypto/sealed).
func MarshalIdentity(id Identity) ([]byte, error) {
	return messages.Marshal(&wireIdentity{V: identityVersion, SignSeed: id.signSeed[:], DHPriv: id.dhPriv[:]})
}

// UnmarshalIdentity decodes what MarshalIdentity wrote.
func UnmarshalIdentity(b []byte) (Identity, error) {
	var w wireIdentity
	if err := messages.Unmarshal("ratchet identity", b, &w, 256); err != nil {
		return Identity{}, err
	}
	if w.V != identityVersion {
		return Identity{}, &messages.DecodeError{What: "ratchet identity", Kind: messages.ErrUnsupportedVersion, Err: fmt.Errorf("version %d", w.V)}
	}
	var id Identity
	if len(w.SignSeed) != len(id.signSeed) || len(w.DHPriv) != len(id.dhPriv) {
		return Identity{}, decodeError("ratchet identity", fmt.Errorf("wrong key sizes"))
	}
	copy(id.signSeed[:], w.SignSeed)
	copy(id.dhPriv[:], w.DHPriv)
	wipe(w.SignSeed)
	wipe(w.DHPriv)
	if err := id.derivePublic(); err != nil {
		return Identity{}, decodeError("ratchet identity", err)
	}
	return id, nil
}

// wipe zeroes b.
func wipe(b []byte) { clear(b) }
