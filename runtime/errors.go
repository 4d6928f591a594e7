package runtime

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/actors/clock"
	"github.com/syncmesh/syncmesh/actors/device"
	inboundstore "github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The sentinel errors of the package, in one place. Every error a node
// returns matches one of them (or a sentinel they re-export) with
// errors.Is; errors of the layers below are wrapped with %w.

// Errors returned by Node methods (match with errors.Is).
var (
	// ErrClosed matches every "closed" error syncmesh returns: a call on
	// a closed or closing node, remote, device, store or hosted unit. It
	// is persistence.ErrClosed, the one base every component's closed
	// sentinel wraps (the node's own is "syncmesh: node closed"). Every
	// Close in syncmesh follows one rule: it is idempotent, the first call
	// does the work and returns its error, later calls return nil.
	ErrClosed = persistence.ErrClosed
	// ErrMeshMismatch: Config.MeshID differs from the mesh the node was created in.
	ErrMeshMismatch = errors.New("runtime: mesh id differs from the stored one")
	// ErrUnknownTable: the table is not defined on this node.
	ErrUnknownTable = errors.New("runtime: table not defined")
	// ErrUnknownColumn: a local write names a column the table does not have.
	ErrUnknownColumn = errors.New("runtime: column not defined")
	// ErrTableConflict: DefineTable of an existing table with another definition.
	ErrTableConflict = errors.New("runtime: table already defined differently")
	// ErrLocked: another process holds the node's bbolt file (Config.LockTimeout passed).
	ErrLocked = errors.New("runtime: node is open in another process")
	// ErrTypeMismatch: a value not of its column's declared type — a local
	// write refused, or a received cell read back (matches *TypeError).
	ErrTypeMismatch = messages.ErrTypeMismatch
	// ErrInvalidKey: a local write's or lookup's key is refused: a nil, empty or
	// untyped component (see NormalizeKey), or columns that do not match the
	// table's key columns.
	ErrInvalidKey = errors.New("runtime: invalid row key")
	// ErrUnknownIndex: a query names an index the table does not have.
	ErrUnknownIndex = errors.New("runtime: index not defined")
	// ErrBadQuery: a query's shape is refused (more equal values than
	// columns, a prefix and a range together, a limit out of range…); a
	// bound of the wrong type is a *TypeError instead.
	ErrBadQuery = errors.New("runtime: invalid query")
	// ErrIndexBuilding: a query names an index that is still being built
	// from the rows (EnsureTable returns once it is built; after a crash
	// Open finishes it).
	ErrIndexBuilding = errors.New("runtime: index still being built")
)

// Errors of local writes that could not apply (match with errors.Is).
var (
	// ErrNotApplied: a local Upsert or Delete went through the apply
	// chokepoint and was not applied (its outcome is in the
	// *NotAppliedError). The chokepoint dropped the event as SSP/1 §12
	// says; only the local API turns that into an error.
	ErrNotApplied = errors.New("runtime: local write not applied")
	// ErrOutOfScope: the write's table is outside Config.Scope, so the
	// node drops its own event (SSP/1 §12 step 3). Matches ErrNotApplied
	// too.
	ErrOutOfScope = errors.New("runtime: table outside the node's scope")
)

// ErrWatchLagged matches a *WatchLagError.
var ErrWatchLagged = errors.New("runtime: watcher fell behind the change log")

// ErrWatchRestored matches a *WatchRestoredError.
var ErrWatchRestored = errors.New("runtime: watch resumes inside changes a restore of node.db lost")

// ErrWatchAhead is returned by Watch when asked to resume after a
// sequence above every one the node assigned or skipped (a sequence from
// another node, or a whole directory restored onto a machine whose wall
// clock is behind the lost history): nothing would ever be delivered for
// the changes below it, so Watch refuses instead of waiting.
var ErrWatchAhead = errors.New("runtime: watch resumes after a change sequence this node never assigned")

// ErrNoDevice is returned by the delivery-plane methods of a node opened
// without Config.Device.
var ErrNoDevice = errors.New("runtime: node has no device (Config.Device)")

// Errors of the sync delivery API (match with errors.Is).
var (
	// ErrUnknownPeer: no peer of that name and path was added.
	ErrUnknownPeer = replicate.ErrUnknownPeer
	// ErrPeerExists: AddPeer of a name and path already added.
	ErrPeerExists = replicate.ErrPeerExists
	// ErrUnknownSender: a push from a name this node did not configure
	// (AddPeer, AcceptPeer); nothing of it was kept.
	ErrUnknownSender = replicate.ErrUnknownSender
	// ErrSenderMismatch: a push whose From is not the peer the transport
	// authenticated (on the Remote: another peer's TLS certificate).
	ErrSenderMismatch = replicate.ErrSenderMismatch
)

