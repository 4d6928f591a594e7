// Package replication replicates hosted units' files on a quorum of
// members with hashicorp/raft: units are grouped into a fixed number of
// partitions, each partition one raft group per member (multi-raft), so
// groups, goroutines and fsyncs stay bounded however many units there
// are. A unit's node.db commits through a bolt.Committer (Engine.Committer):
// each write transaction becomes one log entry, applied in log order to
// every replica's copy; small files beside it go through WriteFile. See
// docs/replication.md, "Replicated units".
package replication

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

var (
	// ErrNotLeader is returned (wrapped) by a write or a fence on a member
	// that does not lead the unit's partition: nothing was proposed. Ask
	// the partition's Leader.
	ErrNotLeader = errors.New("replication: not the partition's leader")
	// ErrUnknownOutcome is returned (wrapped, with ErrNotLeader when
	// leadership was lost) when a proposed write's fate is unknown: it may
	// or may not be committed; the next leader's copy tells.
	ErrUnknownOutcome = errors.New("replication: outcome unknown")
	// ErrClosed is returned (wrapped) by calls on a closed engine; it
	// wraps persistence.ErrClosed.
	ErrClosed = persistence.NewClosedError("replication: engine closed")
	// ErrInvalidConfig is returned (wrapped) by Open and SetMembers for a
	// configuration they refuse.
	ErrInvalidConfig = errors.New("replication: invalid configuration")
	// ErrLimit is returned (wrapped) by Reserve when the unit already
	// holds its limit of files: nothing was written.
	ErrLimit = errors.New("replication: limit reached")
	// ErrTermChanged is returned (wrapped, with ErrNotLeader) by
	// CheckTerm when this member no longer leads the partition in the
	// term it was given.
	ErrTermChanged = errors.New("replication: leader term changed")
)

// Config configures Open.
type Config struct {
	// Member is this member's name: its mutual-TLS certificate's node
	// name (meshtls.NodeName), and its raft server id.
	Member string
	// Dir holds each partition's raft log and stable state (raft-wal,
	// Dir/p<N>/wal) and snapshots (Dir/p<N>/snapshots). A Dir/p<N>/raft.db
	// (raft-boltdb) of an earlier build is copied into the WAL at the
	// partition's first start and then removed.
	Dir string
	// UnitsDir holds this member's replicas of unit files:
	// UnitsDir/<unit path>/node.db and the small files beside it.
	UnitsDir string
	// Partitions is the number of raft groups (DefaultPartitions). It
	// must be the same on every member and never change for a cluster.
	Partitions int
	// Listen is the host:port replication traffic is served on
	// ("127.0.0.1:0" picks a port).
	Listen string
	// Advertise is the address other members dial (default: the bound
	// address).
	Advertise string
	// TLS (server, client certificates required) and ClientTLS (dialing)
	// secure replication with mutual TLS, from runtime/meshtls. Required
	// unless Plaintext.
	TLS, ClientTLS *tls.Config
	// Plaintext disables TLS explicitly: nothing is authenticated.
	Plaintext bool
	// Logger receives the engine's and raft's notices; nil discards them.
	Logger *slog.Logger
	// Registerer receives the engine's Prometheus metrics
	// (syncmesh_replication_*); nil registers none.
	Registerer prometheus.Registerer

	// HeartbeatTimeout, ElectionTimeout (DefaultHeartbeatTimeout,
	// DefaultElectionTimeout) and LeaderLeaseTimeout (default half the
	// heartbeat timeout): raft's timers. A follower calls an election
	// after one to two heartbeat timeouts without its leader; a leader
	// that cannot reach a quorum for the lease steps down, and its writes
	// fail.
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// SnapshotInterval (default 2 min) and SnapshotThreshold (default
	// 8192 entries) drive snapshots and log compaction; TrailingLogs
	// (default 10240) entries stay after a snapshot for slow followers.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64
	// BootstrapWait is how long a partition with no state waits to be
	// contacted by an existing leader before its lowest-named voter
	// bootstraps it (default 3 × ElectionTimeout) — and only once every
	// other member answers that none holds the partition, with the same
	// membership view. It starts as a configuration of that member
	// alone; the leader then adds the other voters.
	BootstrapWait time.Duration
	// DepartedGrace is how long a voter outside the membership stays a
	// voter when no other member is wanted in its place (default 1
	// minute): a member paused, cut off or restarting past its
	// registration's lease comes back as a voter without a
	// configuration change. With a replacement to add it is removed at
	// once.
	DepartedGrace time.Duration
	// NoSync skips fsync in the raft log and the replicas. Tests only.
	NoSync bool

	// ackBeforeCommit is a planted bug for tests: Commit acknowledges as
	// soon as the entry is proposed, before the quorum commit.
	ackBeforeCommit bool
}

