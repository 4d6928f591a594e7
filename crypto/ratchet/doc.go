// Package ratchet implements syncmesh's peer-session cryptography: device
// identities, PQXDH session setup (Signal's PQXDH specification, rev. 3:
// X3DH over X25519 plus an ML-KEM-768 encapsulation), the Double Ratchet
// (Signal's Double Ratchet specification, rev. 4) and a libsignal-like
// SessionRecord that resolves simultaneous initiation deterministically.
//
// Everything here is a pure function of values: Encrypt, Decrypt and
// Initiate take a SessionRecord (and, for the responder, a PrekeyStore) and
// return new values; the inputs are never modified, so a caller that does
// not persist the result has changed nothing. The session actor persists
// the returned record in the same storage transaction as the pending
// message (docs/protocol.md, commit boundary, "Transactions"). Clocks are injected
// as now parameters; randomness comes from crypto/rand (Go 1.26 ignores
// caller-supplied readers in crypto/ecdh and crypto/mlkem anyway).
//
// Wire formats live in package messages (secure.go): Envelope,
// PrekeyBundle, SecurePayload and DeviceAddress.
//
// # Constructions
//
//   - PQXDH (PQXDH §3.3): SK = HKDF-SHA256(salt = 32 zero bytes,
//     ikm = F || DH1 || DH2 || DH3 [|| DH4] || SS, info = InfoPQXDH), with
//     F = 32 0xFF bytes, DH1 = DH(IK_A, SPK_B), DH2 = DH(EK_A, IK_B),
//     DH3 = DH(EK_A, SPK_B), DH4 = DH(EK_A, OPK_B), SS = ML-KEM-768 shared
//     secret encapsulated to the responder's signed KEM prekey.
//   - Prekey signatures: Ed25519 over a domain-separated message that binds
//     the identity X25519 key, the prekey id and the public key, so neither
//     the DH identity key nor a prekey can be swapped under a valid
//     signature (see signedPrekeyMessage).
//   - Initiation (version 2): besides PQXDH's fields it names both device
//     addresses (from, to) and carries the initiator's Ed25519 signature
//     over all of it (context "syncmesh-pqxdh-v2 initiation"), so the
//     signing half of the identity is proven and the addresses are bound.
//     The responder requires from to be the sender its transport
//     authenticated (Route) and checks, before any DH or KEM work: the
//     addresses, the session id, the accepted-initiation set, the pin,
//     the caps on N and PN + N, then the signature.
//   - Session id: SHA-256("syncmesh-ratchet-session-v2" || encoded
//     initiation); the header names it, so every envelope's AD binds the
//     addresses.
//   - Replay of last-resort initiations: the prekey store keeps the ids of
//     accepted initiations without a one-time prekey until the prekeys
//     they name expire (PrekeyStore.Accept, PrekeyConfig.MaxAcceptedInitiations).
//   - Double Ratchet (DR §5.2): KDF_RK = HKDF-SHA256(salt = RK, ikm = DH
//     output, info = "syncmesh_Ratchet_Root_v1") split into RK' and CK;
//     KDF_CK: MK = HMAC-SHA256(CK, 0x01), CK' = HMAC-SHA256(CK, 0x02),
//     computed without allocating;
//     ENCRYPT (envelope version 2): AES-256-GCM with key and nonce =
//     HKDF-SHA256(ikm = MK, salt = the header's salt, info =
//     "syncmesh_Ratchet_Message_v2") (32 + 12 bytes), the salt being
//     HMAC-SHA256(MK, fresh random || digest of plaintext and associated
//     data), so a rolled-back or cloned sender never reuses a (key, nonce)
//     pair (salt.go; version 1: zero salt, info
//     "syncmesh_Ratchet_Message_v1"); associated
//     data = encoded header || encoded initiation (prekey envelopes only) ||
//     sender identity || receiver identity.
//   - The DH ratchet's new sending key pair is generated lazily by the next
//     Encrypt instead of inside Decrypt (DR §3.5 computes the same values in
//     the same order); Decrypt is therefore deterministic and needs no
//     randomness.
//
// # Simultaneous initiation
//
// Envelopes name their session. When a prekey envelope for an unknown
// session arrives while our current session is one we initiated and the
// peer has not yet answered on, both sides keep the session with the
// lexicographically smaller id as current and archive the other (which
// stays decryptable). Otherwise a fresh initiation from the pinned identity
// replaces the current session, which is archived. This converges as long
// as each direction is delivered in order (docs/protocol.md, commit boundary, "Ordering"); an
// archived session always stays decryptable, so no message is lost even if
// it is not.
//
// Secrets held in state values cannot be zeroized by this package: the
// values are immutable and shared between old and new states. Transient
// secrets (DH outputs, key material, message keys) are wiped after use.
package ratchet
