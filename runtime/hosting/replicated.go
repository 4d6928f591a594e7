package hosting

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// ReplicationConfig configures the replication of units between members
// (ClusterConfig.Replicas ≥ 2).
type ReplicationConfig struct {
	// Listen is the host:port the member's replication traffic (the
	// consensus groups' log entries and snapshots) is served on. Empty:
	// 127.0.0.1:0. Setting it makes ClusterConfig.Replicas 0 mean
	// DefaultReplicas.
	Listen string
	// Advertise is what other members dial, when it differs from the
	// bound address (NAT, containers). It is published with the member's
	// registration (its member id), where every member finds it.
	Advertise string
	// Dir holds the consensus logs and snapshots. Empty: Root/raft.
	Dir string
	// Partitions is how many consensus groups the units are spread over
	// (every unit belongs to one by the hash of its path). It must be the
	// same on every member and never change. Zero: 16.
	Partitions int
	// ElectionTimeout bounds how long the followers of a partition wait
	// for its leader before electing another (and the heartbeat timeout
	// too): most of a take-over after a member's loss. Shorter on a fast,
	// quiet network; too short for the machines' load and leaders are
	// deposed needlessly. Zero: the engine's default (750 ms).
	ElectionTimeout time.Duration
	// DepartedGrace is how long a member that left the membership (its
	// registration expired: stopped, paused or cut off) keeps its seats
	// as a voter when no other member can take them (as many members as
	// Replicas). Back within it, it votes at once; past it, its seats go.
	// With a member to take its place it is replaced at once. Zero: 1
	// minute.
	DepartedGrace time.Duration
}

// unitPath is a unit's path in the replicated files: its directory
// relative to Config.Root.
func unitPath(kind, identity string) string {
	return kind + "/" + hex.EncodeToString([]byte(identity))
}

// replicaPeer is one member in the replicated membership: its identity
// (certificate name) and its replication address.
type replicaPeer struct{ member, addr string }

// leaderChange reports a partition's leader as the engine sees it.
type leaderChange struct {
	partition int
	leader    string
	term      uint64
	self      bool
}

// replicaSet is what hosting needs of the replication engine
// (runtime/hosting/replication): multi-Raft partitions of unit files,
// fenced by each group's term.
type replicaSet interface {
	addr() string
	partitionOf(unitPath string) int
	leader(p int) (member string, ok bool)
	isLeader(p int) bool
	leaderChanges() <-chan leaderChange
	setMembers(ctx context.Context, peers []replicaPeer, replicas int) error
	// openStore opens the unit's node.db with the partition's committer
	// (a write is visible once a quorum holds it) and attaches it to the
	// engine; detach is called after the DB is closed.
	openStore(unitPath, path string, opts bolt.Options) (db *bolt.DB, detach func(), err error)
	writeFile(ctx context.Context, unitPath, name string, data []byte) error
	removeUnit(ctx context.Context, unitPath string) error
	// reserve takes the counted slot name of the record at path if it
	// holds fewer than limit (an error wrapping ErrQuota otherwise),
	// through the record's partition leader wherever it is; release
	// gives it back. Both are idempotent.
	reserve(ctx context.Context, path, name string, limit int) error
	release(ctx context.Context, path, name string) error
	barrier(ctx context.Context, p int) error
	verifyLeader(ctx context.Context, p int) error
	// term is this member's raft term of partition p and whether it
	// leads p in it; checkTerm confirms with a quorum that it still
	// leads p in that term (an error deposed reports otherwise).
	term(p int) (uint64, bool)
	checkTerm(ctx context.Context, p int, term uint64) error
	// deposed reports an error of a write or a read fence that says this
	// member does not (or may no longer) lead the partition.
	deposed(err error) bool
	close() error
}

// openReplicaSet opens the replication engine of a member; set by the
// file that wires the engine in.
var openReplicaSet func(ctx context.Context, c *ClusterConfig, member string) (replicaSet, error)

// Member ids of replicated members carry the replication address after
// a second "@": name@actorSystemID@host:port. memberIDOf reads the name.
func replicaAddrOf(id string) string {
	_, rest, ok := strings.Cut(id, "@")
	if !ok {
		return ""
	}
	_, addr, ok := strings.Cut(rest, "@")
	if !ok {
		return ""
	}
	return addr
}

// peersOf is the replicated membership of a view: the members that
// publish a replication address, by name (one address per name: the
// lowest, so every member derives the same list from the same view).
func peersOf(ids []string) []replicaPeer {
	by := map[string]string{}
	for _, id := range ids {
		name, addr := memberIDOf(id), replicaAddrOf(id)
		if name == "" || addr == "" {
			continue
		}
		if cur, ok := by[name]; !ok || addr < cur {
			by[name] = addr
		}
	}
	out := make([]replicaPeer, 0, len(by))
	for n, a := range by {
		out = append(out, replicaPeer{n, a})
	}
	slices.SortFunc(out, func(a, b replicaPeer) int { return strings.Compare(a.member, b.member) })
	return out
}

