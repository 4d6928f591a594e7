// Package sealed is syncmesh's storage cipher: it seals records at rest
// under the node's storage key (docs/protocol.md, "At rest" and commit
// boundary, "Storage") and implements persistence.Sealer and
// persistence.KeyRotator.
//
// # Format (version 1, frozen)
//
//	sealed = version:u8 (=1) | key_id[4] | nonce[12] | ciphertext | tag[16]
//	key_id = SHA-256("syncmesh-storage-key-id" || key)[0:4]
//	AD     = "syncmesh-sealed-v1" | record_type:u8 | u32be(len(identity)) | identity
//
// The AEAD is AES-256-GCM from the standard library with a fresh random
// 96-bit nonce per record. AES-GCM was chosen over XChaCha20-Poly1305
// because it needs no dependency outside the standard library, runs on
// hardware AES on every platform we target (256 B: Seal ~0.4 µs including
// the random nonce, Open ~0.3 µs on the 2-core build machine), and goes through
// Go's FIPS 140 module. Its limit: random 96-bit nonces keep the collision
// probability below 2^-32 only up to about 2^32 sealed records per key
// (NIST SP 800-38D §8.3). A node seals far fewer records than that over a key's
// life; rotate the storage key (New(newKey, oldKey) and a reseal pass,
// persistence.KeyRotator) well before approaching it.
//
// The record type and the row's identity are bound in the associated data,
// so a record copied to another row or another record type fails to open
// (docs/protocol.md, "At rest"). Every Open failure matches ErrOpen; the
// bbolt store wraps it in persistence.ErrCorrupt, so a damaged record is an
// error, never "missing". This package imports nothing above messages
// (the record type is messages.RecordType; TestCryptoImportsNothingAboveMessages).
//
// # Identities per record type
//
// Stores must build identities with the helpers below (all are Identity of
// the listed parts, each part u32be-length-prefixed), and use the same
// bytes to Seal and to Open:
//
//	RecordEvent           (1)  EventIdentity(event id)
//	RecordNodeKey         (2)  NodeKeyIdentity()              = Identity("node")
//	RecordSession         (3)  SessionIdentity(peer user, peer device)
//	RecordPrekey          (4)  PrekeyIdentity(prekey id)
//	RecordIdentity        (5)  DeviceIdentity()               = Identity("device")
//	RecordOutboundBody    (6)  MessageIdentity(recipient user, recipient device, logical id)
//	RecordPendingFrame    (11) MessageIdentity(sender user, sender device, logical id)
//	RecordProcessedDigest (12) MessageIdentity(sender user, sender device, logical id) — layouts ≤ 10
//	RecordPin             (13) PinIdentity(peer user, peer device)
//	RecordProcessedEntry  (14) MessageIdentity(sender user, sender device, logical id)
//
// Types 11, 12 and 14 share the identity of the (sender, logical id) row
// and differ by record type, so the frame and the processed entry of one
// row cannot be swapped (docs/protocol.md, commit boundary, Storage).
//
// # Keys
//
// A storage key is 32 bytes. LoadOrCreateKeyFile manages a key file
// (created 0600 on first use, refused when group/other have any
// permission); ParseKey reads a key given in configuration.
package sealed

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
)

// Errors of this package. Open failures are *OpenError values, which match
// ErrOpen via errors.Is.
var (
	// ErrOpen is matched by every failure to open a sealed record.
	ErrOpen = errors.New("sealed: cannot open record")
	// ErrZeroKey is returned for an all-zero key (almost certainly an
	// unset configuration value, never a real random key).
	ErrZeroKey = errors.New("sealed: all-zero storage key")
	// ErrKeyIDCollision is returned by New when two distinct keys share a
	// key id; Open could not tell them apart.
	ErrKeyIDCollision = errors.New("sealed: two storage keys share a key id")
	// ErrKeyFormat is returned for a key that is neither 32 raw bytes nor
	// 64 hexadecimal characters.
	ErrKeyFormat = errors.New("sealed: invalid storage key encoding")
	// ErrKeyFilePermissions is returned by LoadOrCreateKeyFile for a key
	// file that group or other may access (any of mode bits 0o077), or that
	// is not a regular file.
	ErrKeyFilePermissions = errors.New("sealed: storage key file has unsafe permissions")
	// ErrIdentityTooLong is returned by Seal for an identity longer than
	// 2^32-1 bytes (it cannot be length-prefixed).
	ErrIdentityTooLong = errors.New("sealed: identity too long")
	// ErrNilSealer is returned by the methods of a nil *Sealer.
	ErrNilSealer = errors.New("sealed: nil Sealer")
)

// OpenReason classifies an Open failure.
type OpenReason uint8

// Reasons an Open fails.
const (
	// ReasonTooShort: shorter than the header, nonce and tag.
	ReasonTooShort OpenReason = iota + 1
	// ReasonVersion: unknown format version byte.
	ReasonVersion
	// ReasonUnknownKey: no key of this Sealer has the record's key id.
	ReasonUnknownKey
	// ReasonAuth: authentication failed (damaged bytes, wrong record type or
	// identity, or a different key with a colliding key id).
	ReasonAuth
)

// String returns a short name of r.
func (r OpenReason) String() string {
	switch r {
	case ReasonTooShort:
		return "too short"
	case ReasonVersion:
		return "unknown version"
	case ReasonUnknownKey:
		return "unknown key id"
	case ReasonAuth:
		return "authentication failed"
	default:
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
}

// OpenError is the error of a failed Open. It matches ErrOpen via
// errors.Is; the stores wrap it in their corrupt-record error
// (persistence/bolt: persistence.ErrCorrupt).
type OpenError struct {
	// Type is the record type Open was asked for.
	Type messages.RecordType
	// Reason classifies the failure.
	Reason OpenReason
	// KeyID is the record's key id when the header could be read.
	KeyID [4]byte
}

// Error implements error.
func (e *OpenError) Error() string {
	return fmt.Sprintf("sealed: cannot open record of type %d: %s", uint8(e.Type), e.Reason)
}

// Unwrap returns ErrOpen, so errors.Is matches it.
func (e *OpenError) Unwrap() error { return ErrOpen }
