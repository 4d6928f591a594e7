package sealed

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/syncmesh/syncmesh/messages"
)

// FormatVersion is the first byte of every sealed record.
const FormatVersion = 1

// Sizes of the sealed format.
const (
	KeySize    = 32
	KeyIDSize  = 4
	NonceSize  = 12
	TagSize    = 16
	HeaderSize = 1 + KeyIDSize
	// Overhead is the number of bytes a sealed record adds to its plaintext.
	Overhead = HeaderSize + NonceSize + TagSize
)

const (
	keyIDDomain = "syncmesh-storage-key-id"
	adDomain    = "syncmesh-sealed-v1"
)

// Key is a 32-byte AES-256 storage key.
type Key [KeySize]byte

// ID returns the key id stored in records sealed under k:
// SHA-256("syncmesh-storage-key-id" || k)[0:4].
func (k Key) ID() [KeyIDSize]byte {
	h := sha256.New()
	h.Write([]byte(keyIDDomain))
	h.Write(k[:])
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	var id [KeyIDSize]byte
	copy(id[:], sum[:KeyIDSize])
	return id
}

func (k Key) isZero() bool {
	var z Key
	return subtle.ConstantTimeCompare(k[:], z[:]) == 1
}

type keyEntry struct {
	id   [KeyIDSize]byte
	aead cipher.AEAD
}

// Sealer seals records under a current storage key and opens records under
// the current key or any older key it was given. It implements
// persistence.Sealer and persistence.KeyRotator (checked by the stores'
// tests: this package imports nothing above messages). A Sealer is
// immutable and safe for concurrent use.
type Sealer struct {
	current keyEntry
	keys    []keyEntry // current first; looked up by key id
	rand    io.Reader
}

// New returns a Sealer that seals under current and opens records under
// current or any of older (key rotation). Repeated identical keys are
// ignored; distinct keys sharing a key id fail with ErrKeyIDCollision, and
// an all-zero key with ErrZeroKey.
func New(current Key, older ...Key) (*Sealer, error) {
	s := &Sealer{rand: rand.Reader}
	seen := make(map[[KeyIDSize]byte]Key, 1+len(older))
	for i, k := range append([]Key{current}, older...) {
		if k.isZero() {
			return nil, fmt.Errorf("%w (key %d)", ErrZeroKey, i)
		}
		id := k.ID()
		if prev, ok := seen[id]; ok {
			if prev == k {
				continue
			}
			return nil, fmt.Errorf("%w: %x", ErrKeyIDCollision, id)
		}
		seen[id] = k
		block, err := aes.NewCipher(k[:])
		if err != nil {
			return nil, fmt.Errorf("sealed: %w", err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("sealed: %w", err)
		}
		s.keys = append(s.keys, keyEntry{id: id, aead: aead})
	}
	s.current = s.keys[0]
	return s, nil
}

// CurrentKeyID returns the key id of the current key.
func (s *Sealer) CurrentKeyID() [KeyIDSize]byte {
	if s == nil {
		return [KeyIDSize]byte{}
	}
	return s.current.id
}

// associatedData appends "syncmesh-sealed-v1" | type:u8 | u32be(len) |
// identity to dst.
func associatedData(dst []byte, t messages.RecordType, identity []byte) ([]byte, error) {
	if uint64(len(identity)) > math.MaxUint32 {
		return nil, ErrIdentityTooLong
	}
	dst = append(dst, adDomain...)
	dst = append(dst, byte(t))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(identity)))
	return append(dst, identity...), nil
}

// adSize is the length of associatedData's output for identity (0 when
// it fails: the identity is too long). Seal and Open build the associated
// data in spare room of the buffer they allocate anyway, past the bytes
// the AEAD writes: a buffer of its own escapes to the heap (the AEAD is an
// interface), one allocation per record.
func adSize(identity []byte) int {
	if uint64(len(identity)) > math.MaxUint32 {
		return 0
	}
	return len(adDomain) + 1 + 4 + len(identity)
}

// Seal encrypts plaintext as a record of type t for the row identified by
// identity, under the current key with a fresh random nonce.
func (s *Sealer) Seal(t messages.RecordType, identity, plaintext []byte) ([]byte, error) {
	if s == nil {
		return nil, ErrNilSealer
	}
	out, err := newRecord(s.current.id, len(plaintext), adSize(identity))
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(s.rand, out[HeaderSize:]); err != nil {
		return nil, fmt.Errorf("sealed: reading nonce: %w", err)
	}
	return s.sealInto(out, t, identity, plaintext)
}

// sealWithNonce is Seal with a caller-chosen nonce; only tests (frozen
// vectors) call it. Reusing a nonce under one key breaks GCM.
func (s *Sealer) sealWithNonce(t messages.RecordType, identity, plaintext []byte, nonce [NonceSize]byte) ([]byte, error) {
	out, err := newRecord(s.current.id, len(plaintext), adSize(identity))
	if err != nil {
		return nil, err
	}
	copy(out[HeaderSize:], nonce[:])
	return s.sealInto(out, t, identity, plaintext)
}