// Leadership. A member serves a replicated unit only while it leads the
// unit's partition, and only after it applied everything committed
// before its term began (a barrier): its copy is then the whole
// committed history. Losing the lead closes the partition's units at
// once; their next activation is on the new leader.

// leadState is one partition's serving decision on this member.
type leadState struct {
	term  uint64
	self  bool // this member leads in term
	ready bool // and its barrier of term completed
}

// leadInput is a leadership change or the completion of a barrier.
type leadInput struct {
	change  *leaderChange
	barrier uint64 // term whose barrier completed (with change nil)
}

// leadEffect is what the decision asks of the member.
type leadEffect struct {
	release bool   // close the partition's open units
	barrier uint64 // start a barrier for this term (0: none)
}

// decideLead is the leadership decision: a change of term or of leader
// closes whatever the partition had open here (state built under an
// earlier term is not served under a later one), a new lead of this
// member starts a barrier, and the partition is served once the barrier
// of the current term completed. A completion of an older term's
// barrier changes nothing.
func decideLead(s leadState, in leadInput) (leadState, leadEffect) {
	if in.change == nil {
		if s.self && in.barrier == s.term {
			s.ready = true
		}
		return s, leadEffect{}
	}
	ch := *in.change
	if ch.term < s.term {
		return s, leadEffect{}
	}
	if ch.term == s.term && ch.self == s.self {
		return s, leadEffect{}
	}
	var eff leadEffect
	eff.release = s.self || s.ready
	s = leadState{term: ch.term, self: ch.self}
	if ch.self {
		eff.barrier = ch.term
	}
	return s, eff
}

// leadership runs decideLead for every partition and answers whether a
// partition may be served here.
type leadership struct {
	mu    sync.Mutex
	parts map[int]leadState
	// changed is closed (and replaced) at every leadership change a
	// step sees: requests waiting on a partition's old leader go to the
	// new one at once.
	changed chan struct{}
}

func (l *leadership) step(p int, in leadInput) leadEffect {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parts == nil {
		l.parts = map[int]leadState{}
	}
	s, eff := decideLead(l.parts[p], in)
	if in.change != nil && l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	l.parts[p] = s
	return eff
}

// term is the latest term this member's engine reported for p (0: none).
func (l *leadership) term(p int) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parts[p].term
}

// leads lists the partitions this member leads and serves (its barrier
// completed), with their terms: what it publishes. A claim published
// before the barrier would only move requests to a leader that refuses
// them until it completes.
func (l *leadership) leads() map[int]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]uint64{}
	for p, s := range l.parts {
		if s.self && s.ready && s.term > 0 {
			out[p] = s.term
		}
	}
	return out
}

// notify wakes the requests waiting on a leadership change: the leads
// the members publish changed.
func (l *leadership) notify() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// changes returns a channel closed at the next leadership change.
func (l *leadership) changes() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// leaderMoved reports whether a request sent to target for (kind,
// identity) should go elsewhere: the unit is replicated and its
// partition's leader is now known to be another member. A caller waits
// no longer for a leader that was replaced (killed, paused, cut off).
func (inc *incarnation) leaderMoved(kind, identity, target string) bool {
	if !inc.c.leaderRouted() || target == "" {
		return false
	}
	o := inc.leaderOf(kind, identity)
	return o != "" && o != target
}

// retryWait waits d before a request's next attempt, or less: until a
// leadership change (lead, nil when not replicated). It reports whether
// the change ended it.
func retryWait(ctx context.Context, d time.Duration, lead <-chan struct{}) (bool, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return false, nil
	case <-lead:
		return true, nil
	}
}

func (l *leadership) serving(p int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.parts[p]
	return s.self && s.ready
}

// watchLeaders applies the engine's leadership changes until done is
// closed: units of a partition lost are closed at once, a partition won
// is served after its barrier.
func (c *Cluster) watchLeaders(done <-chan struct{}) {
	r := c.h.repl
	for {
		select {
		case <-done:
			return
		case ch, ok := <-r.leaderChanges():
			if !ok {
				return
			}
			c.h.log.Debug("hosting: partition leader", "partition", ch.partition, "leader", ch.leader, "term", ch.term, "self", ch.self)
			wasSelf := c.lead.leads()[ch.partition]
			eff := c.lead.step(ch.partition, leadInput{change: &ch})
			if now := c.lead.leads()[ch.partition]; now != wasSelf {
				// Members that are no voter of the partition route by
				// what its leaders publish.
				c.publishLeads(c.cur.Load())
			}
			if eff.release {
				c.h.log.Info("hosting: partition lead changed: closing its units", "partition", ch.partition, "leader", ch.leader, "term", ch.term)
				c.h.releasePartition(ch.partition)
			}
			if eff.barrier != 0 {
				c.wg.Add(1)
				go func(p int, term uint64) {
					defer c.wg.Done()
					c.barrier(done, p, term)
				}(ch.partition, eff.barrier)
			}
		}
	}
}