// Default raft timers (Config). Take-over after a leader's SIGKILL is
// about one to two heartbeat timeouts plus the new leader's barrier and
// the callers' retry: at 1.5 s it measured 6 s at p99 on a loaded 2-core
// machine, at 750 ms it stays well within 5 s, and a machine's own
// stalls stay well inside the lease (docs/operations.md, "Election
// timeout").
const (
	DefaultHeartbeatTimeout = 750 * time.Millisecond
	DefaultElectionTimeout  = 750 * time.Millisecond
)

// commitTimeout is how long a partition's leader with nothing new to
// send waits before it tells each follower its commit index anyway
// (raft's CommitTimeout; its default). Followers learn it with the next
// entry otherwise; it only makes an idle follower apply sooner, and a
// new leader's Barrier applies whatever it had not. Every tick is an
// AppendEntries RPC through the follower's raft loop, per partition and
// follower: at 5 ms, 16 idle partitions kept about a third of a core
// busy on three members, competing with the busy partitions'
// commits.
const commitTimeout = 50 * time.Millisecond

// DefaultPartitions is Config.Partitions' default.
const DefaultPartitions = 16

// Peer is a member as SetMembers takes it: its name and the address its
// replication listener is reached at.
type Peer struct{ Member, Addr string }

// LeaderChange says who leads a partition now. Changes are coalesced: a
// consumer sees the latest state of every partition that changed, never
// a queue of stale ones.
type LeaderChange struct {
	Partition int
	// Leader is the leading member ("" while none is known).
	Leader string
	// Term is the raft term the observation was made in.
	Term uint64
	// Self reports that this member leads.
	Self bool
}

// Stats is a snapshot of the engine's state.
type Stats struct {
	// Partitions is Config.Partitions; Running counts the partitions with
	// a raft group on this member, Leading those it leads.
	Partitions, Running, Leading int
	// CatchingUp counts the partitions this member is a wanted voter of
	// that it started with no raft state (a new member, or a lost disk)
	// and that do not vote yet: they have not caught up with what their
	// group had committed. Replace one disk at
	// a time, and the next only once this is 0 on the last.
	CatchingUp int
	// Units counts the unit replicas on this member.
	Units int
	// RefusedConnections counts connections refused for a certificate
	// that names no current member.
	RefusedConnections uint64
	// Snapshots counts the snapshots this member took, Restores the
	// snapshots it installed (a replica rebuilt from another member).
	Snapshots, Restores uint64
	// ApplyErrors counts entries that failed to apply here (logged; the
	// replica is behind until a snapshot replaces it).
	ApplyErrors uint64
}

// Engine is one member's side of the replicated partitions.
type Engine struct {
	cfg  Config
	log  *slog.Logger
	hlog hclog.Logger
	addr string
	mux  *mux

	stores []*store // per partition, whether or not its group runs here

	mu       sync.Mutex
	peers    map[string]string // member → address
	byAddr   map[string]string // address → member
	replicas int
	parts    []*partition
	closed   bool
	probing  map[int]bool         // partitions this member is deciding to bootstrap
	departed map[string]time.Time // voters seen outside the membership, since when

	dirty    []bool
	notify   chan struct{}
	leaderCh chan LeaderChange
	kick     chan struct{}
	done     chan struct{}
	wg       sync.WaitGroup
	refused  atomic.Uint64

	snapshots, restores, applyErrors atomic.Uint64
	coll                             *collector
}

type partition struct {
	p       int
	raft    *raft.Raft
	trans   *raft.NetworkTransport
	logs    logStore
	started time.Time
	fresh   bool // no raft state when started
	guard   *voteGuard
}

