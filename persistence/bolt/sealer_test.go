package bolt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/persistence"
)

// testSealer is an AES-256-GCM sealer for tests (crypto/sealed is the real
// one): sealed = key id | nonce | ciphertext, associated data = type |
// identity. It holds several keys and implements persistence.KeyRotator.
type testSealer struct {
	keys    map[byte]cipher.AEAD
	current byte
	opened  atomic.Int64 // Open calls, to prove the sealed path ran
}

var _ persistence.KeyRotator = (*testSealer)(nil)

func newTestSealer(current byte, ids ...byte) *testSealer {
	s := &testSealer{keys: map[byte]cipher.AEAD{}, current: current}
	for _, id := range append(ids, current) {
		var k [32]byte
		for i := range k {
			k[i] = id ^ byte(i)
		}
		b, err := aes.NewCipher(k[:])
		if err != nil {
			panic(err)
		}
		g, err := cipher.NewGCM(b)
		if err != nil {
			panic(err)
		}
		s.keys[id] = g
	}
	return s
}

func ad(t persistence.RecordType, identity []byte) []byte {
	return append([]byte{byte(t)}, identity...)
}

func (s *testSealer) Seal(t persistence.RecordType, identity, plaintext []byte) ([]byte, error) {
	g := s.keys[s.current]
	out := make([]byte, 1+g.NonceSize(), 1+g.NonceSize()+len(plaintext)+g.Overhead())
	out[0] = s.current
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	return g.Seal(out, out[1:], plaintext, ad(t, identity)), nil
}

func (s *testSealer) Open(t persistence.RecordType, identity, sealed []byte) ([]byte, error) {
	s.opened.Add(1)
	if len(sealed) < 1 {
		return nil, fmt.Errorf("test sealer: empty record: %w", persistence.ErrCorrupt)
	}
	g, ok := s.keys[sealed[0]]
	if !ok || len(sealed) < 1+g.NonceSize() {
		return nil, fmt.Errorf("test sealer: unknown key or short record: %w", persistence.ErrCorrupt)
	}
	p, err := g.Open(nil, sealed[1:1+g.NonceSize()], sealed[1+g.NonceSize():], ad(t, identity))
	if err != nil {
		return nil, fmt.Errorf("test sealer: %w: %w", persistence.ErrCorrupt, err)
	}
	return p, nil
}

func (s *testSealer) IsCurrent(sealed []byte) bool { return len(sealed) > 0 && sealed[0] == s.current }