// barrier waits until this member applied everything committed before
// its term, retrying while it still leads, then lets the partition be
// served.
func (c *Cluster) barrier(done <-chan struct{}, p int, term uint64) {
	began := time.Now()
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		go func() {
			select {
			case <-done:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := c.h.repl.barrier(ctx, p)
		cancel()
		if err == nil {
			c.lead.step(p, leadInput{barrier: term})
			c.h.log.Info("hosting: partition won: serving it", "partition", p, "term", term, "after", time.Since(began))
			// Routers and non-voters send the partition's requests here
			// from now on.
			c.publishLeads(c.cur.Load())
			return
		}
		if !c.h.repl.isLeader(p) {
			c.h.log.Info("hosting: partition lost before its barrier completed", "partition", p, "term", term, "err", err)
			return
		}
		// Retried while this member leads: a partition it leads is not
		// served until a barrier completes.
		c.h.log.Warn("hosting: barrier of a partition won failed: retrying", "partition", p, "term", term, "attempt", attempt, "err", err)
		select {
		case <-done:
			return
		case <-time.After(retryBackoff(attempt)):
		}
	}
}

// memberSync hands the engine the replicated membership of the latest
// view, one call at a time (the latest view wins).
type memberSync struct {
	mu      sync.Mutex
	pending []replicaPeer
	has     bool
	running bool
}

func (c *Cluster) setPeers(peers []replicaPeer) {
	s := &c.msync
	s.mu.Lock()
	s.pending, s.has = peers, true
	if s.running {
		s.mu.Unlock()
		return
	}
	// Counted in wg only while Close has not begun waiting for it.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.mu.Unlock()
		return
	}
	s.running = true
	c.wg.Add(1)
	c.mu.Unlock()
	s.mu.Unlock()
	go func() {
		defer c.wg.Done()
		for {
			s.mu.Lock()
			if !s.has {
				s.running = false
				s.mu.Unlock()
				return
			}
			peers := s.pending
			s.has = false
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := c.h.repl.setMembers(ctx, peers, c.cfg.Replicas)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				c.h.log.Warn("hosting: replication membership", "err", err)
			}
		}
	}()
}

// storageKeyFile holds a replicated unit's storage key beside its
// node.db (replicated with it: every replica must open the same records).
const storageKeyFile = "hosting.key"

// unitStorageKey returns the replicated unit's storage key, creating and
// replicating one at its first activation.
func (h *host) unitStorageKey(ctx context.Context, kind, identity string) ([]byte, error) {
	dir := unitDir(h.cfg.Root, kind, identity)
	b, err := os.ReadFile(filepath.Join(dir, storageKeyFile))
	switch {
	case err == nil && len(b) == 32:
		return b, nil
	case err == nil:
		return nil, fmt.Errorf("hosting: %s of %s %q is damaged (%d bytes)", storageKeyFile, kind, identity, len(b))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("hosting: read storage key of %s %q: %w", kind, identity, err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := h.repl.writeFile(ctx, unitPath(kind, identity), storageKeyFile, key); err != nil {
		return nil, h.replErr(err)
	}
	return key, nil
}

// replErr makes an engine error saying this member does not lead the
// partition the caller's retry: ErrNotOwner.
func (h *host) replErr(err error) error {
	if err != nil && h.repl != nil && h.repl.deposed(err) && !errors.Is(err, ErrNotOwner) {
		return fmt.Errorf("%w: %w", ErrNotOwner, err)
	}
	return err
}

// releasePartition closes the open units of partition p.
func (h *host) releasePartition(p int) {
	h.mu.Lock()
	var us []*unit
	for k, u := range h.units {
		if h.repl.partitionOf(unitPath(k.kind, k.identity)) == p {
			us = append(us, u)
		}
	}
	h.mu.Unlock()
	for _, u := range us {
		_ = h.release(u)
	}
}

// leaderRouted reports whether requests follow the partitions' leaders
// (Replicas ≥ 2): a replicated member's by its engine and the leads the
// members publish, a router-only member's by the published leads alone.
func (c *Cluster) leaderRouted() bool { return c.replicas() != nil || c.cfg.Replicas >= 2 }

// replicas is the member's replication engine (nil: not replicated).
func (c *Cluster) replicas() replicaSet {
	if c.h == nil {
		return nil
	}
	return c.h.repl
}
