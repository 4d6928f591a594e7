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
	cfg     Config
	log     *slog.Logger
	system  *actor.ActorSystem
	ownSys  bool
	db      *bolt.DB
	store   persistence.SyncStore
	signer  *sign.Signer
	meshID  []byte
	keyring atomic.Pointer[sign.Keyring]
	clock   *clock.Clock
	router  *syncgroup.Router
	apply   *apply.Chokepoint
	metrics *metrics
	gather  prometheus.Gatherer

	registerer prometheus.Registerer
	name       string
	own        *replicate.OwnWrites
	sync       *replicate.Service
	device     *device.Device
	dstore     persistence.DeliveryStore
	remote     *Remote
	txLatency  *prometheus.HistogramVec
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
	closeOnce sync.Once
	closeErr  error
	subsMu    sync.Mutex
	subs      map[uint64]noticeSub
	subSeq    uint64
	dlSub     *eventstream.Subscription
}

// Open opens (or creates) a node. Creating needs Config.MeshID; the node's
// site id and Ed25519 signing key are generated once and kept sealed.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
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
	reg := cfg.Registerer
	if reg == nil {
		// A private registry is the process's only one: it also carries the
		// Go runtime and process collectors a scrape expects.
		r := prometheus.NewRegistry()
		if err := r.Register(collectors.NewGoCollector()); err != nil {
			return nil, fmt.Errorf("runtime: metrics: %w", err)
		}
		if err := r.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, fmt.Errorf("runtime: metrics: %w", err)
		}
		reg, n.gather = r, r
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		n.gather = g
	}
	if cfg.MetricsNode != "" {
		// Every series of this node carries node="<MetricsNode>", so nodes
		// sharing a registry stay apart instead of adding up.
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": cfg.MetricsNode}, reg)
	}
	var err error
	n.registerer = reg
	if n.metrics, err = newMetrics(reg); err != nil {
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	scope, err := apply.ParseScope(cfg.Scope)
	if err != nil {
		return nil, &ConfigError{"Scope", err.Error()}
	}
	if err := n.openStore(ctx); err != nil {
		return nil, err
	}
	if n.mailboxes, err = mailbox.NewDepths(reg); err != nil {
		_ = n.closeStore()
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	if n.txLatency, err = newTxLatency(reg); err != nil {
		_ = n.closeStore()
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	n.store = timedSync{SyncStore: n.store, update: n.txLatency.WithLabelValues("sync", "update"), view: n.txLatency.WithLabelValues("sync", "view")}
	n.store = n.changes.wrap(n.store, n.cfg.ChangeLogLimit) // watch.go
	n.store = syncgroup.CheckWriters(n.store)               // invariants tag: every writer checked
	ok := false
	defer func() {
		if !ok {
			_ = n.closeStore()
		}
	}()
	if err := n.loadIdentity(ctx); err != nil {
		return nil, err
	}
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
		return nil, fmt.Errorf("runtime: load state: %w", err)
	}
	if err := n.loadKeyring(keys); err != nil {
		return nil, err
	}
	if n.clock, err = n.openClock(hw); err != nil { // restore.go: above the clock mark file too
		return nil, err
	}
	n.own = replicate.NewOwnWrites(n.clock.Last())

	if cfg.System != nil {
		n.system = cfg.System
	} else {
		// protoactor's lifecycle and peer-shutdown noise go below INFO.
		logger := ProtoactorLogger(n.log)
		n.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
		n.ownSys = true
	}
	if n.ownSys {
		// Dead letters are the actor system's: counted by the node that owns
		// it. A host sharing one system among many nodes counts them once
		// with CountDeadLetters (a subscription per node would count each
		// dead letter once per node and slow every publish).
		n.dlSub = subscribeDeadLetters(n.system, n.metrics.deadLetters)
	}
	n.router = syncgroup.NewRouter(n.system, n.signer.Site().String()[:8], syncgroup.Deps{
		Store:     n.store,
		Notify:    n.publish,
		Observe:   n.clock.Observe,
		Count:     n.metrics.count,
		Logger:    n.log,
		Mailboxes: n.mailboxes,
	})
	n.apply = apply.New(apply.Config{
		MeshID:  n.meshID,
		Keyring: &n.keyring,
		Clock:   n.clock,
		Scope:   scope,
		Router:  n.router,
		Notify:  n.publish,
		Count:   n.metrics.count,
		Logger:  n.log,
		Stopped: n.stopped,
	})
	n.name = cfg.Name
	if n.name == "" {
		n.name = n.signer.Site().String()
	}
	err = n.startDelivery(ctx, scope)
	// A crash between DefineTable and the release of its held groups
	// leaves groups held for a table that now exists: release them.
	if err == nil {
		err = n.releaseDefined(ctx, "")
	}
	if err == nil {
		err = n.rebuildColumns(ctx) // tables.go: an AddColumn a crash interrupted
	}
	if err == nil && cfg.MetricsAddr != "" {
		err = n.startHTTP(cfg.MetricsAddr)
	}
	if err == nil && cfg.Remote != nil {
		rc := *cfg.Remote
		if rc.Logger == nil {
			rc.Logger = n.log
		}
		if rc.Registerer == nil {
			rc.Registerer = n.registerer
		}
		if n.remote, err = StartRemote(n.system, rc); err == nil {
			n.remote.Serve(n)
		}
	}
	if err == nil {
		err = n.openDevice(ctx)
	}
	if err == nil && n.remote != nil && n.device != nil {
		n.remote.ServeDevice(n)
	}
	if err == nil {
		err = n.startReconcile() // reconcile.go; last: starts nothing when it fails
	}
	if err != nil {
		_ = n.stopHTTP()
		if n.remote != nil {
			_ = n.remote.Close()
		}
		if n.device != nil {
			_ = n.device.Close()
			_ = n.dstore.Close()
		}
		if n.sync != nil {
			n.sync.Close()
		}
		n.router.Stop(n.cfg.CloseTimeout)
		n.shutdownSystem()
		return nil, err
	}
	ok = true
	return n, nil
}

func (n *Node) openStore(ctx context.Context) error {
	if n.cfg.InMemory {
		n.store = memory.New()
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
	n.db, err = bolt.Open(n.cfg.dbPath(), bolt.Options{Sealer: sealer, NoSync: n.cfg.NoSync, Failpoint: n.cfg.Failpoint, Logger: n.log, Timeout: n.cfg.LockTimeout})
	if errors.Is(err, persistence.ErrLocked) {
		return fmt.Errorf("%w: %s (gave up after %v)", ErrLocked, n.cfg.dbPath(), n.cfg.LockTimeout)
	}
	if err != nil {
		return fmt.Errorf("runtime: open store: %w", err)
	}
	n.store = n.db.Sync()
	if reseal {
		if err := n.resealPrevious(ctx); err != nil {
			_ = n.closeStore()
			return err
		}
	}
	return nil
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
func (n *Node) Close() error {
	first := false
	n.closeOnce.Do(func() {
		first = true
		close(n.closed)
		n.stopReconcile() // reconcile.go: background runs end before the actors stop
		devErr := n.stopHTTP()
		if n.remote != nil {
			devErr = errors.Join(devErr, n.remote.Close())
		}
		if n.device != nil {
			// Messages not yet handed to the application stay pending and
			// are delivered again on the next Open.
			devErr = errors.Join(devErr, n.device.Close())
		}
		n.sync.Close() // senders stop; the progress actor records what it holds
		n.router.Stop(n.cfg.CloseTimeout)
		close(n.stopped)
		n.subsMu.Lock()
		for _, sub := range n.subs {
			if sub.owns {
				n.system.Root.Stop(sub.pid)
			}
		}
		n.subs = nil
		n.subsMu.Unlock()
		if n.dlSub != nil {
			n.system.EventStream.Unsubscribe(n.dlSub)
		}
		n.shutdownSystem()
		if n.dstore != nil {
			devErr = errors.Join(devErr, n.dstore.Close())
		}
		n.closeErr = errors.Join(devErr, n.closeStore())
	})
	if !first {
		return nil
	}
	return n.closeErr
}

// closeStore closes the sync handle and, for bbolt, the file itself.
func (n *Node) closeStore() error {
	err := n.store.Close()
	if n.db != nil {
		err = errors.Join(err, n.db.Close())
	}
	return err
}

func (n *Node) shutdownSystem() {
	if n.ownSys {
		n.system.Shutdown()
	}
}

func (n *Node) isClosed() bool {
	select {
	case <-n.closed:
		return true
	default:
		return false
	}
}