// newRecord returns header | (room for the nonce), with capacity for the
// whole record of an n-byte plaintext and, past it, ad bytes of associated
// data (sealInto).
func newRecord(id [KeyIDSize]byte, n, ad int) ([]byte, error) {
	if n > math.MaxInt-Overhead-ad {
		return nil, fmt.Errorf("sealed: plaintext too long")
	}
	out := make([]byte, HeaderSize+NonceSize, Overhead+n+ad)
	out[0] = FormatVersion
	copy(out[1:HeaderSize], id[:])
	return out, nil
}

// sealInto appends ciphertext and tag to out = header | nonce. The
// associated data goes past the record's end, in room newRecord left
// (adSize); the record returned ends at its last byte, capacity too.
func (s *Sealer) sealInto(out []byte, t messages.RecordType, identity, plaintext []byte) ([]byte, error) {
	end := len(out) + len(plaintext) + TagSize
	ad, err := associatedData(out[end:end], t, identity)
	if err != nil {
		return nil, err
	}
	return s.current.aead.Seal(out, out[HeaderSize:HeaderSize+NonceSize], plaintext, ad)[:end:end], nil
}

// Open authenticates and decrypts a record sealed as type t for identity.
// Every failure is an *OpenError matching ErrOpen (a store maps it to its
// own corrupt-record error). The returned plaintext never aliases sealed.
func (s *Sealer) Open(t messages.RecordType, identity, sealed []byte) ([]byte, error) {
	if s == nil {
		return nil, ErrNilSealer
	}
	if len(sealed) < Overhead {
		return nil, &OpenError{Type: t, Reason: ReasonTooShort}
	}
	var id [KeyIDSize]byte
	copy(id[:], sealed[1:HeaderSize])
	if sealed[0] != FormatVersion {
		return nil, &OpenError{Type: t, Reason: ReasonVersion, KeyID: id}
	}
	var aead cipher.AEAD
	for i := range s.keys {
		if s.keys[i].id == id {
			aead = s.keys[i].aead
			break
		}
	}
	if aead == nil {
		return nil, &OpenError{Type: t, Reason: ReasonUnknownKey, KeyID: id}
	}
	// The plaintext's buffer, with the associated data past its end (see
	// adSize); the plaintext returned ends at its last byte, capacity too.
	n := len(sealed) - Overhead
	buf := make([]byte, n, n+adSize(identity))
	ad, err := associatedData(buf[n:n], t, identity)
	if err != nil {
		return nil, &OpenError{Type: t, Reason: ReasonAuth, KeyID: id}
	}
	nonce := sealed[HeaderSize : HeaderSize+NonceSize]
	pt, err := aead.Open(buf[:0], nonce, sealed[HeaderSize+NonceSize:], ad)
	if err != nil {
		return nil, &OpenError{Type: t, Reason: ReasonAuth, KeyID: id}
	}
	return pt[:n:n], nil
}

// IsCurrent reports whether sealed carries the current format version and
// the current key's id. It reads only the header: a damaged record under
// the current key still reports true and fails in Open. A store's reseal
// pass re-seals every record for which it is false.
func (s *Sealer) IsCurrent(sealed []byte) bool {
	if s == nil || len(sealed) < HeaderSize || sealed[0] != FormatVersion {
		return false
	}
	return bytes.Equal(sealed[1:HeaderSize], s.current.id[:])
}

// Identity encodes the parts of a row identity, each prefixed by its u32
// big-endian length, so ("ab","c") and ("a","bc") differ. Parts longer than
// 2^32-1 bytes make the result unusable (Seal rejects identities that
// long long before); they are not expected.
func Identity(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += 4 + len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = binary.BigEndian.AppendUint32(out, uint32(len(p)))
		out = append(out, p...)
	}
	return out
}

// EventIdentity is the identity of a RecordEvent: the event id.
func EventIdentity(eventID []byte) []byte { return Identity(eventID) }

// NodeKeyIdentity is the identity of the RecordNodeKey record: "node".
func NodeKeyIdentity() []byte { return Identity([]byte("node")) }

// SessionIdentity is the identity of a RecordSession: peer user, peer device.
func SessionIdentity(user, device []byte) []byte { return Identity(user, device) }

// PrekeyIdentity is the identity of a RecordPrekey: the prekey id.
func PrekeyIdentity(prekeyID []byte) []byte { return Identity(prekeyID) }

// DeviceIdentity is the identity of the RecordIdentity record: "device".
func DeviceIdentity() []byte { return Identity([]byte("device")) }

// PinIdentity is the identity of a RecordPin: peer user, peer device. The
// address in the associated data makes a pin copied to another device's
// row fail to open.
func PinIdentity(user, device []byte) []byte { return Identity(user, device) }

// MessageIdentity is the identity of a RecordOutboundBody (recipient user,
// device, logical id) and of RecordPendingFrame, RecordProcessedDigest and
// RecordProcessedEntry (sender user, device, logical id; docs/protocol.md,
// commit boundary, Storage).
func MessageIdentity(user, device, logicalID []byte) []byte {
	return Identity(user, device, logicalID)
}
