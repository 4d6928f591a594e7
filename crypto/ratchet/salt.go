package ratchet

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/messages"
)

// Envelope version 2 (docs/protocol.md, "Envelope version 2"): a sender
// whose stored state was rolled back (a restored backup, a VM snapshot) or
// copied (a clone running beside its original) derives the same message
// key MK again for the same chain position. Version 1 derived the AES-GCM
// key and nonce from MK alone, so two different plaintexts went out under
// one (key, nonce). Version 2 carries a per-message salt in the header and
// derives the key and nonce from (MK, salt):
//
//	R     = 32 bytes from crypto/rand
//	ad0   = associated data with the header's salt set to 32 zero bytes
//	d     = SHA-256(infoSaltDigest || u64be(len(ad0)) || ad0 || plaintext)
//	salt  = HMAC-SHA256(MK, R || d)
//	key || nonce = HKDF-SHA256(ikm = MK, salt = salt, info = infoMessageSalted)  (32 + 12 bytes)
//
// The salt is hedged: with a working random source every encryption gets
// a fresh salt; with a repeated one (a cloned VM's generator state) the
// salt still differs whenever the plaintext or the associated data does,
// so a (key, nonce) pair can only repeat for byte-identical envelopes.
// Keying it with MK keeps it from being a plaintext hash anyone can test
// guesses against. The receiver reads the salt from the header (which is
// in the associated data) and needs neither R nor d.
const (
	infoMessageSalted = "syncmesh_Ratchet_Message_v2"
	infoSaltDigest    = "syncmesh_Ratchet_Salt_v2"
)

// saltRandom fills the R of one salted encryption. Tests replace it to
// compute frozen vectors; nothing else does.
var saltRandom = func(b []byte) error {
	_, err := rand.Read(b)
	return err
}

// sealObserver, when set, is called with the AES-GCM key and nonce of every
// ratchet encryption (both envelope versions) before it seals: the hook a
// restore-and-clone soak uses to assert that no pair is ever used twice.
// Set only by tests (export_test.go, or ObserveSeals under the
// syncmesh_aeadtrace build tag).
var sealObserver atomic.Pointer[func(key [32]byte, nonce [12]byte)]

func observeSeal(key []byte, nonce [12]byte) {
	if f := sealObserver.Load(); f != nil {
		var k [32]byte
		copy(k[:], key)
		(*f)(k, nonce)
		clear(k[:])
	}
}

// messageSalt is the hedged salt of one version-2 encryption.
func messageSalt(mk, r [32]byte, ad0, plaintext []byte) (salt [32]byte, err error) {
	h := sha256.New()
	h.Write([]byte(infoSaltDigest))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(ad0)))
	h.Write(n[:])
	h.Write(ad0)
	h.Write(plaintext)
	var m [64]byte
	copy(m[:32], r[:])
	h.Sum(m[32:32])
	salt, err = hmacSHA256(mk[:], m[:])
	clear(m[:])
	return salt, err
}

// messageKeyNonce derives the AES-256-GCM key and nonce of message key mk:
// version 1 (salt nil) HKDF-SHA256 with a zero salt and infoMessage,
// version 2 HKDF-SHA256 with the header's salt and infoMessageSalted.
func messageKeyNonce(mk [32]byte, salt *[messages.HeaderSaltSize]byte) (okm [32 + 12]byte, err error) {
	if salt == nil {
		var zero [32]byte
		err = hkdfSHA256(okm[:], mk[:], zero[:], infoMessage)
		return okm, err
	}
	err = hkdfSHA256(okm[:], mk[:], salt[:], infoMessageSalted)
	return okm, err
}

// messageAEAD returns the AES-256-GCM instance and nonce of message key mk
// under an envelope's salt (nil: version 1).
func messageAEAD(mk [32]byte, salt *[messages.HeaderSaltSize]byte, sealing bool) (cipher.AEAD, [12]byte, error) {
	okm, err := messageKeyNonce(mk, salt)
	defer clear(okm[:])
	var nonce [12]byte
	if err != nil {
		return nil, nonce, err
	}
	copy(nonce[:], okm[32:])
	block, err := aes.NewCipher(okm[:32])
	if err != nil {
		return nil, nonce, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, nonce, err
	}
	if sealing {
		observeSeal(okm[:32], nonce)
	}
	return aead, nonce, nil
}
