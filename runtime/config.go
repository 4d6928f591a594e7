package runtime

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// Config configures a Node. The zero value of every optional field is a
// sane default: embedded bbolt under Dir, quiet logs, a private metrics
// registry, the system wall clock.
type Config struct {
	// Dir holds the node's bbolt file (node.db) and, unless StorageKey is
	// set, its storage key file (storage.key, mode 0600). Required unless
	// InMemory.
	Dir string
	// InMemory keeps everything in memory (no encryption at rest): tests
	// and ephemeral nodes.
	InMemory bool
	// MeshID is the mesh this node belongs to; it is every signature's
	// external_aad. Required when the node is created; must match after.
	MeshID []byte
	// Scope lists the "schema/table" patterns (path.Match wildcards) the
	// node syncs. Empty: everything.
	Scope []string
	// StorageKey is the 32-byte storage key; empty: the key file in Dir.
	StorageKey []byte
	// PreviousStorageKeys are older storage keys (same forms as StorageKey)
	// still accepted for opening records, to rotate a configured key: Open
	// re-seals every record under a previous key with StorageKey before it
	// returns (interrupted, the next Open resumes), after which they can be
	// removed. Requires StorageKey; key-file nodes use RotateStorageKey.
	PreviousStorageKeys [][]byte
	// Logger receives the node's and protoactor's logs. Nil: discarded.
	Logger *slog.Logger
	// Registerer receives the node's Prometheus metrics. Nil: a private
	// registry, readable through Node.Gatherer.
	Registerer prometheus.Registerer
	// MetricsNode, when set, adds the constant label node="<MetricsNode>"
	// to every metric of this node, so nodes sharing one Registerer can be
	// told apart (otherwise their series add up). Set it on every node of
	// a shared registry or on none: Prometheus refuses one metric name with
	// two label sets.
	MetricsNode string
	// Wall is the wall clock. Nil: time.Now. Tests inject their own.
	Wall func() time.Time
	// System hosts the node's actors. Nil: the node creates and owns one.
	// Several nodes may share one system (multi-tenant hosting).
	System *actor.ActorSystem
	// NoSync skips fsync in bbolt. Never for data you keep: tests only.
	NoSync bool
	// Failpoint is called at named storage points (see persistence/bolt,
	// and replicate.FailpointRecordPush);
	// a non-nil error aborts there. Tests only.
	Failpoint func(name string) error
	// AddColumnChunk is how many rows one transaction of an AddColumn
	// rebuild rewrites. Zero: DefaultAddColumnChunk.
	AddColumnChunk int
	// LockTimeout bounds how long Open waits for the bbolt file lock held
	// by another process. Zero: 5 s.
	LockTimeout time.Duration
	// CloseTimeout bounds how long Close waits for actors to drain.
	// Zero: 30 s.
	CloseTimeout time.Duration

	// Trusted are peer signing keys added to the keyring (persisted, as
	// Node.Trust would) when the node opens, before any transport serves:
	// events pushed by these peers the moment the node listens are
	// verified, never dropped for an unknown kid. An entry replaces a
	// stored key of the same kid (its cutoff included); keys trusted
	// earlier and not listed stay trusted.
	Trusted []PeerKey

	// Restored says Dir was restored from a backup as a whole (node.db
	// and its clock mark file alike), so the node cannot know from its
	// files the highest HLC it released (SSP/1 §13.5). Local writes (and
	// NextHLC, Sign) then wait after Open for evidence: reconciliations
	// this node starts (Node.Reconcile, or the ones AddPeer and AcceptPeer
	// trigger, retried with backoff until they succeed) in which peers
	// answered, and held events in, every synced table that holds this
	// node's own events — a peer that does not sync a table, or holds
	// nothing of it, is no evidence. Node.ReleaseRestoreHold is the
	// operator's explicit release. A write waits at most RestoreWait,
	// then fails with ErrAwaitingReconcile (Node.RestoreStatus says
	// whether the hold is on). A node.db restored alone needs no flag.
	// See docs/operations.md "Backup and restore".
	Restored bool
	// RestoreWait bounds a local write's wait under Restored. Zero:
	// DefaultRestoreWait (30 s).
	RestoreWait time.Duration

	// Name is how this node's peers know it: the sender name of its pushes
	// (SSP/1 §14). Empty: the site id in hex.
	Name string
	// SyncInterval is the sync cycle: each peer's sender pushes at least
	// this often, and the retry unit of a failed push is the next cycle
	// (SSP/1 §14.1). Zero: 1 s. Negative: no timer; cycles run only through
	// SyncNow (deterministic tests).
	SyncInterval time.Duration
	// ReconcileInterval is how often the node reconciles with every peer
	// (set reconciliation repairs what cursors skipped); it also
	// reconciles on AddPeer and on Trust of a new key. Zero:
	// DefaultReconcileInterval (10 min). Negative: only Node.Reconcile
	// (deterministic tests).
	ReconcileInterval time.Duration
	// PushBatch is the most events one push carries. Zero: 1 000.
	PushBatch int
	// PushTimeout bounds one push. Zero: 30 s.
	PushTimeout time.Duration
	// PushWindow is how many pushes to one peer may be in flight while it
	// catches up (timer-driven cycles). Zero: 4.
	PushWindow int
	// IgnorePeerWatermarks makes senders offer everything past their
	// cursors, without skipping what peers' watermarks show they applied.
	// Watermarks are an optimization (SSP/1 §14.2); this exists to show it.
	IgnorePeerWatermarks bool
	// ChangeLogLimit is how many row changes the node retains for Watch
	// (the newest; older ones are trimmed in the transaction that adds
	// new ones). A watcher that resumes from before the oldest retained
	// change gets a *WatchLagError. Zero: DefaultChangeLogLimit.
	ChangeLogLimit int
	// NoticeQueue is how many notices a Subscribe callback may fall
	// behind by; the notices past it are not kept but counted, and the
	// callback receives one messages.NoticesMissed in their place. Zero:
	// DefaultNoticeQueue.
	NoticeQueue int

	// MetricsAddr, when set (host:port; port 0 picks one), serves the
	// node's Prometheus metrics on /metrics, its health on /healthz
	// (200 while open with storage answering, 503 otherwise) and the
	// read-only JSON admin endpoint under /admin/ (status, peers,
	// watermarks, inbound, messages; see Node.Status). See
	// Node.MetricsAddr.
	MetricsAddr string
	// AdminToken, when set, turns on the admin endpoint's state-changing
	// actions (POST /admin/sync), which then need the header
	// "Authorization: Bearer <AdminToken>". Empty: the admin endpoint is
	// read-only. Use a long random value; the listener is plain HTTP.
	AdminToken string

	// Remote, when set, starts protoactor-go's remote (gRPC) transport on
	// the node's actor system and serves this node's sync pushes on it
	// (Node.Remote). Nil: no network listener.
	Remote *RemoteConfig

	// Device turns on the delivery plane: end-to-end encrypted messages
	// with a commit boundary, on the same actor system and storage. Nil:
	// the node syncs tables only.
	Device *DeviceConfig

	// OpenStore, when set, opens node.db in place of bolt.Open, with the
	// options the node would use (path, sealer, lock timeout...): the
	// caller may add its own (a bolt.Options Committer that replicates
	// every write set before it is visible) and keep the *bolt.DB. The
	// node calls release (when not nil) after its last write, then closes
	// the DB; when Open fails after OpenStore, both happen before it
	// returns. Not with InMemory.
	OpenStore func(path string, opts bolt.Options) (db *bolt.DB, release func(), err error)
	// NoMarkFiles keeps no mark files beside node.db (clock.mark,
	// delivery.mark, changes.mark) and does not compare node.db with
	// them at Open. Those files exist to notice a node.db that went back
	// in time (restored from a copy): SSP/1 §13.5's HLC must never be
	// issued twice, a delivery session must not reuse ratchet state, a
	// change sequence must not be handed out twice. A store whose history
	// is a replicated log applied in order (OpenStore with a committer
	// that returns only after a quorum holds the write) cannot go back:
	// every replica, including one rebuilt from a snapshot with no files
	// beside it, holds a prefix of the same committed log, and the one
	// that writes holds all of it. For such a store the marks are both
	// useless and wrong (a rebuilt replica would look restored). It
	// requires OpenStore and StorageKey (a key file in Dir is not
	// replicated).
	NoMarkFiles bool

	// openFault, tests only, is called after each phase of Open (its name
	// from openPhases); an error fails Open there (closers.go).
	openFault func(phase string) error
}

