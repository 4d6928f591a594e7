package runtime

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/actors/clock"
	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/mailbox"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

const (
	metaSiteID    = "site_id"
	metaMeshID    = "mesh_id"
	metaHighWater = "hlc_high_water"
	metaNodeKey   = "node_key"

	defaultSyncInterval = time.Second
)

// Node is one syncmesh peer: its storage, its actors and its public API.
// All methods are safe for concurrent use.
type Node struct {
	cfg    Config
	log    *slog.Logger
	system *actor.ActorSystem
	db     *bolt.DB
	// releaseDB is Config.OpenStore's release (nil: none).
	releaseDB func()
	store     persistence.SyncStore
	signer    *sign.Signer
	meshID    []byte
	keyring   atomic.Pointer[sign.Keyring]
	clock     *clock.Clock
	router    *syncgroup.Router
	apply     *apply.Chokepoint
	scope     apply.Scope // Config.Scope, parsed
	metrics   *metrics
	gather    prometheus.Gatherer

	registerer prometheus.Registerer
	name       string
	own        *replicate.OwnWrites
	sync       *replicate.Service
	device     *device.Device
	dstore     persistence.DeliveryStore
	remote     *Remote
	txLatency  *prometheus.HistogramVec
	conflicts  prometheus.Counter // syncmesh_delivery_message_conflicts_total (conflicts.go)
	lostAcked  prometheus.Counter // syncmesh_delivery_lost_sends_acknowledged_total (conflicts.go)
	mailboxes  *mailbox.Depths
	httpSrv    *http.Server
	httpAddr   string
	recon      reconState     // set reconciliation (reconcile.go)
	restore    restoreState   // restore safety (restore.go)
	changes    changeFeed     // the change log's wake-ups (watch.go)
	deliveries deliveryCounts // OnMessage's delivery counts (delivered.go)

	// ddl orders keyring changes (the in-memory keyring with the stored
	// one); the store itself is written only by the sync committer.
	ddl sync.Mutex

	closed    chan struct{} // closed when Close starts
	stopped   chan struct{} // closed when the actors have drained
	closers   closerStack   // what Open opened, unwound by Close (closers.go)
	closeOnce sync.Once
	closeErr  error
	subsMu    sync.Mutex
	subs      map[uint64]noticeSub
	subSeq    uint64
	dlSub     *eventstream.Subscription
}

// Open opens (or creates) a node. Creating needs Config.MeshID; the node's
// site id and Ed25519 signing key are generated once and kept sealed.
//
// Opening runs the phases of openPhases in order. Each pushes what it
// opens on the node's closer stack, which an error in a later phase
// unwinds, as Close does: a failed Open leaves nothing open (the bbolt
// file lock released, no goroutine left).
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := newNode(cfg)
	if err := runPhases(n.openPhases(ctx), cfg.openFault); err != nil {
		_ = n.Close() // unwinds what the earlier phases opened
		return nil, err
	}
	return n, nil
}

// newNode is a node with Config's defaults filled in and nothing opened.
func newNode(cfg Config) *Node {
	n := &Node{cfg: cfg, log: cfg.Logger, closed: make(chan struct{}), stopped: make(chan struct{}), subs: map[uint64]noticeSub{}}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Wall == nil {
		n.cfg.Wall = time.Now
	}
	if cfg.LockTimeout == 0 {
		n.cfg.LockTimeout = 5 * time.Second
	}
	if cfg.CloseTimeout == 0 {
		n.cfg.CloseTimeout = 30 * time.Second
	}
	return n
}