// Open starts the member's replication listener and restores the unit
// index. Raft groups start with SetMembers.
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, log: cfg.Logger,
		peers: map[string]string{}, byAddr: map[string]string{},
		parts:    make([]*partition, cfg.Partitions),
		probing:  map[int]bool{},
		departed: map[string]time.Time{},
		dirty:    make([]bool, cfg.Partitions),
		notify:   make(chan struct{}, 1),
		leaderCh: make(chan LeaderChange, cfg.Partitions),
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	e.hlog = hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: slogWriter{e.log}})
	for _, d := range []string{cfg.Dir, cfg.UnitsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("replication: %w", err)
		}
	}
	e.stores = make([]*store, cfg.Partitions)
	for p := range e.stores {
		e.stores[p] = newStore(e, p)
	}
	if err := e.loadUnits(); err != nil {
		return nil, err
	}
	var ln net.Listener
	var err error
	if cfg.Plaintext {
		ln, err = net.Listen("tcp", cfg.Listen)
	} else {
		ln, err = tls.Listen("tcp", cfg.Listen, cfg.TLS.Clone())
	}
	if err != nil {
		return nil, fmt.Errorf("replication: listen: %w", err)
	}
	e.addr = cfg.Advertise
	if e.addr == "" {
		e.addr = ln.Addr().String()
	}
	e.mux = newMux(e, ln)
	if cfg.Registerer != nil {
		e.coll = newCollector(e)
		if err := cfg.Registerer.Register(e.coll); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("replication: metrics: %w", err)
		}
	}
	e.wg.Add(2)
	go e.dispatchLeaders()
	go e.reconcileLoop()
	return e, nil
}

func (c *Config) defaults() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = c.HeartbeatTimeout / 2
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 2 * time.Minute
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.BootstrapWait == 0 {
		c.BootstrapWait = 3 * c.ElectionTimeout
	}
	if c.DepartedGrace == 0 {
		c.DepartedGrace = time.Minute
	}
	switch {
	case meshtls.ValidateName(c.Member) != nil:
		return fmt.Errorf("%w: Member %q", ErrInvalidConfig, c.Member)
	case c.Dir == "" || c.UnitsDir == "":
		return fmt.Errorf("%w: Dir and UnitsDir are required", ErrInvalidConfig)
	case c.Partitions < 1 || c.Partitions > 1<<16:
		return fmt.Errorf("%w: Partitions %d", ErrInvalidConfig, c.Partitions)
	case c.Plaintext && (c.TLS != nil || c.ClientTLS != nil):
		return fmt.Errorf("%w: Plaintext set together with TLS", ErrInvalidConfig)
	case !c.Plaintext && (c.TLS == nil || c.ClientTLS == nil):
		return fmt.Errorf("%w: TLS and ClientTLS (mutual, from runtime/meshtls) are required unless Plaintext is set explicitly", ErrInvalidConfig)
	case !c.Plaintext && c.TLS.ClientAuth != tls.RequireAndVerifyClientCert:
		return fmt.Errorf("%w: TLS.ClientAuth must be tls.RequireAndVerifyClientCert", ErrInvalidConfig)
	}
	return nil
}

// Addr is the address other members dial.
func (e *Engine) Addr() string { return e.addr }

// PartitionOf is the partition of a unit: a stable hash of its path.
func (e *Engine) PartitionOf(unitPath string) int { return partitionOf(unitPath, e.cfg.Partitions) }

// PartitionOf is the partition of a unit among partitions groups
// (DefaultPartitions when 0): Engine.PartitionOf without an engine, for a
// member that routes requests to partitions' leaders but holds no
// replicas.
func PartitionOf(unitPath string, partitions int) int {
	if partitions <= 0 {
		partitions = DefaultPartitions
	}
	return partitionOf(unitPath, partitions)
}

func partitionOf(unitPath string, n int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(unitPath))
	return int(mix(h.Sum64()) % uint64(n))
}

// mix is splitmix64's finalizer: spreads fnv's low bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// votersOf chooses partition p's voters: the replicas members with the
// highest rendezvous score, so a membership change moves only the
// partitions whose chosen set it touches.
func votersOf(p int, peers map[string]string, replicas int) []string {
	type sc struct {
		m string
		s uint64
	}
	var all []sc
	for m := range peers {
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%d/%s", p, m)
		all = append(all, sc{m, mix(h.Sum64())})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].s != all[j].s {
			return all[i].s > all[j].s
		}
		return all[i].m < all[j].m
	})
	var out []string
	for i := 0; i < len(all) && i < replicas; i++ {
		out = append(out, all[i].m)
	}
	sort.Strings(out)
	return out
}