// Errors of the remote transport. Push errors that mean "not delivered,
// try again later" also match replicate.ErrUnreachable.
var (
	// ErrRemoteClosed is returned (wrapped, together with
	// replicate.ErrUnreachable) by Push after Close. It matches ErrClosed.
	ErrRemoteClosed = persistence.NewClosedError("runtime: remote closed")
	// ErrRemoteRunning is returned by StartRemote on an actor system that
	// already has a protoactor remote.
	ErrRemoteRunning = errors.New("runtime: actor system already has a remote")
	// ErrRemoteListen is returned (wrapped) by StartRemote when the
	// address cannot be listened on (for example, the port is taken).
	ErrRemoteListen = errors.New("runtime: remote cannot listen")
	// ErrPushRejected is returned (wrapped) by Push when the peer answered
	// that it did not process the push (undecodable, no receiver, or its
	// handler failed). The push was not applied.
	ErrPushRejected = errors.New("runtime: push rejected by peer")
	// ErrBadResponse is returned (wrapped) by Push when the peer's answer
	// does not decode. The push may or may not have been applied.
	ErrBadResponse = errors.New("runtime: undecodable answer to a push")
)

// ErrInvalidPeerAddress is returned (wrapped) by Remote.AddPeer for an
// address that is not host:port with a port in 1..65535.
var ErrInvalidPeerAddress = errors.New("runtime: invalid peer address")

// ErrReconcileRefused: the peer answered a reconciliation request with a
// refusal (it found the request invalid, could not serve it, or the
// stream guard refused its sender). Nothing was applied from it.
var ErrReconcileRefused = errors.New("runtime: peer refused the reconciliation request")

// ErrBundleRateLimited answers a bundle request past its requester's
// budget (LimitBundles).
var ErrBundleRateLimited = errors.New("runtime: bundle requests rate-limited")

// Errors of reconciliation (match with errors.Is).
var (
	// ErrReconcilePeer: the peer's reconciliation message was malformed,
	// oversized or broke the protocol. Only the session with that peer
	// fails; nothing was applied from the offending message.
	ErrReconcilePeer = errors.New("runtime: peer broke the reconciliation protocol")
	// ErrReconcileUnsupported: the peer's transport does not carry
	// reconciliation (the Network and the Remote do; a custom Transport
	// may not).
	ErrReconcileUnsupported = errors.New("runtime: transport does not carry reconciliation")
	// ErrReconcileBusy: a reconciliation with the same peer is running.
	ErrReconcileBusy = errors.New("runtime: reconciliation with this peer already running")
	// ErrReconcileLimited: the peer spent its reconciliation budget on this
	// node (work or fetched bytes, reconcile_limits.go); the request is
	// refused, nothing is read for it. It matches ErrReconcileBusy too, and
	// travels over the remote as a busy answer: the peer may retry later.
	ErrReconcileLimited = fmt.Errorf("%w: peer over its reconciliation budget", ErrReconcileBusy)
	// ErrReconcileFetchMismatch: a fetched event is not the one its key
	// named (another site, HLC, table, or an id not asked for). Nothing of
	// that reply is applied, and it is counted against the peer
	// (syncmesh_reconcile_peer_faults_total). It matches ErrReconcilePeer.
	ErrReconcileFetchMismatch = fmt.Errorf("%w: fetched event does not match its key", ErrReconcilePeer)
)

// ErrRehydrateIncomplete: Rehydrate lowered the horizon but could not take
// the whole history below it from the peer (a session was cut short, or a
// session fetched nothing while events were still missing). The horizon
// stays at zero and what arrived stays applied; calling Rehydrate again
// (or any reconciliation with the peer) continues.
var ErrRehydrateIncomplete = errors.New("runtime: rehydration did not take the whole history")

// ErrClockBehind: the wall clock is behind the node's HLC clock (its
// clock mark) by more than the skew bound (SSP/1 §12), so local writes are
// refused as clock skew until it catches up; the health check reports it.
var ErrClockBehind = errors.New("runtime: wall clock behind the clock mark")

// ErrRehydrateNotServed: the peer did not answer for the table Rehydrate
// was asked to rebuild (it does not sync the table, or left it out of its
// answers): nothing was compared, so nothing is reported completed and no
// RebuildCompleted notice is raised. The horizon stays at zero; Rehydrate
// from a peer that syncs the table continues.
var ErrRehydrateNotServed = errors.New("runtime: the peer does not serve the table to rehydrate")

