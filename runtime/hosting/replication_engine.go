package hosting

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime/hosting/replication"
)

// engineReplicas is the replicaSet of a replication.Engine.
type engineReplicas struct {
	e       *replication.Engine
	changes chan leaderChange
	done    chan struct{}
}

func init() {
	openReplicaSet = func(ctx context.Context, c *ClusterConfig, member string) (replicaSet, error) {
		rc := c.Replication
		if rc.Listen == "" {
			rc.Listen = "127.0.0.1:0"
		}
		if rc.Dir == "" {
			rc.Dir = filepath.Join(c.Root, "raft")
		}
		e, err := replication.Open(ctx, replication.Config{
			Member:     member,
			Dir:        rc.Dir,
			UnitsDir:   c.Root,
			Partitions: rc.Partitions,
			Listen:     rc.Listen,
			Advertise:  rc.Advertise,
			TLS:        c.TLS,
			ClientTLS:  c.ClientTLS,
			Plaintext:  c.Plaintext,
			Logger:     c.Logger,
			NoSync:     c.NoSync,

			HeartbeatTimeout:   rc.ElectionTimeout,
			ElectionTimeout:    rc.ElectionTimeout,
			LeaderLeaseTimeout: rc.ElectionTimeout / 2,
			DepartedGrace:      rc.DepartedGrace,
		})
		if err != nil {
			return nil, err
		}
		r := &engineReplicas{e: e, changes: make(chan leaderChange, 64), done: make(chan struct{})}
		go r.forward()
		return r, nil
	}
}

// routerPartitionOf is the partition of a unit path for a member that
// holds no replicas (a router-only member routing by published leads).
func routerPartitionOf(path string, partitions int) int {
	return replication.PartitionOf(path, partitions)
}

// forward converts the engine's leadership changes (it never blocks on
// them; this reader keeps up, and a full buffer only delays the next).
func (r *engineReplicas) forward() {
	defer close(r.changes)
	in := r.e.LeaderChanges()
	for {
		select {
		case <-r.done:
			return
		case ch, ok := <-in:
			if !ok {
				return
			}
			select {
			case r.changes <- leaderChange{partition: ch.Partition, leader: ch.Leader, term: ch.Term, self: ch.Self}:
			case <-r.done:
				return
			}
		}
	}
}

func (r *engineReplicas) addr() string                       { return r.e.Addr() }
func (r *engineReplicas) partitionOf(path string) int        { return r.e.PartitionOf(path) }
func (r *engineReplicas) leader(p int) (string, bool)        { return r.e.Leader(p) }
func (r *engineReplicas) isLeader(p int) bool                { return r.e.IsLeader(p) }
func (r *engineReplicas) leaderChanges() <-chan leaderChange { return r.changes }

func (r *engineReplicas) setMembers(ctx context.Context, peers []replicaPeer, replicas int) error {
	ps := make([]replication.Peer, len(peers))
	for i, p := range peers {
		ps[i] = replication.Peer{Member: p.member, Addr: p.addr}
	}
	return r.e.SetMembers(ctx, ps, replicas)
}

// openStore opens the unit's replica through the engine (its own path
// under UnitsDir, which is Config.Root: the same file).
func (r *engineReplicas) openStore(path, file string, opts bolt.Options) (*bolt.DB, func(), error) {
	return r.e.OpenUnit(path, opts)
}

func (r *engineReplicas) writeFile(ctx context.Context, path, name string, data []byte) error {
	return r.e.WriteFile(ctx, path, name, data)
}

func (r *engineReplicas) removeUnit(ctx context.Context, path string) error {
	return r.e.RemoveUnit(ctx, path)
}

func (r *engineReplicas) reserve(ctx context.Context, path, name string, limit int) error {
	err := r.e.Reserve(ctx, path, name, limit)
	if errors.Is(err, replication.ErrLimit) {
		return fmt.Errorf("%w: %w", ErrQuota, err)
	}
	return err
}

func (r *engineReplicas) release(ctx context.Context, path, name string) error {
	return r.e.Release(ctx, path, name)
}

func (r *engineReplicas) term(p int) (uint64, bool) { return r.e.Term(p) }

func (r *engineReplicas) checkTerm(ctx context.Context, p int, term uint64) error {
	return r.e.CheckTerm(ctx, p, term)
}

func (r *engineReplicas) barrier(ctx context.Context, p int) error { return r.e.Barrier(ctx, p) }

func (r *engineReplicas) verifyLeader(ctx context.Context, p int) error {
	return r.e.VerifyLeader(ctx, p)
}

func (r *engineReplicas) deposed(err error) bool {
	return errors.Is(err, replication.ErrNotLeader) || errors.Is(err, replication.ErrUnknownOutcome)
}

func (r *engineReplicas) close() error {
	close(r.done)
	if err := r.e.Close(); err != nil {
		return fmt.Errorf("hosting: close replication: %w", err)
	}
	return nil
}