func (e *Engine) part(p int) (*partition, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if p < 0 || p >= len(e.parts) {
		return nil, fmt.Errorf("replication: partition %d of %d: %w", p, len(e.parts), ErrInvalidConfig)
	}
	pt := e.parts[p]
	if pt == nil {
		return nil, fmt.Errorf("replication: partition %d has no group here: %w", p, ErrNotLeader)
	}
	return pt, nil
}

// Leader returns the member leading partition p, if one is known.
func (e *Engine) Leader(p int) (string, bool) {
	pt, err := e.part(p)
	if err != nil {
		return "", false
	}
	_, id := pt.raft.LeaderWithID()
	return string(id), id != ""
}

// IsLeader reports whether this member leads partition p.
func (e *Engine) IsLeader(p int) bool {
	pt, err := e.part(p)
	return err == nil && pt.raft.State() == raft.Leader
}

// LeaderChanges delivers leadership changes of every partition, coalesced
// (LeaderChange). The engine never waits for the reader.
func (e *Engine) LeaderChanges() <-chan LeaderChange { return e.leaderCh }

// SetMembers sets the desired membership: the current members and the
// number of replicas of each partition. Each partition's voters are the
// replicas members chosen by rendezvous hashing over peers; its leader
// adds and removes voters one change at a time (raft's own configuration
// changes). A partition that exists nowhere is bootstrapped by the
// lowest-named of its voters once no leader contacted it for
// Config.BootstrapWait and every other member confirms it holds none. A
// member that starts a partition with no state (new, or its disk lost)
// votes in it only once it holds what the group had committed. Connections from members not in peers are refused
// from now on.
func (e *Engine) SetMembers(ctx context.Context, peers []Peer, replicas int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if replicas < 1 {
		return fmt.Errorf("%w: replicas %d", ErrInvalidConfig, replicas)
	}
	m := map[string]string{}
	by := map[string]string{}
	for _, p := range peers {
		if meshtls.ValidateName(p.Member) != nil || p.Addr == "" {
			return fmt.Errorf("%w: peer %q at %q", ErrInvalidConfig, p.Member, p.Addr)
		}
		if _, dup := m[p.Member]; dup {
			return fmt.Errorf("%w: peer %q twice", ErrInvalidConfig, p.Member)
		}
		m[p.Member] = p.Addr
		by[p.Addr] = p.Member
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.peers, e.byAddr, e.replicas = m, by, replicas
	for d := range e.departed {
		if _, back := m[d]; back {
			delete(e.departed, d)
		}
	}
	var start []int
	for p := range e.parts {
		if e.parts[p] != nil {
			continue
		}
		if contains(votersOf(p, m, replicas), e.cfg.Member) || e.hasState(p) {
			start = append(start, p)
		}
	}
	e.mu.Unlock()
	for _, p := range start {
		if err := e.startPartition(p); err != nil {
			return err
		}
	}
	e.poke()
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (e *Engine) partDir(p int) string { return filepath.Join(e.cfg.Dir, "p"+strconv.Itoa(p)) }

func (e *Engine) hasState(p int) bool { return hasLogState(e.partDir(p)) }

func (e *Engine) startPartition(p int) error {
	dir := e.partDir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("replication: %w", err)
	}
	logs, err := openLogStore(dir, e.cfg.NoSync, e.hlog)
	if err != nil {
		return fmt.Errorf("replication: partition %d log: %w", p, err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, e.hlog)
	if err != nil {
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d snapshots: %w", p, err)
	}
	layer := e.mux.layer(p)
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 3, Timeout: 10 * time.Second, Logger: e.hlog,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(e.cfg.Member)
	rc.HeartbeatTimeout = e.cfg.HeartbeatTimeout
	rc.ElectionTimeout = e.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = e.cfg.LeaderLeaseTimeout
	rc.CommitTimeout = commitTimeout
	rc.SnapshotInterval = e.cfg.SnapshotInterval
	rc.SnapshotThreshold = e.cfg.SnapshotThreshold
	rc.TrailingLogs = e.cfg.TrailingLogs
	rc.BatchApplyCh = true
	// A leader that removes itself (its own view of the membership
	// lacked it for a moment: paused, cut off, its registration expired)
	// stays a follower: the other members add it back, and a partition
	// must not keep a dead group as a voter (the next fault would leave
	// it without a quorum for good).
	rc.ShutdownOnRemove = false
	rc.MaxAppendEntries = 256
	rc.Logger = e.hlog
	existing, err := raft.HasExistingState(logs, logs, snaps)
	if err != nil {
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d: %w", p, err)
	}
	guard, err := newVoteGuard(dir, !existing, e.cfg.Member, e.addr, func(err error) {
		e.log.Warn("replication: catch-up marker", "partition", p, "err", err)
	})
	if err != nil {
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d: %w", p, err)
	}
	var rtrans raft.Transport = trans
	if !guard.eligible.Load() {
		rtrans = newGuardedTransport(trans, guard, e.done)
	}
	// The raft log is the durable record; the replicas are written
	// without fsync. A start rebuilds them: raft restores the latest
	// snapshot (Restore replaces the partition's files) and replays the
	// log after it; with no snapshot the log still holds every entry
	// from the first, so the files go and the replay rebuilds them.
	if metas, err := snaps.List(); err != nil {
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d snapshots: %w", p, err)
	} else if len(metas) == 0 {
		if err := e.stores[p].removeAll(); err != nil {
			_ = logs.Close()
			return fmt.Errorf("replication: partition %d: %w", p, err)
		}
	}
	// The cache serves replication's reads of recent entries from memory.
	cached, err := raft.NewLogCache(512, logs)
	if err != nil {
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d: %w", p, err)
	}
	r, err := raft.NewRaft(rc, &fsm{s: e.stores[p]}, cached, logs, snaps, rtrans)
	if err != nil {
		_ = trans.Close()
		_ = logs.Close()
		return fmt.Errorf("replication: partition %d: %w", p, err)
	}
	r.RegisterObserver(raft.NewObserver(nil, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			e.noteLeader(p)
		}
		return false
	}))
	guard.raft.Store(r)
	pt := &partition{p: p, raft: r, trans: trans, logs: logs, started: time.Now(), fresh: !existing, guard: guard}
	e.mu.Lock()
	if e.closed || e.parts[p] != nil {
		e.mu.Unlock()
		_ = r.Shutdown().Error()
		_ = trans.Close()
		_ = logs.Close()
		if e.closed {
			return ErrClosed
		}
		return nil
	}
	e.parts[p] = pt
	e.mu.Unlock()
	e.noteLeader(p)
	return nil
}