// Errors of restore safety (match with errors.Is).
var (
	// ErrClockMark: the clock mark file beside node.db is unreadable or
	// corrupt. Open refuses to guess; see docs/operations.md "Backup and
	// restore" (deleting the file makes the next Open treat the store as
	// possibly restored).
	ErrClockMark = errors.New("runtime: clock mark file unreadable")
	// ErrAwaitingReconcile: a local write (or NextHLC, Sign) after an Open
	// with Config.Restored found no completed reconciliation with a peer
	// yet, so the node does not know the highest HLC it released.
	ErrAwaitingReconcile = clock.ErrHeld
)

// Errors of storage key rotation (match with errors.Is).
var (
	// ErrNoStorageKeyFile: RotateStorageKey on a directory without
	// storage.key (a new directory, or a node configured with
	// Config.StorageKey, which rotates through PreviousStorageKeys).
	ErrNoStorageKeyFile = errors.New("runtime: no storage key file to rotate")
	// ErrStorageKeyState: storage.key.next exists without storage.key, a
	// state rotation never produces (files were moved or deleted by hand).
	ErrStorageKeyState = errors.New("runtime: storage.key.next present without storage.key")
	// ErrLinkFull: the in-process Network's queue toward a device already
	// holds its bound of envelopes; the envelope was not queued (the
	// sender's message stays pending and the retry schedule sends it
	// again). It matches ErrUnreachable too.
	ErrLinkFull = fmt.Errorf("%w: link queue full", replicate.ErrUnreachable)
)

// Errors of the layers below that a caller may need to match, re-exported
// so that user code needs no import of syncmesh/actors/... (they are the
// same values: errors.Is works with either name).
var (
	// ErrUnreachable: a peer could not be reached (unknown peer,
	// partition, connection refused, timeout); nothing is known to have
	// been delivered, try again later.
	ErrUnreachable = replicate.ErrUnreachable
	// ErrNotHandedOff: Send stored the message as pending but could not
	// encrypt it or hand it to the transport; it stays pending (Resend).
	ErrNotHandedOff = device.ErrNotHandedOff
	// ErrNotPending: the sent message is not pending (acknowledged,
	// abandoned or never sent).
	ErrNotPending = outbound.ErrNotPending
	// ErrAlreadyPending: a message of the same (recipient, id) is already
	// pending.
	ErrAlreadyPending = outbound.ErrAlreadyPending
	// ErrLogicalIDReused: a Send reused the logical id of a message this
	// node abandoned or saw acknowledged (a retired id, kept across
	// restarts until pruned) with another body; nothing was stored (use a
	// new id).
	ErrLogicalIDReused = session.ErrLogicalIDReused
	// ErrLogicalMessageConflict: a received message reused a logical id
	// with another body; nothing changed.
	ErrLogicalMessageConflict = inboundstore.ErrLogicalMessageConflict
	// ErrReceivedMessageNotPending: a commit or discard of an id that is
	// neither pending nor finalized; nothing changed.
	ErrReceivedMessageNotPending = inboundstore.ErrReceivedMessageNotPending
	// ErrSenderBacklogFull: the sender has DeviceConfig's per-sender cap
	// of messages pending; a new one is refused (the sender retries).
	ErrSenderBacklogFull = inboundstore.ErrSenderBacklogFull
	// ErrBacklogFull: all senders together have the global cap of messages
	// pending; a new one is refused (the sender retries).
	ErrBacklogFull = inboundstore.ErrBacklogFull
	// ErrInvalidDiscardReason: a discard reason outside the defined set.
	ErrInvalidDiscardReason = inboundstore.ErrInvalidDiscardReason
	// ErrDecryptBudget: the sender's failed decrypt attempts used up its
	// budget; the envelope was refused before any cryptography.
	ErrDecryptBudget = session.ErrDecryptBudget
	// ErrReplay: a message already processed (or a replayed initiation).
	ErrReplay = ratchet.ErrReplay
	// ErrTampered: a message failed authentication.
	ErrTampered = ratchet.ErrTampered
	// ErrCorrupt: a stored record failed to decode or to open (a damaged
	// sealed record is this error, never "missing").
	ErrCorrupt = persistence.ErrCorrupt
	// ErrLayoutVersion: the store's layout is newer than this build.
	ErrLayoutVersion = persistence.ErrLayoutVersion
	// ErrMalformed: input that does not decode (matched by every decode
	// failure).
	ErrMalformed = messages.ErrMalformed
)
