// Package digest implements ApplicationMessageDigest v1, the local storage
// construction that a processed inbound entry keeps of the committed body
// (docs/protocol.md, commit boundary, "Same logical ID, other body"). It is never
// sent on the wire.
//
// Construction (exact, frozen; docs/protocol.md, "Processed-message digest"):
//
//	SHA-256( u32be(len(domain)) | domain | u32be(len(body)) | body )
//	domain = "KSecureMessage-ProcessedMessage-v1"
//
// The stored form, sealed as record type 12 (persistence.RecordProcessedDigest),
// is version:u8 = 1 | digest[32] (docs/protocol.md, commit boundary, Storage).
package digest

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
)

// Version is the ApplicationMessageDigest construction version, also the
// first byte of the stored form.
const Version = 1

// Size is the length of a digest in bytes.
const Size = sha256.Size

// StoredSize is the length of the stored form: version byte plus digest.
const StoredSize = 1 + Size

// domain is the v1 domain-separation string; it must never change, the
// frozen vectors depend on it (docs/protocol.md, "Processed-message digest").
const domain = "KSecureMessage-ProcessedMessage-v1"

// StoredError describes why a stored digest was rejected. It matches
// ErrStored via errors.Is.
type StoredError struct {
	// Length is the length of the input.
	Length int
	// Version is the version byte found (0 when the input is empty).
	Version byte
	// Reason is a short human-readable cause.
	Reason string
}

// Error implements error.
func (e *StoredError) Error() string {
	return fmt.Sprintf("digest: invalid stored digest (%s; length %d, version %d)", e.Reason, e.Length, e.Version)
}

// Is reports whether target is ErrStored.
func (e *StoredError) Is(target error) bool { return target == ErrStored }

// ApplicationMessage returns ApplicationMessageDigest v1 of body.
// Bodies longer than 2^32-1 bytes cannot be length-prefixed by the frozen
// construction; such bodies are far beyond any frame limit, and the length is
// truncated to its low 32 bits exactly as a u32 encoder would.
func ApplicationMessage(body []byte) [32]byte {
	h := sha256.New()
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(domain)))
	h.Write(l[:])
	h.Write([]byte(domain))
	binary.BigEndian.PutUint32(l[:], uint32(len(body)))
	h.Write(l[:])
	h.Write(body)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Equal reports whether a and b are equal, in constant time (the spec
// compares bodies and digests without timing leaks).
func Equal(a, b [32]byte) bool {
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// EncodeStored returns the stored form of d: version:u8 = 1 | digest[32].
func EncodeStored(d [32]byte) []byte {
	out := make([]byte, StoredSize)
	out[0] = Version
	copy(out[1:], d[:])
	return out
}

// DecodeStored parses the stored form produced by EncodeStored. It returns a
// *StoredError (matching ErrStored) for a wrong length or an unknown version.
func DecodeStored(b []byte) ([32]byte, error) {
	var d [32]byte
	if len(b) == 0 {
		return d, &StoredError{Length: 0, Reason: "empty"}
	}
	if b[0] != Version {
		return d, &StoredError{Length: len(b), Version: b[0], Reason: "unknown version"}
	}
	if len(b) != StoredSize {
		return d, &StoredError{Length: len(b), Version: b[0], Reason: "wrong length"}
	}
	copy(d[:], b[1:])
	return d, nil
}