func (e *Engine) poke() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

func (e *Engine) noteLeader(p int) {
	e.mu.Lock()
	e.dirty[p] = true
	e.mu.Unlock()
	select {
	case e.notify <- struct{}{}:
	default:
	}
	e.poke()
}

// dispatchLeaders turns dirty partitions into LeaderChanges, latest state
// only, without ever blocking raft.
func (e *Engine) dispatchLeaders() {
	defer e.wg.Done()
	pending := map[int]bool{}
	for {
		e.mu.Lock()
		for p, d := range e.dirty {
			if d {
				pending[p] = true
				e.dirty[p] = false
			}
		}
		e.mu.Unlock()
		if len(pending) == 0 {
			select {
			case <-e.notify:
				continue
			case <-e.done:
				return
			}
		}
		next := -1
		for p := range pending {
			if next < 0 || p < next {
				next = p
			}
		}
		lc := LeaderChange{Partition: next}
		if pt, err := e.part(next); err == nil {
			_, id := pt.raft.LeaderWithID()
			lc.Leader = string(id)
			lc.Term = pt.raft.CurrentTerm()
			lc.Self = pt.raft.State() == raft.Leader
		}
		select {
		case e.leaderCh <- lc:
			delete(pending, next)
		case <-e.notify:
		case <-e.done:
			return
		}
	}
}

// reconcileLoop drives bootstrap and voter changes toward SetMembers'
// membership.
func (e *Engine) reconcileLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.ElectionTimeout)
	defer t.Stop()
	for {
		select {
		case <-e.done:
			return
		case <-t.C:
		case <-e.kick:
		}
		for e.reconcile() {
			select {
			case <-e.done:
				return
			default:
			}
		}
	}
}