// openPhases are the steps of Open, in order; the closers they push
// unwind in reverse (see closerStack): the background reconciliation
// first, then the listeners, the device, the sync service, the router,
// the actor system, storage last.
func (n *Node) openPhases(ctx context.Context) []phase {
	return []phase{
		{"metrics", n.openMetrics},
		{"store", func() error { return n.openStore(ctx) }},
		{"identity", func() error { return n.loadIdentity(ctx) }},
		{"clock", func() error { return n.loadClock(ctx) }},
		{"changes", func() error { return n.openChangeLog(ctx) }}, // changemark.go
		{"actors", n.startActors},
		{"sync", func() error { return n.startSync(ctx) }},
		// A crash between DefineTable and the release of its held groups
		// leaves groups held for a table that now exists: release them.
		{"release", func() error { return n.releaseDefined(ctx, "") }},
		{"rebuild", func() error { return n.rebuildColumns(ctx) }}, // tables.go: an AddColumn a crash interrupted
		{"indexes", func() error { return n.buildIndexes(ctx) }},   // indexbuild.go: an index build a crash interrupted
		{"remote", n.startRemote},
		{"device", func() error { return n.startDevice(ctx) }},
		{"http", n.startMetricsHTTP},
		{"reconcile", n.startReconcileSchedule}, // reconcile.go
	}
}

// openMetrics sets up the registry (a private one unless
// Config.Registerer), the node's metrics and Config.Scope.
func (n *Node) openMetrics() error {
	reg := n.cfg.Registerer
	if reg == nil {
		// A private registry is the process's only one: it also carries the
		// Go runtime and process collectors a scrape expects.
		r := prometheus.NewRegistry()
		if err := r.Register(collectors.NewGoCollector()); err != nil {
			return fmt.Errorf("runtime: metrics: %w", err)
		}
		if err := r.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return fmt.Errorf("runtime: metrics: %w", err)
		}
		reg, n.gather = r, r
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		n.gather = g
	}
	if n.cfg.MetricsNode != "" {
		// Every series of this node carries node="<MetricsNode>", so nodes
		// sharing a registry stay apart instead of adding up.
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": n.cfg.MetricsNode}, reg)
	}
	var err error
	n.registerer = reg
	if n.metrics, err = newMetrics(reg); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	if n.scope, err = apply.ParseScope(n.cfg.Scope); err != nil {
		return &ConfigError{"Scope", err.Error()}
	}
	if n.mailboxes, err = mailbox.NewDepths(reg); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	if n.txLatency, err = newTxLatency(reg); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	return nil
}

// loadClock reads the stored clock mark and keyring, and builds the
// clock above the mark (restore.go: above the clock mark file too).
func (n *Node) loadClock(ctx context.Context) error {
	var hw messages.HLC
	var keys []persistence.KeyEntry
	if err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		b, found, err := tx.Meta(metaHighWater)
		if err != nil {
			return err
		}
		if found && len(b) == 8 {
			hw = messages.HLC(binary.BigEndian.Uint64(b))
		}
		keys, err = tx.Keys()
		return err
	}); err != nil {
		return fmt.Errorf("runtime: load state: %w", err)
	}
	if err := n.loadKeyring(keys); err != nil {
		return err
	}
	var err error
	if n.clock, err = n.openClock(ctx, hw); err != nil {
		return err
	}
	n.closers.push(n.closeClockMarks) // restore.go
	if err := n.registerHeldMetric(); err != nil {
		return err
	}
	floor, err := n.ownFloor(ctx, n.clock.Last())
	if err != nil {
		return fmt.Errorf("runtime: load state: %w", err)
	}
	n.own = replicate.NewOwnWrites(floor)
	return nil
}

// ownFloor is where the own groups' watermark resumes at Open (SSP/1
// §14.2): the newest own event in the log. The clock resumes from its
// persisted high-water mark, up to a lease (clock.DefaultLease) above the
// last value it issued; stating the own watermark at the mark claimed
// nothing false (nothing was issued above the mark), but it sat up to a
// lease in the future, where no peer's watermark of the group can reach
// (a receiver caps a raise at its own HLC), so an idle, converged mesh
// read as that far behind. The newest own event lies within a lease below
// the mark, and a lower floor only claims less; when the log holds none
// there, every own event lies below mark − lease, which is claimed.
func (n *Node) ownFloor(ctx context.Context, mark messages.HLC) (messages.HLC, error) {
	lease := messages.HLC(uint64(clock.DefaultLease.Milliseconds()) << 16)
	if mark <= lease {
		return mark, nil
	}
	floor := mark - lease
	self := n.signer.Site()
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		return tx.SiteEventIDs(self, floor, mark, func(h messages.HLC, _ persistence.EventID) (bool, error) {
			floor = max(floor, h)
			return true, nil
		})
	})
	return floor, err
}

