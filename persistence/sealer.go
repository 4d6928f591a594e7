package persistence

import "github.com/syncmesh/syncmesh/messages"

// RecordType numbers a kind of sealed record; it is bound into the AEAD's
// associated data so a record moved to another type fails to open. It is
// messages.RecordType, so the storage cipher (crypto/sealed) implements
// Sealer without importing this package.
type RecordType = messages.RecordType

// Record types sealed by this project. Numbers are part of the storage
// format: never reuse or renumber one.
const (
	RecordEvent           RecordType = 1  // the retained sync event log (raw COSE bytes); identity = event id
	RecordNodeKey         RecordType = 2  // the node's Ed25519 signing key; identity = "node"
	RecordSession         RecordType = 3  // ratchet session state; identity = peer user, device
	RecordPrekey          RecordType = 4  // private prekey material; identity = prekey id
	RecordIdentity        RecordType = 5  // local device identity private keys; identity = "device"
	RecordOutboundBody    RecordType = 6  // pending outbound message body; identity = recipient user, device, logical id
	RecordPendingFrame    RecordType = 11 // pending inbound SecurePayload frame; identity = sender user, device, logical id (docs/protocol.md, commit boundary)
	RecordProcessedDigest RecordType = 12 // layouts ≤ 10: processed inbound digest (version 1 | digest[32]); identity as RecordPendingFrame
	RecordPin             RecordType = 13 // pinned identity of a remote device (sign | dh); identity = peer user, device (docs/delivery.md, "Sealed pins and processed entries")
	RecordProcessedEntry  RecordType = 14 // processed inbound entry: finalization, time, digest, reason, legacy marker; identity as RecordPendingFrame
	RecordSkippedKey      RecordType = 15 // a skipped ratchet message key (layout 13); identity = peer user, device, key number (docs/storage.md, "Skipped message keys")
	RecordRetiredOutbound RecordType = 16 // a retired outbound entry: how, time, body digest (layout 15); identity as RecordOutboundBody (docs/storage.md, "Retired outbound ids")
)

// Sealer seals and opens records at rest. identity is the row's identity
// (for example the event id, or sender user | device | logical id), bound
// with the record type into the associated data. Open of a damaged or moved
// record returns an error (a store maps it to ErrCorrupt).
//
// crypto/sealed implements it; a nil Sealer stores plaintext (the memory
// store and tests).
type Sealer interface {
	Seal(t RecordType, identity []byte, plaintext []byte) ([]byte, error)
	Open(t RecordType, identity []byte, sealed []byte) ([]byte, error)
}

// KeyRotator is implemented by a Sealer that holds several storage keys
// (the current one and older ones it can still open). IsCurrent reports
// whether a sealed record is under the current key; a store's reseal pass
// re-seals every record for which it is false, so rotation is safe to
// interrupt and resume.
type KeyRotator interface {
	Sealer
	IsCurrent(sealed []byte) bool
}