// reconcile makes at most one change per partition; it reports whether
// it made any (then it runs again at once).
func (e *Engine) reconcile() bool {
	e.mu.Lock()
	peers, replicas := e.peers, e.replicas
	parts := append([]*partition(nil), e.parts...)
	e.mu.Unlock()
	if len(peers) == 0 {
		return false
	}
	changed := false
	timeout := 4 * e.cfg.ElectionTimeout
	var cands []int
	defer func() {
		if len(cands) > 0 {
			e.bootstrap(cands, peers)
		}
	}()
	for p, pt := range parts {
		if pt == nil {
			continue
		}
		want := votersOf(p, peers, replicas)
		cf := pt.raft.GetConfiguration()
		if cf.Error() != nil {
			continue
		}
		servers := cf.Configuration().Servers
		if len(servers) == 0 {
			if pt.fresh && len(want) > 0 && want[0] == e.cfg.Member && time.Since(pt.started) >= e.cfg.BootstrapWait && pt.raft.LastContact().IsZero() {
				cands = append(cands, p)
			}
			continue
		}
		if pt.raft.State() != raft.Leader {
			continue
		}
		have := map[string]string{}
		for _, s := range servers {
			have[string(s.ID)] = string(s.Address)
		}
		var err error
		did := false
		// A voter that left the membership (crashed, its disk lost, or
		// leaving) is removed before its replacement is added: its vote
		// is not coming, and a group of R+1 voters with one of them gone
		// needs every other one, the new voter included (caught up
		// first), to commit anything. The data is held by a quorum of
		// the remaining voters all along (raft's configuration change).
		// The leader never removes itself this way.
		//
		// With no replacement to add (every wanted member already votes,
		// and no more voters than replicas), removing it buys nothing — a
		// group with a dead voter tolerates what the smaller group does —
		// and costs a lot when it was only paused or cut off: back, it
		// must be added again, and a fault of another voter before that
		// leaves the partition without a quorum. It is then removed only
		// once it has been gone for Config.DepartedGrace.
		replacement := len(servers) > replicas
		for _, m := range want {
			if _, ok := have[m]; !ok {
				replacement = true
			}
		}
		// removable: not a departed voter still within its grace.
		removable := func(m string) bool {
			if _, in := peers[m]; in || replacement {
				return true
			}
			return e.goneFor(m) >= e.cfg.DepartedGrace
		}
		for _, s := range servers {
			m := string(s.ID)
			if _, in := peers[m]; !in && m != e.cfg.Member && len(want) > 0 && removable(m) {
				e.log.Info("replication: removing departed voter", "partition", p, "member", m)
				err = pt.raft.RemoveServer(s.ID, 0, timeout).Error()
				did = true
				break
			}
		}
		for _, m := range want {
			if did {
				break
			}
			if a, ok := have[m]; !ok || a != peers[m] {
				e.log.Info("replication: adding voter", "partition", p, "member", m, "addr", peers[m])
				err = pt.raft.AddVoter(raft.ServerID(m), raft.ServerAddress(peers[m]), 0, timeout).Error()
				did = true
				break
			}
		}
		if !did {
			for _, s := range servers {
				if !contains(want, string(s.ID)) && len(want) > 0 && removable(string(s.ID)) {
					e.log.Info("replication: removing voter", "partition", p, "member", s.ID)
					err = pt.raft.RemoveServer(s.ID, 0, timeout).Error()
					did = true
					break
				}
			}
		}
		if err != nil {
			e.log.Warn("replication: membership change", "partition", p, "err", err)
			continue
		}
		changed = changed || did
	}
	return changed
}

// goneFor reports how long member m has been seen outside the
// membership (0 at the first sighting).
func (e *Engine) goneFor(m string) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, in := e.peers[m]; in {
		delete(e.departed, m)
		return 0
	}
	t, ok := e.departed[m]
	if !ok {
		e.departed[m] = time.Now()
		return 0
	}
	return time.Since(t)
}

func (e *Engine) isMember(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.peers[name]
	return ok
}

func (e *Engine) memberAt(addr string) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.byAddr[addr]
	return m, ok
}

// committer is a unit's bolt.Committer.
type committer struct {
	e    *Engine
	unit string
}

// Committer returns the bolt.Committer of a unit's node.db: Commit
// proposes the write set to the unit's partition and returns once it is
// committed on a quorum and applied to this member's copy. On a member
// that does not lead the partition it returns ErrNotLeader; when
// leadership is lost mid-way, ErrUnknownOutcome.
func (e *Engine) Committer(unitPath string) bolt.Committer { return committer{e: e, unit: unitPath} }

func (c committer) Commit(ctx context.Context, ws []byte) error {
	return c.e.propose(ctx, entry{kind: kindWriteSet, unit: c.unit, payload: ws})
}

// WriteFile replicates a small file beside the unit's node.db (for
// example its storage key): written as a whole (temporary file, rename)
// on every replica, in log order with the unit's writes.
func (e *Engine) WriteFile(ctx context.Context, unitPath, name string, data []byte) error {
	return e.propose(ctx, entry{kind: kindFile, unit: unitPath, name: name, payload: data})
}

