// Package hosting runs hosted devices and sync groups when one machine is
// not enough: each is a unit — a runtime.Node with its
// own bbolt file — placed on one member of a cluster by its identity, and
// reached from any member through one interface, Placement.
//
// # Units
//
// A unit is a virtual actor (a protoactor-go cluster grain) of one of two
// kinds:
//
//   - KindDevice, identity = the device address (DeviceIdentity:
//     "user.device"): a node with the delivery plane. Requests: OpSend
//     (under the caller's logical id), OpCommit, OpDiscard, OpPending,
//     OpPendingSent, OpProcessed, OpPrune; OpBundle and OpDeliver are what
//     hosted devices use to reach each other: a device's session transport
//     goes through the Placement, so sender and recipient may live on
//     different members.
//   - KindGroup, identity = the group's name (a tenant's replicated
//     tables): a node with the sync plane only. Requests: OpTrust,
//     OpDefineTable, OpApply (signed events, ApplySignedBatch), OpGet,
//     OpScan, OpEvents, OpDigest, OpChanges (the change feed).
//
// # Trust boundary
//
// Members talk gRPC with mutual TLS by default (ClusterConfig.TLS and
// ClientTLS, certificates of the mesh CA: runtime/meshtls, `sspctl tls`;
// MemberTLS loads them); a member's identity is its certificate's node
// name, and every request it sends is attributed to that name by its
// receiver (Request.Caller is overwritten from the connection).
// Plaintext must be asked for (ClusterConfig.Plaintext) and is logged at
// every start.
//
// A unit exists only once created (OpCreate, Client.Create) for the
// principal's tenant, its owner, within the tenant's quota
// (Config.TenantQuota, counted in the shared root); no other request
// makes one (ErrNotProvisioned), and OpDelete removes its files. Every
// request carries the principal its member vouches for (Client: from the
// context, WithPrincipal); the unit's host asks Config.Authorizer
// (OwnerOnly by default: a unit's operations are its owner's) and refuses
// anything else with ErrForbidden, changing nothing. Between units only
// OpDeliver and OpBundle pass, attributed instead: the sending device
// (Request.Peer) must be placed on the member that sent the request
// (Locator), so a member cannot deliver as, or spend the budget of, a
// device hosted elsewhere. See docs/threat-model.md, "Hosting".
//
// A grain opens its unit's node (Config.Root/<kind>/<hex(identity)>) when
// it is activated and closes it when it stops: passivation after
// ClusterConfig.IdleTimeout without requests, a topology change moving it,
// or its member's Close.
//
// Client wraps a Placement with typed methods. Requests and replies are
// CBOR inside messages/wire's one protobuf envelope (docs/architecture.md,
// "protoactor-go at the pinned version"), registered as TypeRequest and
// TypeReply.
//
// A frame is what both sides accept: at most MaxFrame bytes and no list
// or map longer than the strict decoder reads (messages.MaxArrayElements,
// messages.MaxMapPairs). The writer checks both before sending, so a
// request or reply past them is an error matching messages.ErrTooLarge
// where it was made, never a frame its receiver fails to decode. The
// reading operations page within them: a page holds at most its count
// (MaxEventIDs, MaxScanRows, MaxChanges, MaxPendingPage) and ends, with
// More set, before its items pass MaxPageBytes; Client.EventIDs, Rows,
// Pending and PendingSent follow the pages to the end. Between members,
// a Cluster refuses such a request before sending it (ErrBadRequest) and
// a grain answers CodeFailed for such a reply, instead of protoactor
// dropping it unsent; a member reads gRPC messages of up to four frames
// (one protoactor batch), far above gRPC's default of 4 MiB.
//
// # Placement implementations
//
// Placement is our seam over the cluster layer, so the layer can be
// swapped:
//
//   - NewCluster: one member of a protoactor-go cluster. Units are grains
//     of the kinds "device" and "group", placed by the identity lookup
//     (disthash: rendezvous hashing over the members that are up).
//     Membership comes from a cluster provider: etcdmember (etcd, with
//     self-fencing) in production; clusterproviders/test with a shared
//     InMemAgent in one process (tests: it only ever removes a member
//     that leaves cleanly).
//   - NewLocal: every unit in this process (the embedded deployment). With
//     WithRouter and WithMemberName several Locals can be the shards of a
//     placement of one's own; this package's tests build one that way.
//
// # Guarantees
//
//   - At least once. A request may reach its unit more than once:
//     cluster.Request retries on timeout, and Placement.Request retries
//     while the unit is unavailable (ErrUnavailable: its member is
//     stopping, its storage is still locked by a previous host). Every
//     mutating operation is therefore idempotent: OpApply by event id (a
//     repeat is a Duplicate outcome), OpSend by (recipient, logical id) (a
//     repeat while pending re-encrypts and hands off the stored message
//     again, Message.Duplicate; the recipient recognizes the copy by its
//     id), OpCommit (a repeat is ALREADY_COMMITTED), OpTrust and
//     OpDefineTable (same value, no change). OpDeliver hands over one
//     ratchet envelope; a repeated envelope never delivers a message twice
//     (the ratchet refuses a replayed envelope; a new copy under the same
//     logical id is recognized by the inbound store), and the sender's
//     message stays pending until its ACK.
//   - Acknowledged means durable. A successful reply is sent after the
//     unit's node committed the effect to its bbolt file (the runtime's
//     rule), so a member lost after the reply loses nothing acknowledged
//     (with Replicas ≥ 2: committed on a quorum of members, so a member
//     lost with its disk loses nothing acknowledged either).
//     A request without a reply may or may not have taken effect: repeat
//     it (idempotent).
//   - One host at a time. A member activates and serves a unit only
//     while its own view of the membership places the unit on it
//     (otherwise ErrNotOwner, which matches ErrUnavailable: the caller
//     retries) and, with a Fencing provider (etcdmember), while its
//     registration is known to hold (ValidUntil). When that window
//     passes without a renewal (etcd unreachable) the member is
//     suspended: it closes every unit at once and refuses them
//     (ErrFenced), but keeps its member id; if etcd later accepts a
//     renewal of the same lease with its key unchanged since it
//     registered, no view ever lost it and it resumes serving. A member
//     whose lease or key is gone, or that no longer sees itself, fences
//     itself (closes every unit, rejoins under a new member id as soon as
//     etcd answers; ErrFenced meanwhile). Each activation persists the next
//     activation epoch of the unit, and every reply carries it with the
//     serving member's id and when the activation began and the reply was
//     produced (a success is reported only if the checks still pass after
//     the operation), so overlapping activations would show in the
//     replies (TestClusterCrashEtcd checks that none do). Underneath, the
//     unit's bbolt file is locked by the member that has it open; a
//     second host waits (Config.LockTimeout) and answers ErrUnavailable
//     until the first released it (with Replicas 0 or 1 no consensus is
//     relied on: protoactor's did not converge here; with Replicas ≥ 2
//     the partition's raft term fences writes, see Replicated units).
//
// # Take-over
//
// A unit's whole state — events, rows, sessions, pending and processed
// messages, pending sent messages — is its node's files under
// Config.Root/<kind>/<hex(identity)>. When a member leaves (Close: its
// units are closed first, releasing their files, then it deregisters from
// the provider; or its process dies, its file locks go with it, and the
// provider expires it — etcd's lease TTL, Consul's TTL check; the test
// provider never expires a member, only Close removes one), the identity
// lookup places its identities on the survivors; the next request for one
// activates it there, and the new host opens the same files: pending
// messages are pending again, processed ones processed, every applied
// event retained. A moved unit is not otherwise rebuilt; nothing but its
// files carries over.
//
// This needs every member to see the same files at Config.Root: on one
// machine (tests, several processes) a local directory; across machines a
// shared or replicated volume that moves with the unit and honours flock
// (for example a network block device attached to the new host, or a
// cluster filesystem with POSIX locks) — or replicated units, below.
//
// # Replicated units
//
// With ClusterConfig.Replicas ≥ 2 every member has a data root of its
// own, and each unit's files are replicated on that many members by
// Raft (package replication, hashicorp/raft): units are spread over
// ClusterConfig.Replication.Partitions consensus groups by the hash of
// their path (unit path = <kind>/<hex(identity)>), and each member runs
// one group per partition it holds, so groups, goroutines and fsyncs
// stay bounded however many units there are. The groups' membership
// follows the cluster's (etcd's): the replication address is published
// in the member id (name@system@replication-address) and every view
// change hands the engine the members. With more members than Replicas
// each partition's voters are Replicas of them (rendezvous hashing in
// the engine); a member that is none of a partition's voters learns its
// leader from the leads the members publish in the cluster's gossip
// (leadertable.go), for routing and for attribution (MemberOf).
//
//   - One serving replica, fenced. A unit is served only by its
//     partition's leader: the identity lookup (leaderLookup) places it
//     there, a member's activator passes a request it receives for
//     another leader's unit on to it (router-only members send requests
//     to the leader the members' published leads name, or, while they
//     know none, to a member's activator), and check refuses
//     elsewhere (ErrNotOwner). A new leader serves a partition only after
//     a barrier (it applied everything committed before its term); losing
//     the lead closes the partition's units at once.
//   - Acknowledged means committed on a quorum. A unit's node opens its
//     node.db through the engine (runtime.Config.OpenStore): every write
//     transaction is one log entry, visible and acknowledged only once a
//     quorum holds it and it was applied here. A deposed leader's write
//     fails by the Raft term (ErrNotOwner to the caller, which retries on
//     the leader, and the unit is closed); before any reply, the leader
//     confirms with a quorum that it still leads (VerifyLeader), so no
//     member answers as current after its successor served.
//   - Replicated beside node.db: the unit's storage key (hosting.key,
//     created at its first activation), owner file and activation epoch,
//     written through the log by the leader. No mark files are kept
//     (runtime.Config.NoMarkFiles): a replica's node.db is a prefix of
//     the committed log and cannot go back in time, and one rebuilt from
//     a snapshot must not look restored. Tenant quota markers are not
//     replicated (each member counts what it created).
//   - Disk loss. A member restarted with an empty data root is rebuilt
//     by its partitions' leaders (snapshot, then the log); nothing
//     acknowledged is lost while a quorum of every partition survives.
//
// See docs/operations.md, "Hosting on several machines: replicated
// units".
//
// # Cost of protoactor's cluster at the pinned version
//
// StartMember sleeps 1 s and a graceful Shutdown 2 s per member; a request
// in flight to a member that leaves the caller's view is abandoned and
// retried at once on the unit's new owner (the remote is configured with
// one dial attempt, so failing over is quick); several remotes in
// one process trip -race inside protoactor's remote, so the cluster test
// (TestClusterMemberLoss) runs the cluster in a child process built
// without -race (internal/clusterdemo), while the same scenario runs
// under -race on in-process shards (TestShardedMemberLoss). The etcd
// crash test (TestClusterCrashEtcd) runs each member in its own process
// (internal/etcdcluster) so one can be SIGKILLed or SIGSTOPped.
package hosting
