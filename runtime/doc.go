// Package runtime is syncmesh's public API: a Node is one peer of a mesh,
// with its storage, its actors and the methods an application calls.
//
// # Planes
//
// syncmesh gives an application two planes over one mesh, both carried by
// one Node: one actor system, one bbolt file, one transport. The sync
// plane (SSP/1): replicated tables where every local write becomes a
// signed event, events flow between peers at least once, and every peer
// materializes the same rows from the same events whatever the order,
// duplication or interleaving of delivery. The delivery plane
// (Config.Device): end-to-end encrypted device-to-device messages with a
// commit boundary — a received message stays pending until the
// application commits or discards it, and only then is it acknowledged.
//
// # Lifecycle
//
// Open opens or creates a node from a Config. A persistent node keeps one
// bbolt file, node.db, under Config.Dir; its event log and secrets are
// sealed under a storage key (Config.StorageKey, or by default the file
// storage.key in the same directory). Config.InMemory keeps everything in
// memory, unencrypted. Creating a node needs Config.MeshID, the
// mesh every signature is bound to; the node's site id and Ed25519
// signing key are generated once and stored sealed. Reopening a node with
// another MeshID fails with ErrMeshMismatch.
//
// The storage key rotates without losing anything: RotateStorageKey
// re-seals every sealed record of a closed key-file node under a new key
// (interrupted, the next Open finishes it); a node with a configured key
// lists the old ones in Config.PreviousStorageKeys and Open re-seals.
//
// Only one process may have a node open: Open waits up to
// Config.LockTimeout for the file lock. Close drains the node's actors —
// every request already accepted is committed and answered — then closes
// storage, including the bbolt file, so the directory can be opened
// again, in the same process too. Writes and applies after Close return
// ErrClosed.
//
// Identity returns what a peer needs to trust this node (site id, key id,
// public key, mesh id); Trust adds a peer's key to the keyring, Retire
// sets a retirement cutoff, TrustedKeys lists the keyring. A node always
// trusts itself.
//
// # Tables and writes
//
// DefineTable declares a table's key columns and value columns. Upsert
// and Delete write one row: the node assigns an HLC from its clock, signs
// the event with its key and applies it through the same path as a
// received event. The clock is durable: a high-water mark is persisted
// before any HLC beyond it is issued, so no HLC is issued twice, across
// restarts too (SSP/1 §13.5). NextHLC issues one without writing, and Sign
// signs an event without applying it, assigning a fresh HLC when the
// event has none.
//
// AddColumn adds a value column and rebuilds it for every row from the
// retained event log, so values received while the column was unknown
// are recovered (SSP/1 §13.6). SetHorizon sets a table's eviction horizon
// and reclaims the log below it: events arriving below the horizon count
// as applied and write nothing, and rebuilds never read below it
// (SSP/1 §13.4, §13.5).
//
// # The apply chokepoint
//
// Every event, local or received, goes through one apply path (SSP/1
// §12): signature verification against the keyring with the mesh id as
// external AAD, the clock-skew bound, the scope check (Config.Scope),
// the idempotent insert keyed on the event id (BLAKE3 of the signed
// bytes), and the HLC observe. ApplySigned and ApplySignedBatch feed it
// signed bytes as received. The result is a messages.Outcome; the error
// return is kept for infrastructure failures (storage, cancellation,
// ErrClosed), so a forged or malformed event never fails the call.
//
// Outcomes, and what each means for a sender's watermark (SSP/1 §13.6,
// messages.Outcome.AdvancesWatermark):
//
//   - Applied: the event passed every check and is durable, retained and
//     materialized (or lay below the eviction horizon: BelowHorizon, it
//     writes nothing). The watermark advances.
//   - Duplicate: an event with the same id was applied before; nothing
//     changes. The watermark advances.
//   - Dropped: the event never applies (Reason: signature, malformed,
//     out_of_scope, empty_row_key, unknown_key_column, incomplete_key). It
//     is not retained, and the watermark advances past it so a bad event
//     cannot stall the stream behind it.
//   - Rejected: the event is more than 300 s in the receiver's future
//     (clock_skew). It is not retained and the watermark does not advance:
//     the sender offers it again.
//   - Held: the destination table is not defined. The event is retained,
//     its group (site, schema, table) is held and the watermark does not
//     advance past it; DefineTable releases the group and materializes it.
//
// An upsert naming value columns the table does not have applies its
// other columns and ignores the rest, leaving their clocks untouched.
//
// # Reading rows
//
// Query reads the rows of a table by its key or by an index
// (TableDef.Indexes): equality on the leading columns, then a range or a
// prefix, in the order of the key or index, with a limit and a cursor
// (Row.Cursor) to resume. Live keeps a query's answer live: the rows that
// enter, change in and leave it, each refresh ended by LiveSettled, and
// resumable from a LivePosition after a restart. Get reads one row, Rows
// lists a table in key order, Tables lists the definitions.
//
// Every listing returns an iter.Seq2[T, error] whose items carry the
// position to resume after (Query, Rows, Watch, Live, LogEntries,
// PendingSent, PendingReceived, PendingReceivedReports); it reads a page
// or an answer per read transaction, so a slow consumer never holds one
// open, and ends after the first error it yields. A Row carries the row's existence and tombstone clocks and
// one Cell per value column. A Cell's State tells the three cases apart
// that a plain value cannot (SSP/1 §13.6): Written (an upsert wrote it,
// possibly an explicit null), Cleared (a delete set it to null) and
// Unmaterialized (nothing ever wrote it here: no value, no clock — not a
// null, not a zero, not a default). Row.Value decodes a cell and reports
// its state.
//
// # Syncing with peers
//
// AddPeer starts a sender actor toward a peer over a Transport: every
// Config.SyncInterval it pushes what lies in this node's log past its
// durable cursor for that peer (its own events and those it received, so
// nodes not directly connected converge through the ones between them).
// The cursor starts at genesis, moves only after a push succeeded and
// never from anything the peer says (SSP/1 §14.1); SyncNow runs one cycle
// on demand. HandlePush is the receiving end every transport calls. A
// push result names the groups held for a missing table and the events
// rejected for clock skew: the sender offers exactly those again.
//
// Watermarks (SSP/1 §14.2) say, per (site, schema, table), up to which
// HLC everything was demonstrably applied; they are monotonic, persisted
// and fail closed. Peers reports, per peer, the cursor, the backlog, the
// re-offers waiting and the peer's reported watermarks: how far behind it
// is. Inbound reports what senders pushed here (a joining node's
// catch-up progress).
//
// Transports: NewNetwork is an in-process network with seeded faults
// (drop, lost results, duplicate, reorder, delay, partitions) for tests
// and embedding; Config.Remote (or StartRemote) is protoactor-go's gRPC
// remote with mutual TLS, carrying both planes. The package meshtest
// starts a whole in-process mesh for tests.
//
// # Messages between devices
//
// With Config.Device the node is also a device. Send stores a message as
// pending (durably, before it is handed to the transport) and keeps it
// pending until the recipient's ACK arrives; Resend re-encrypts it under
// the current ratchet state, Abandon gives up, PendingSentMessages pages
// what waits. On the receiving side the ratchet step and the pending row
// are written in one transaction; the application gets each message
// through DeviceConfig.Handler, Messages or PendingReceivedMessages, and
// finalizes it with CommitMessage or DiscardMessage (a reason kept
// locally). That transaction also holds the ACK's ratchet step; the ACK
// is handed to the transport only once it is durable, and an ACK failure
// never undoes it (docs/delivery.md). Processed ids with body digests suppress duplicates
// until PruneProcessedMessages removes them; nothing prunes implicitly.
// Messages pending at a crash are delivered again on the next Open.
//
// # Notices and custom actors
//
// The node surfaces what an application should know as notices
// (messages.Notice): resurrections, partial rebuilds, dropped, rejected
// and held events, released groups and ignored columns. Subscribe calls a
// function with every notice of the node, in order, on a goroutine of its
// own. Custom actors running on the node's actor system (System) use
// SubscribePID to receive NoticeEvent messages, and call the node's
// methods like any other client. Notices are published after the
// transaction that caused them is durable.
//
// # Metrics
//
// The node registers Prometheus metrics with Config.Registerer, or with a
// private registry that Gatherer returns: events by outcome and reason,
// ignored columns, resurrections, partial rebuilds, released held events,
// pushes, per-peer backlog, re-offers and watermark lag, pending inbound
// and outbound messages and the oldest pending outbound's send time,
// commits, discards, prunes, ACKs sent and failed, storage transaction
// latency, mailbox depth per actor kind, remote bytes and undecodable
// frames, and actor dead letters. Gauges carry their unit in the name
// (_events, _messages, _seconds, _bytes); a private registry also holds the
// go_ and process_ collectors; Config.MetricsNode labels every series of a
// node with node="<name>" so nodes sharing a Registerer stay apart.
// Config.MetricsAddr serves them on /metrics with a health check on
// /healthz and the read-only admin endpoint under /admin/ (see
// "Operating a running node" above).
//
// # Change feed
//
// Watch streams a table's row changes (iter.Seq2[Change, error]): local
// writes, received events, held events released by DefineTable and
// AddColumn rebuilds, each with the row key, existence, the cells that
// changed with their clocks, the cause and the causing event's clock, and
// a change sequence. The node keeps its own change log, written in the
// transaction that writes the row and bounded by Config.ChangeLogLimit;
// Watch after the last Seq processed resumes across restarts without loss
// or duplicates (sequences jump at each Open: never dense, never reused,
// also after a restore from an older copy), a watcher that fell behind
// the retained log gets a *WatchLagError (ErrWatchLagged) and one whose
// position a restore took away a *WatchRestoredError (ErrWatchRestored),
// each saying where to resume. A watcher holds
// one page in memory, never a growing buffer.
//
// # Keys
//
// Local writes and lookups normalize key values (NormalizeKey): every Go
// integer type, an integral float (a number decoded from JSON) and a
// json.Number name the same row; nil, empty, fractional and composite
// components are a *KeyError matching ErrInvalidKey. Keys inside received
// signed events are used exactly as signed. A local Upsert or Delete the
// chokepoint does not apply (its table outside Config.Scope, for example)
// is a *NotAppliedError matching ErrNotApplied, never a nil error.
//
// # Operating a running node
//
// Config.MetricsAddr serves /metrics, /healthz and a read-only JSON admin
// endpoint: /admin/status (Status), /admin/peers (PeerReports: cursor,
// backlog, lag in events and in time, last error), /admin/watermarks,
// /admin/inbound and /admin/messages (pending message counts). Actions
// that change state (POST /admin/sync) are off unless Config.AdminToken is
// set, and then need it as a bearer token. examples/sspctl reads the
// endpoint with "sspctl status|peers|watermarks --addr HOST:PORT".
// Config.Trusted puts peer keys into the keyring before any transport
// serves. Package meshtls creates a mesh CA and node certificates for
// RemoteConfig.TLS and ClientTLS.
//
// # Errors
//
// Config problems are a *ConfigError naming the field. Node methods
// return the sentinels ErrClosed, ErrMeshMismatch, ErrUnknownTable,
// ErrUnknownColumn, ErrTableConflict, ErrInvalidKey, ErrNotApplied,
// ErrOutOfScope, ErrUnknownPeer,
// ErrPeerExists and ErrNoDevice, and those of the layers below, wrapped
// and re-exported here (ErrUnreachable, ErrPushRejected, ErrNotHandedOff,
// ErrLogicalMessageConflict, ErrCorrupt, …; all in errors.go): match them
// with errors.Is, no import of syncmesh/actors/... is needed. Every
// "closed" error matches ErrClosed, and every Close is idempotent (a
// second call returns nil).
//
// # Concurrency
//
// Every Node method is safe for concurrent use. Pure work (decoding,
// hashing, signature checks) runs on the caller's goroutine or parallel
// workers; each sync group's mutations go through its actor's mailbox,
// and the node commits the batches waiting there in one storage
// transaction (group commit), answering each caller only once that
// transaction is durable. In the delivery plane one actor per remote
// device decides everything keyed by that device (ratchet, receive,
// commit, its outbound rows) and one committer per store writes what it
// decided, group-committed the same way. Several nodes may share one actor system
// (Config.System) and one Registerer.
package runtime