// RemoveUnit removes a unit's files on every replica.
func (e *Engine) RemoveUnit(ctx context.Context, unitPath string) error {
	return e.propose(ctx, entry{kind: kindRemove, unit: unitPath})
}

func (e *Engine) propose(ctx context.Context, en entry) error {
	b, err := en.encode()
	if err != nil {
		return err
	}
	pt, err := e.part(e.PartitionOf(en.unit))
	if err != nil {
		return err
	}
	if pt.raft.State() != raft.Leader {
		return fmt.Errorf("replication: partition %d: %w", pt.p, ErrNotLeader)
	}
	if err := e.checkAlone(pt); err != nil {
		return err
	}
	f := pt.raft.Apply(b, 0)
	if e.cfg.ackBeforeCommit {
		return nil
	}
	if err := wait(ctx, f); err != nil {
		return err
	}
	if r, ok := f.Response().(error); ok && r != nil {
		return r
	}
	return nil
}

// checkAlone refuses a write to a partition whose configuration is its
// leader alone while more voters are wanted: a bootstrap starts that way
// (the other voters are added next), and a write committed then would
// be on one disk only.
func (e *Engine) checkAlone(pt *partition) error {
	cf := pt.raft.GetConfiguration()
	if cf.Error() != nil || len(cf.Configuration().Servers) != 1 {
		return nil
	}
	e.mu.Lock()
	want := len(votersOf(pt.p, e.peers, e.replicas))
	e.mu.Unlock()
	if want > 1 {
		return fmt.Errorf("replication: partition %d has 1 voter of %d: %w", pt.p, want, ErrNotLeader)
	}
	return nil
}