// startActors starts (or joins, with Config.System) the actor system and
// spawns the sync plane's router and chokepoint on it.
func (n *Node) startActors() error {
	if n.cfg.System != nil {
		n.system = n.cfg.System
	} else {
		// protoactor's lifecycle and peer-shutdown noise go below INFO.
		logger := ProtoactorLogger(n.log)
		n.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
		n.closers.pushFunc(n.system.Shutdown)
		// Dead letters are the actor system's: counted by the node that owns
		// it. A host sharing one system among many nodes counts them once
		// with CountDeadLetters (a subscription per node would count each
		// dead letter once per node and slow every publish).
		n.dlSub = subscribeDeadLetters(n.system, n.metrics.deadLetters)
		n.closers.pushFunc(func() { n.system.EventStream.Unsubscribe(n.dlSub) })
	}
	n.closers.pushFunc(n.stopSubscribers)
	n.closers.pushFunc(func() { close(n.stopped) }) // once the router drained: see apply.Config.Stopped
	n.router = syncgroup.NewRouter(n.system, n.signer.Site().String()[:8], syncgroup.Deps{
		Store:     n.store,
		Notify:    n.publish,
		Observe:   n.clock.Observe,
		Count:     n.metrics.count,
		Logger:    n.log,
		Mailboxes: n.mailboxes,
	})
	n.closers.pushFunc(func() { n.router.Stop(n.cfg.CloseTimeout) })
	n.apply = apply.New(apply.Config{
		MeshID:  n.meshID,
		Keyring: &n.keyring,
		Clock:   n.clock,
		Scope:   n.scope,
		Router:  n.router,
		Notify:  n.publish,
		Count:   n.metrics.count,
		Logger:  n.log,
		Stopped: n.stopped,
	})
	return nil
}

// stopSubscribers stops the actors Subscribe spawned; later Subscribe
// calls subscribe nothing.
func (n *Node) stopSubscribers() {
	n.subsMu.Lock()
	defer n.subsMu.Unlock()
	for _, sub := range n.subs {
		sub.stop()
	}
	n.subs = nil
}

// startSync starts the sync service (delivery.go): senders stop and the
// progress actor records what it holds when it closes.
func (n *Node) startSync(ctx context.Context) error {
	n.name = n.cfg.Name
	if n.name == "" {
		n.name = n.signer.Site().String()
	}
	if err := n.startDelivery(ctx, n.scope); err != nil {
		return err
	}
	n.closers.pushFunc(n.sync.Close)
	return nil
}

// startRemote starts Config.Remote's transport, serving this node.
func (n *Node) startRemote() error {
	if n.cfg.Remote == nil {
		return nil
	}
	rc := *n.cfg.Remote
	if rc.Logger == nil {
		rc.Logger = n.log
	}
	if rc.Registerer == nil {
		rc.Registerer = n.registerer
	}
	r, err := StartRemote(n.system, rc)
	if err != nil {
		return err
	}
	n.remote = r
	n.closers.push(r.Close)
	r.Serve(n)
	return nil
}

// startDevice opens Config.Device's delivery plane (messaging.go) and
// serves it on the remote. Messages not yet handed to the application
// when it closes stay pending and are delivered again on the next Open.
func (n *Node) startDevice(ctx context.Context) error {
	if err := n.openDevice(ctx); err != nil || n.device == nil {
		return err
	}
	n.closers.push(n.device.Close)
	if n.remote != nil {
		n.remote.ServeDevice(n)
	}
	return nil
}

// startMetricsHTTP serves Config.MetricsAddr (httpserver.go).
func (n *Node) startMetricsHTTP() error {
	if n.cfg.MetricsAddr == "" {
		return nil
	}
	if err := n.startHTTP(n.cfg.MetricsAddr); err != nil {
		return err
	}
	n.closers.push(n.stopHTTP)
	return nil
}

