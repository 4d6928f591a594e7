package sign

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"sort"

	"filippo.io/edwards25519"
	"github.com/zeebo/blake3"

	"github.com/syncmesh/syncmesh/messages"
)

// MaxKidLen is the longest kid a keyring accepts.
const MaxKidLen = 64

// kidLen is the length of a kid derived by KidFor.
const kidLen = 16

// KidFor derives a key id from an Ed25519 public key: the first 16 bytes of
// BLAKE3-256(pub).
func KidFor(pub ed25519.PublicKey) []byte {
	sum := blake3.Sum256(pub)
	return append([]byte(nil), sum[:kidLen]...)
}

// Key is one trusted signing key of the mesh (docs/protocol.md, "Keyring").
type Key struct {
	// Kid is the key id carried in the protected header (1..MaxKidLen bytes).
	Kid []byte
	// Site is the site whose events this key signs.
	Site messages.SiteID
	// PublicKey is the Ed25519 public key.
	PublicKey ed25519.PublicKey
	// Cutoff is the retirement cutoff: an event signed by this key with an
	// HLC above it fails verification (SSP/1 §12 step 1). Zero means the key
	// is not retired.
	Cutoff messages.HLC
}

func (k Key) clone() Key {
	k.Kid = bytes.Clone(k.Kid)
	k.PublicKey = ed25519.PublicKey(bytes.Clone(k.PublicKey))
	return k
}

func (k Key) validate() error {
	if len(k.Kid) == 0 || len(k.Kid) > MaxKidLen {
		return fmt.Errorf("%w: kid must be 1..%d bytes, got %d", ErrInvalidKey, MaxKidLen, len(k.Kid))
	}
	if len(k.PublicKey) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: Ed25519 public key must be %d bytes, got %d", ErrInvalidKey, ed25519.PublicKeySize, len(k.PublicKey))
	}
	// Under the cofactored ZIP-215 equation [8][k]A vanishes for a key of
	// small order, whatever k: anyone could sign anything as that key.
	// (Under the cofactorless one a forger needs about 8 tries.) No honest
	// key is one: RFC 8032 keys are multiples of the base point.
	if a, err := new(edwards25519.Point).SetBytes(k.PublicKey); err == nil && isSmallOrder(a) {
		return fmt.Errorf("%w: %w: %x", ErrInvalidKey, ErrSmallOrderKey, []byte(k.PublicKey))
	}
	return nil
}

// Keyring maps kids to trusted keys. A Keyring is an immutable snapshot:
// any number of goroutines may read it concurrently, and updates (With)
// return a new Keyring, leaving the old one unchanged (copy-on-write).
// The zero value and nil are empty keyrings.
type Keyring struct {
	keys map[string]entry // by string(kid); entries are private copies
}

// entry is a trusted key and its decoded verification key.
type entry struct {
	Key
	vk *verifyKey
}

func newEntry(k Key) entry {
	k = k.clone()
	return entry{Key: k, vk: newVerifyKey(k.PublicKey)}
}

// NewKeyring returns a keyring holding keys. It fails with ErrInvalidKey on
// a key of the wrong size, a public key of small order (also
// ErrSmallOrderKey), an empty or over-long kid, or a kid given twice.
func NewKeyring(keys ...Key) (*Keyring, error) {
	kr := &Keyring{keys: make(map[string]entry, len(keys))}
	for _, k := range keys {
		if err := k.validate(); err != nil {
			return nil, err
		}
		if _, dup := kr.keys[string(k.Kid)]; dup {
			return nil, fmt.Errorf("%w: duplicate kid %x", ErrInvalidKey, k.Kid)
		}
		kr.keys[string(k.Kid)] = newEntry(k)
	}
	return kr, nil
}

// With returns a new keyring holding k's keys plus key, replacing any key
// with the same kid (for example to set a retirement cutoff). k is
// unchanged. It refuses the keys NewKeyring refuses.
func (k *Keyring) With(key Key) (*Keyring, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	var old map[string]entry
	if k != nil {
		old = k.keys
	}
	next := &Keyring{keys: make(map[string]entry, len(old)+1)}
	for kid, e := range old {
		next.keys[kid] = e
	}
	next.keys[string(key.Kid)] = newEntry(key)
	return next, nil
}

// Lookup returns a copy of the key with the given kid.
func (k *Keyring) Lookup(kid []byte) (Key, bool) {
	e, ok := k.lookup(kid)
	if !ok {
		return Key{}, false
	}
	return e.Key.clone(), true
}

// lookup returns the shared entry; callers must not modify it.
func (k *Keyring) lookup(kid []byte) (entry, bool) {
	if k == nil {
		return entry{}, false
	}
	e, ok := k.keys[string(kid)]
	return e, ok
}

// Keys returns copies of all keys, sorted by kid.
func (k *Keyring) Keys() []Key {
	if k == nil {
		return nil
	}
	out := make([]Key, 0, len(k.keys))
	for _, e := range k.keys {
		out = append(out, e.Key.clone())
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Kid, out[j].Kid) < 0 })
	return out
}

// Len returns the number of keys.
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.keys)
}