// ConfigError names the Config field that is wrong.
type ConfigError struct {
	Field  string
	Reason string
}

// Error implements the error interface.
func (e *ConfigError) Error() string { return fmt.Sprintf("runtime: config %s: %s", e.Field, e.Reason) }

func (c *Config) validate() error {
	if !c.InMemory && c.Dir == "" {
		return &ConfigError{"Dir", "required unless InMemory"}
	}
	if len(c.Name) > 256 {
		return &ConfigError{"Name", "at most 256 bytes"}
	}
	if c.ChangeLogLimit < 0 {
		return &ConfigError{"ChangeLogLimit", "0 (the default) or more"}
	}
	if c.NoticeQueue < 0 {
		return &ConfigError{"NoticeQueue", "0 (the default) or more"}
	}
	if c.PushWindow < 0 || c.PushWindow > replicate.MaxWindow {
		return &ConfigError{"PushWindow", fmt.Sprintf("between 0 and %d", replicate.MaxWindow)}
	}
	if c.PushBatch < 0 || c.PushBatch > messages.MaxPushEvents {
		return &ConfigError{"PushBatch", fmt.Sprintf("between 0 and %d", messages.MaxPushEvents)}
	}
	if len(c.MeshID) > 64 {
		return &ConfigError{"MeshID", "at most 64 bytes"}
	}
	if len(c.StorageKey) != 0 && len(c.StorageKey) != 32 && len(c.StorageKey) != 64 {
		return &ConfigError{"StorageKey", "32 raw bytes or 64 hex characters"}
	}
	if len(c.PreviousStorageKeys) > 0 && len(c.StorageKey) == 0 {
		return &ConfigError{"PreviousStorageKeys", "requires StorageKey (key-file nodes rotate with RotateStorageKey)"}
	}
	for i, k := range c.PreviousStorageKeys {
		if len(k) != 32 && len(k) != 64 {
			return &ConfigError{fmt.Sprintf("PreviousStorageKeys[%d]", i), "32 raw bytes or 64 hex characters"}
		}
	}
	for i, k := range c.Trusted {
		if len(k.PublicKey) != ed25519.PublicKeySize {
			return &ConfigError{fmt.Sprintf("Trusted[%d]", i), fmt.Sprintf("public key must be %d bytes", ed25519.PublicKeySize)}
		}
		if len(k.Kid) > sign.MaxKidLen {
			return &ConfigError{fmt.Sprintf("Trusted[%d]", i), fmt.Sprintf("kid must be at most %d bytes", sign.MaxKidLen)}
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		return &ConfigError{"AdminToken", "at least 16 characters"}
	}
	if c.AdminToken != "" && c.MetricsAddr == "" {
		return &ConfigError{"AdminToken", "needs MetricsAddr (the admin endpoint is served there)"}
	}
	if len(c.MetricsNode) > 256 {
		return &ConfigError{"MetricsNode", "at most 256 bytes"}
	}
	if c.LockTimeout < 0 {
		return &ConfigError{"LockTimeout", "must not be negative"}
	}
	if c.RestoreWait < 0 {
		return &ConfigError{"RestoreWait", "must not be negative"}
	}
	if c.CloseTimeout < 0 {
		return &ConfigError{"CloseTimeout", "must not be negative"}
	}
	if c.OpenStore != nil && c.InMemory {
		return &ConfigError{"OpenStore", "not with InMemory"}
	}
	if c.NoMarkFiles && (c.OpenStore == nil || len(c.StorageKey) == 0) {
		return &ConfigError{"NoMarkFiles", "only for a replicated store: requires OpenStore and StorageKey"}
	}
	return nil
}

// markFiles reports whether the node keeps mark files beside node.db.
func (c *Config) markFiles() bool { return !c.InMemory && !c.NoMarkFiles }

func (c *Config) dbPath() string  { return filepath.Join(c.Dir, "node.db") }
func (c *Config) keyPath() string { return filepath.Join(c.Dir, "storage.key") }