// startReconcileSchedule starts the background reconciliation
// (reconcile.go); it ends before anything else closes.
func (n *Node) startReconcileSchedule() error {
	if err := n.startReconcile(); err != nil {
		return err
	}
	n.closers.pushFunc(n.stopReconcile)
	return nil
}

func (n *Node) openStore(ctx context.Context) error {
	if n.cfg.InMemory {
		n.store = memory.New()
		n.closers.push(n.closeStore)
		n.wrapStore()
		return nil
	}
	if err := os.MkdirAll(n.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("runtime: create %s: %w", n.cfg.Dir, err)
	}
	// Storage key, previous keys and interrupted rotations: storagekey.go.
	sealer, reseal, err := n.storageSealer(ctx)
	if err != nil {
		return err
	}
	opts := bolt.Options{Sealer: sealer, NoSync: n.cfg.NoSync, Failpoint: n.cfg.Failpoint, Logger: n.log, Timeout: n.cfg.LockTimeout}
	if n.cfg.OpenStore != nil {
		n.db, n.releaseDB, err = n.cfg.OpenStore(n.cfg.dbPath(), opts)
		if err == nil && n.db == nil {
			err = errors.New("OpenStore returned no store")
		}
	} else {
		n.db, err = bolt.Open(n.cfg.dbPath(), opts)
	}
	if errors.Is(err, persistence.ErrLocked) {
		return fmt.Errorf("%w: %s (gave up after %v)", ErrLocked, n.cfg.dbPath(), n.cfg.LockTimeout)
	}
	if err != nil {
		return fmt.Errorf("runtime: open store: %w", err)
	}
	n.store = n.db.Sync()
	n.closers.push(n.closeStore)
	if reseal {
		if err := n.resealPrevious(ctx); err != nil {
			return err
		}
	}
	n.wrapStore()
	return nil
}

// wrapStore wraps the sync store in what every access goes through:
// transaction latency, the change log's wake-ups (watch.go) and, under
// the invariants tag, the writer check.
func (n *Node) wrapStore() {
	n.store = timedSync{SyncStore: n.store, update: n.txLatency.WithLabelValues("sync", "update"), view: n.txLatency.WithLabelValues("sync", "view")}
	n.store = n.changes.wrap(n.store, n.cfg.ChangeLogLimit) // watch.go
	n.store = syncgroup.CheckWriters(n.store)               // invariants tag: every writer checked
}

func (n *Node) loadIdentity(ctx context.Context) error {
	return n.store.Update(ctx, func(tx persistence.SyncTx) error {
		mesh, haveMesh, err := tx.Meta(metaMeshID)
		if err != nil {
			return err
		}
		switch {
		case haveMesh && len(n.cfg.MeshID) > 0 && !bytes.Equal(mesh, n.cfg.MeshID):
			return ErrMeshMismatch
		case !haveMesh && len(n.cfg.MeshID) == 0:
			return &ConfigError{"MeshID", "required when creating a node"}
		case !haveMesh:
			mesh = bytes.Clone(n.cfg.MeshID)
			if err := tx.PutMeta(metaMeshID, mesh); err != nil {
				return err
			}
		}
		n.meshID = mesh
		siteB, haveSite, err := tx.Meta(metaSiteID)
		if err != nil {
			return err
		}
		seed, haveKey, err := tx.SealedMeta(persistence.RecordNodeKey, metaNodeKey)
		if err != nil {
			return err
		}
		var site messages.SiteID
		if haveSite != haveKey {
			return fmt.Errorf("%w: node identity half present", persistence.ErrCorrupt)
		}
		if !haveSite {
			if _, err := rand.Read(site[:]); err != nil {
				return err
			}
			_, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			seed = priv.Seed()
			if err := tx.PutMeta(metaSiteID, site[:]); err != nil {
				return err
			}
			if err := tx.PutSealedMeta(persistence.RecordNodeKey, metaNodeKey, seed); err != nil {
				return err
			}
		} else {
			if len(siteB) != len(site) || len(seed) != ed25519.SeedSize {
				return fmt.Errorf("%w: node identity", persistence.ErrCorrupt)
			}
			copy(site[:], siteB)
		}
		n.signer = sign.NewSigner(site, ed25519.NewKeyFromSeed(seed))
		// The node trusts itself: local writes take the same apply path.
		self := n.signer.Key()
		if err := tx.PutKey(persistence.KeyEntry{Kid: self.Kid, Site: self.Site, PublicKey: self.PublicKey}); err != nil {
			return err
		}
		// Config.Trusted goes into the keyring in this transaction, before
		// the chokepoint and any transport exist: a push served the moment
		// the remote listens is verified against these keys, so the
		// ordinary start never drops a configured peer's events (SSP/1 §12
		// drops unknown kids for good).
		for _, k := range n.cfg.Trusted {
			if len(k.Kid) == 0 {
				k.Kid = sign.KidFor(k.PublicKey)
			}
			if err := tx.PutKey(persistence.KeyEntry{Kid: k.Kid, Site: k.Site, PublicKey: k.PublicKey, Cutoff: k.Cutoff}); err != nil {
				return err
			}
		}
		return nil
	})
}

