package ratchet

// Work counts the expensive operations of one or more Decrypt calls
// (a flood is bounded by what it makes the receiver
// compute, counted rather than timed). Set Config.Work to a Work of the
// caller's and Decrypt adds to it, whether it succeeds or fails; a Work
// is not safe for concurrent use (give each call its own and add them).
type Work struct {
	// DH counts X25519 scalar multiplications: shared secrets (PQXDH DH1–
	// DH4, DH ratchet steps) and private-key objects built from a stored
	// scalar (crypto/ecdh derives the public key at construction).
	DH uint64
	// KEM counts ML-KEM-768 decapsulations.
	KEM uint64
	// KDF counts key-derivation steps: HKDF calls (PQXDH, KDF_RK, the
	// message key's AEAD key and nonce) and chain steps (KDF_CK, skipped
	// keys included).
	KDF uint64
	// Verify counts Ed25519 signature verifications (the initiator's
	// signature).
	Verify uint64
}

// Add adds o to w.
func (w *Work) Add(o Work) {
	w.DH += o.DH
	w.KEM += o.KEM
	w.KDF += o.KDF
	w.Verify += o.Verify
}

// MaxInitiationWork is the most a prekey envelope Decrypt makes the
// responder compute under c, succeed or fail: the signature, the PQXDH
// agreement (four DH, one decapsulation, one HKDF, and the one-time and
// signed prekeys' key objects), the first DH ratchet step (its KDF_RK),
// the chain steps up to MaxUnacknowledgedJump plus the message's own and
// the message key's HKDF. TestFloodDoesNotStopAlice holds a flood to it.
func (c Config) MaxInitiationWork() Work {
	return Work{DH: 4 + 2 + 1, KEM: 1, KDF: 1 + 1 + uint64(c.unacknowledgedJump()) + 1 + 1, Verify: 1}
}

func (w *Work) dh(n int) {
	if w != nil {
		w.DH += uint64(n)
	}
}

func (w *Work) kem() {
	if w != nil {
		w.KEM++
	}
}

func (w *Work) kdf(n int) {
	if w != nil {
		w.KDF += uint64(n)
	}
}

func (w *Work) verify() {
	if w != nil {
		w.Verify++
	}
}

// LoadWork is what UnmarshalPrekeyStore computed to load s: one key
// object per signed prekey (an X25519 scalar multiplication) and one
// ML-KEM key expansion per KEM prekey, counted as DH and KEM.
func (s PrekeyStore) LoadWork() Work {
	return Work{DH: uint64(len(s.signed)), KEM: uint64(len(s.kem))}
}