// wait waits for a raft future and maps its errors.
func wait(ctx context.Context, f raft.Future) error {
	ch := make(chan error, 1)
	go func() { ch <- f.Error() }()
	select {
	case err := <-ch:
		return mapRaftErr(err)
	case <-ctx.Done():
		return fmt.Errorf("replication: %w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

func mapRaftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrNotVoter):
		return fmt.Errorf("replication: %w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("replication: %w: %w: %w", ErrUnknownOutcome, ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("replication: %w: %w", ErrClosed, err)
	}
	return fmt.Errorf("replication: %w", err)
}

// Reserve takes a counted slot: it creates the empty file name in the
// unit's directory on every replica unless it exists, if the unit holds
// fewer than limit files (ErrLimit otherwise). The count and the
// creation are one log entry, applied alike on every replica, so the
// limit holds whichever members reserve at once. A member that does not
// lead the unit's partition passes it to the one that does; it retries
// (a reservation taken twice is taken once) until ctx ends.
func (e *Engine) Reserve(ctx context.Context, unitPath, name string, limit int) error {
	if limit < 1 || limit > MaxReserveLimit {
		return badEntry("reservation limit %d", limit)
	}
	return e.proposeAnywhere(ctx, entry{kind: kindReserve, unit: unitPath, name: name, payload: binary.AppendUvarint(nil, uint64(limit))})
}

// Release gives a slot Reserve took back: it removes the file name from
// the unit's directory on every replica (none: nothing to do), through
// the partition's leader like Reserve.
func (e *Engine) Release(ctx context.Context, unitPath, name string) error {
	return e.proposeAnywhere(ctx, entry{kind: kindRelease, unit: unitPath, name: name})
}

// proposeAnywhere proposes an idempotent entry here if this member leads
// its partition, or else on the member that does (the known leader
// first, then every other member), retrying until it is applied, refused
// for good (ErrLimit, ErrBadEntry, ErrClosed) or ctx ends.
func (e *Engine) proposeAnywhere(ctx context.Context, en entry) error {
	if err := en.check(); err != nil {
		return err
	}
	p := e.PartitionOf(en.unit)
	for attempt := 0; ; attempt++ {
		err := e.propose(ctx, en)
		if final(err) {
			return err
		}
		for _, t := range e.forwardTargets(p) {
			if err = e.mux.forward(ctx, t, p, en); final(err) {
				return err
			}
		}
		d := min(25*time.Millisecond<<min(attempt, 5), e.cfg.ElectionTimeout)
		select {
		case <-ctx.Done():
			return fmt.Errorf("replication: partition %d: %w (last: %w)", p, ctx.Err(), err)
		case <-e.done:
			return ErrClosed
		case <-time.After(d):
		}
	}
}

// final reports whether a proposal's outcome is its last: applied, or
// refused whoever proposes it.
func final(err error) bool {
	return err == nil || errors.Is(err, ErrLimit) || errors.Is(err, ErrBadEntry) || errors.Is(err, ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// forwardTargets lists the members to pass a proposal of partition p to:
// its leader as this member knows it, then the other members by name.
func (e *Engine) forwardTargets(p int) []Peer {
	leader, _ := e.Leader(p)
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Peer
	if a, ok := e.peers[leader]; ok && leader != e.cfg.Member {
		out = append(out, Peer{leader, a})
	}
	names := make([]string, 0, len(e.peers))
	for m := range e.peers {
		if m != e.cfg.Member && m != leader {
			names = append(names, m)
		}
	}
	sort.Strings(names)
	for _, m := range names {
		out = append(out, Peer{m, e.peers[m]})
	}
	return out
}

// Term returns the raft term this member is in for partition p, and
// whether it leads the partition in it.
func (e *Engine) Term(p int) (term uint64, leading bool) {
	pt, err := e.part(p)
	if err != nil {
		return 0, false
	}
	// The state first: a leader seen here led in a term no later than
	// the one read after it, and a later term means it no longer leads.
	leading = pt.raft.State() == raft.Leader
	term = pt.raft.CurrentTerm()
	return term, leading
}

// CheckTerm is the fence by term: it confirms with a quorum that this
// member still leads partition p (VerifyLeader) and that it has led it
// in term throughout, the term it read (Term) when the request began;
// otherwise it returns ErrTermChanged (a successor may have served
// meanwhile: nothing read or written since is answered as current).
func (e *Engine) CheckTerm(ctx context.Context, p int, term uint64) error {
	pt, err := e.part(p)
	if err != nil {
		return err
	}
	if err := wait(ctx, pt.raft.VerifyLeader()); err != nil {
		return err
	}
	if now := pt.raft.CurrentTerm(); now != term || pt.raft.State() != raft.Leader {
		return fmt.Errorf("replication: partition %d: term %d, began in %d: %w: %w", p, now, term, ErrTermChanged, ErrNotLeader)
	}
	return nil
}

// Barrier waits until this member, leading partition p, has applied
// everything committed before the call: a new leader calls it before it
// serves the partition's units.
func (e *Engine) Barrier(ctx context.Context, p int) error {
	pt, err := e.part(p)
	if err != nil {
		return err
	}
	return wait(ctx, pt.raft.Barrier(0))
}

// VerifyLeader confirms with a quorum that this member still leads
// partition p (raft's term-based check): the fence before answering a
// read as current.
func (e *Engine) VerifyLeader(ctx context.Context, p int) error {
	pt, err := e.part(p)
	if err != nil {
		return err
	}
	return wait(ctx, pt.raft.VerifyLeader())
}

// Stats returns the engine's state.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	parts := append([]*partition(nil), e.parts...)
	peers, replicas := e.peers, e.replicas
	e.mu.Unlock()
	st := Stats{Partitions: len(parts), RefusedConnections: e.refused.Load(),
		Snapshots: e.snapshots.Load(), Restores: e.restores.Load(), ApplyErrors: e.applyErrors.Load()}
	for _, pt := range parts {
		if pt == nil {
			continue
		}
		st.Running++
		if !pt.guard.mayVote() && slices.Contains(votersOf(pt.p, peers, replicas), e.cfg.Member) {
			st.CatchingUp++
		}
		if pt.raft.State() == raft.Leader {
			st.Leading++
		}
	}
	for _, s := range e.stores {
		st.Units += s.count()
	}
	return st
}

// Close stops every raft group, the listener and the engine's own file
// handles. Attached DBs stay open (their owner closes them).
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	parts := e.parts
	e.mu.Unlock()
	close(e.done)
	if e.coll != nil {
		e.cfg.Registerer.Unregister(e.coll)
	}
	var errs []error
	for _, pt := range parts {
		if pt == nil {
			continue
		}
		errs = append(errs, pt.raft.Shutdown().Error(), pt.trans.Close(), pt.logs.Close())
	}
	errs = append(errs, e.mux.close())
	e.wg.Wait()
	for _, s := range e.stores {
		s.closeAll()
	}
	return errors.Join(errs...)
}

// slogWriter carries raft's log lines to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}