func (n *Node) loadKeyring(entries []persistence.KeyEntry) error {
	keys := make([]sign.Key, 0, len(entries))
	for _, e := range entries {
		keys = append(keys, sign.Key{Kid: e.Kid, Site: e.Site, PublicKey: e.PublicKey, Cutoff: e.Cutoff})
	}
	kr, err := sign.NewKeyring(keys...)
	if err != nil {
		return fmt.Errorf("%w: keyring: %v", persistence.ErrCorrupt, err)
	}
	n.keyring.Store(kr)
	return nil
}

func (n *Node) persistHighWater(h messages.HLC) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(h))
	return n.store.Update(context.Background(), func(tx persistence.SyncTx) error {
		return tx.PutMeta(metaHighWater, b[:])
	})
}

// Identity describes this node's signing identity.
type Identity struct {
	Site      messages.SiteID
	Kid       []byte
	PublicKey ed25519.PublicKey
	MeshID    []byte
}

// Identity returns the node's site id, key id, public key and mesh id:
// what a peer needs to Trust it.
func (n *Node) Identity() Identity {
	return Identity{Site: n.signer.Site(), Kid: n.signer.Kid(), PublicKey: n.signer.PublicKey(), MeshID: bytes.Clone(n.meshID)}
}

// System returns the actor system the node runs on, for custom actors.
func (n *Node) System() *actor.ActorSystem { return n.system }

// Gatherer returns the registry holding the node's metrics when the node
// created it, or Config.Registerer when that is also a Gatherer.
func (n *Node) Gatherer() prometheus.Gatherer { return n.gather }

// Close drains the node's actors (every accepted request is committed and
// answered), then closes storage. Close is idempotent: the first call
// returns what closing met, later calls return nil (the Close rule of
// every component, see ErrClosed).
//
// Close marks the node closed (every call then returns ErrClosed) and
// unwinds the closer stack Open pushed, in the reverse of the opening
// order: the same teardown a failed Open runs.
func (n *Node) Close() error {
	first := false
	n.closeOnce.Do(func() {
		first = true
		close(n.closed)
		n.closeErr = n.closers.unwind()
	})
	if !first {
		return nil
	}
	return n.closeErr
}

// closeStore closes storage: the delivery handle (opened with the device,
// closed here, after the actor system stopped, because it is a handle of
// the same storage), the sync handle and, for bbolt, the file itself.
func (n *Node) closeStore() error {
	var err error
	if n.dstore != nil {
		err = n.dstore.Close()
	}
	err = errors.Join(err, n.store.Close())
	if n.releaseDB != nil {
		n.releaseDB()
	}
	if n.db != nil {
		err = errors.Join(err, n.db.Close())
	}
	return err
}

func (n *Node) isClosed() bool {
	select {
	case <-n.closed:
		return true
	default:
		return false
	}
}
