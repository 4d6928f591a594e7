package persistence

import (
	"context"

	"github.com/syncmesh/syncmesh/messages"
)

// DeliveryReader is the read side of a delivery-plane transaction: the
// local device's identity and prekeys, one ratchet session record per
// remote device, and the identity pinned for each remote device.
//
// Record values are the opaque encodings produced by crypto/ratchet
// (MarshalIdentity, MarshalPrekeyStore, MarshalStateWithoutKeys, and the
// SkippedKey entries stored beside a session record); a store only keeps
// them. At rest they are sealed (bolt: RecordIdentity, RecordPrekey,
// RecordSession, see each method); a damaged sealed record is an error
// matching ErrCorrupt, never "missing" (docs/protocol.md, "At rest").
//
// Slices returned are owned by the caller (copies). An address that fails
// messages.DeviceAddress.Validate is an error, never a silent miss.
type DeliveryReader interface {
	// LocalIdentity returns the marshalled ratchet.Identity of this device
	// (sealed as RecordIdentity, identity sealed.DeviceIdentity()); ok is
	// false when none was stored.
	LocalIdentity() (identity []byte, ok bool, err error)
	// Prekeys returns the marshalled ratchet.PrekeyStore of this device
	// (sealed as RecordPrekey, identity sealed.PrekeyIdentity("store"));
	// ok is false when none was stored.
	Prekeys() (prekeys []byte, ok bool, err error)
	// Session returns the marshalled ratchet.SessionRecord kept for peer
	// (sealed as RecordSession, identity sealed.SessionIdentity(user,
	// device as 4 big-endian bytes)); ok is false when there is none.
	Session(peer messages.DeviceAddress) (record []byte, ok bool, err error)
	// Pin returns the identity pinned for peer (the first identity seen,
	// or the one the application accepted); ok is false when none is
	// pinned. Identities are public, but a pin decides who may speak as
	// peer, so at rest it is sealed (RecordPin, identity
	// sealed.PinIdentity(user, device as 4 big-endian bytes)): a pin
	// swapped or copied from another address is ErrCorrupt.
	Pin(peer messages.DeviceAddress) (identity messages.IdentityKey, ok bool, err error)
	// Sessions calls fn with the address of every stored session record in
	// messages.DeviceAddress.Compare order, starting strictly after *after
	// (nil: from the first), until fn returns false or an error (which
	// Sessions returns). fn may write to the transaction; writes made by fn
	// may or may not be visited.
	Sessions(after *messages.DeviceAddress, fn func(peer messages.DeviceAddress) (bool, error)) error
	// SkippedKeys calls fn with every skipped message key entry stored for
	// peer (ratchet.SkippedKey: its number and encoded entry), in
	// ascending number order, until fn returns false or an error (which
	// SkippedKeys returns). The keys of a session record are stored beside
	// it, one entry each, so that a ratchet step writes only the keys it
	// adds or consumes (docs/storage.md, "Skipped
	// message keys"). At rest each is sealed on its own (bolt:
	// RecordSkippedKey, identity sealed.Identity(user, device as 4
	// big-endian bytes, seq as 8 big-endian bytes)).
	SkippedKeys(peer messages.DeviceAddress, fn func(seq uint64, entry []byte) (bool, error)) error
	// SkippedKeyCount returns the number of skipped keys stored for peer,
	// or for every peer of the device together when peer is nil.
	SkippedKeyCount(peer *messages.DeviceAddress) (int, error)
	// SessionWrites returns the number of session record writes
	// (PutSession, DeleteSession) ever committed to this store, or the
	// floor RaiseSessionWrites set, whichever is higher: it only grows.
	// A restore mark kept outside the store compares it with a copy of
	// it: a store whose count is below the mark's is older than sessions
	// this device already used (a restored copy). 0 for a store without
	// any (also one written by a build that did not count).
	SessionWrites() (uint64, error)
	// InboundReader reads the commit-boundary records (inbound.go).
	InboundReader
}

// DeliveryTx is a read-write delivery-plane transaction. Reads inside it
// see its own writes. The commit-boundary records (pending inbound,
// processed inbound, pending outbound) are added to this same type, so a
// ratchet step and the pending row it produced commit together
// (docs/protocol.md, commit boundary, "Transactions").
type DeliveryTx interface {
	DeliveryReader
	// PutLocalIdentity stores (or replaces) the marshalled local identity.
	PutLocalIdentity(identity []byte) error
	// PutPrekeys stores (or replaces) the marshalled prekey store.
	PutPrekeys(prekeys []byte) error
	// PutSession stores (or replaces) the marshalled session record of peer.
	PutSession(peer messages.DeviceAddress, record []byte) error
	// DeleteSession removes peer's session record and its skipped keys;
	// removing a missing one is not an error. The pin is kept.
	DeleteSession(peer messages.DeviceAddress) error
	// PutSkippedKey stores (or replaces) skipped key number seq of peer's
	// record. An entry longer than MaxSkippedKeyEntry is ErrInvalidRecord.
	PutSkippedKey(peer messages.DeviceAddress, seq uint64, entry []byte) error
	// DeleteSkippedKey removes skipped key seq of peer; removing a missing
	// one is not an error.
	DeleteSkippedKey(peer messages.DeviceAddress, seq uint64) error
	// EvictSkippedKeys enforces a device-wide cap: while more than limit
	// skipped keys are stored, it deletes the lowest-numbered (oldest)
	// keys of the peer holding the most (PlanSkippedEviction), and returns
	// how many it deleted per peer. At or under limit it does nothing.
	EvictSkippedKeys(limit int) ([]SkippedEviction, error)
	// PutPin pins (or re-pins) identity for peer.
	PutPin(peer messages.DeviceAddress, identity messages.IdentityKey) error
	// RaiseSessionWrites raises SessionWrites to floor when it is below
	// (after a restore, so that the copy is not reported again).
	RaiseSessionWrites(floor uint64) error
	// InboundWriter writes the commit-boundary records (inbound.go).
	InboundWriter
}

// DeliveryStore is the delivery plane's storage. Updates are serialized:
// at most one read-write transaction runs at a time, so read-modify-write
// inside one Update never loses a concurrent update.
type DeliveryStore interface {
	// Update runs fn in one read-write transaction. When Update returns
	// nil every write of fn is durable; when fn returns an error (or the
	// commit fails) nothing it wrote is kept. ctx is checked before the
	// transaction starts.
	Update(ctx context.Context, fn func(tx DeliveryTx) error) error
	// View runs fn in a read-only transaction over a consistent snapshot.
	// Do not call Update from inside fn (it may deadlock).
	View(ctx context.Context, fn func(tx DeliveryReader) error) error
	// Close releases this handle. Calls after Close return ErrClosed.
	Close() error
}

// PrekeyStoreIdentity is the row identity ("store") under which the whole
// prekey store is sealed as RecordPrekey: one record holds every prekey,
// so a rotation and a one-time prekey consumption are one write.
const PrekeyStoreIdentity = "store"
