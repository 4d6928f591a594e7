package ratchet

import (
	"bytes"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// keystream returns ciphertext ⊕ plaintext over the plaintext's length:
// the AES-GCM keystream, which is the same for two encryptions exactly
// when they used the same key and nonce.
func keystream(t *testing.T, env, pt []byte) (messages.RatchetHeader, []byte) {
	t.Helper()
	e, err := messages.DecodeEnvelope(env)
	if err != nil {
		t.Fatal(err)
	}
	ks := make([]byte, len(pt))
	for i := range pt {
		ks[i] = e.Ciphertext[i] ^ pt[i]
	}
	return e.Header, ks
}

// TestRollbackDoesNotReuseKeyAndNonce is the rollback attack on a sender's
// stored session state: take a copy of the record, encrypt X, put the copy
// back (a restored backup, a VM snapshot), encrypt Y. Both encryptions sit
// at the same chain position, so under the same message key; they must
// not share the AES-GCM key and nonce (with a shared pair, the XOR of the
// ciphertexts is the XOR of the plaintexts). Both on an acknowledged
// session and on our own unanswered initiation.
func TestRollbackDoesNotReuseKeyAndNonce(t *testing.T) {
	cfg := DefaultConfig()
	x := []byte("attack at dawn, bring the keys!!")
	y := []byte("retreat at dusk, burn the maps!!")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (a, b *device)
	}{
		{"acknowledged session", func(t *testing.T) (a, b *device) {
			a, b = established(t, cfg)
			b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("warm")), nil) // a's sending chain exists now
			return a, b
		}},
		{"unanswered initiation", func(t *testing.T) (a, b *device) {
			a, b = newDevice(t, "alice"), newDevice(t, "bob")
			a.initiate(t, cfg, b)
			return a, b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.setup(t)
			saved := a.recs[b.name]
			envX := a.send(t, cfg, b, x)
			a.recs[b.name] = saved // the restore
			envY := a.send(t, cfg, b, y)
			hx, ksX := keystream(t, envX, x)
			hy, ksY := keystream(t, envY, y)
			if hx.DH != hy.DH || hx.N != hy.N || hx.PN != hy.PN {
				t.Fatalf("setup: the two encryptions are not at one chain position (%d/%d)", hx.N, hy.N)
			}
			if bytes.Equal(ksX, ksY) {
				t.Fatalf("rolled-back sender reused the AES-GCM key and nonce: ciphertext(X) xor ciphertext(Y) = X xor Y (chain position %d)", hx.N)
			}
			// The receiver still reads the first; the second is a replay
			// of that chain position (healing it is the session layer's job).
			b.mustRecv(t, cfg, a, envX, x)
		})
	}
}
