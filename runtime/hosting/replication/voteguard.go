package replication

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// A member that starts a partition with no raft state — its disk lost,
// or new — must not vote in that partition's elections until it holds
// what the group had committed when it first heard from a leader. Raft's
// safety rests on every election quorum meeting every commit quorum in a
// member that still has the committed entries; a voter that forgot them
// (and forgot its vote) would grant its vote to a candidate missing
// them, and that candidate would overwrite acknowledged writes. So until
// then the partition answers vote and pre-vote requests with a refusal
// (the candidate's term is not adopted), and a marker file in the
// partition's directory keeps it so across restarts: a member that
// crashes half-way through catching up still forgot what it forgot.
//
// The catch-up target is the leader commit index carried by the first
// append from a leader with a non-zero one: every entry acknowledged
// before the disk was lost is at or below it. A member that bootstraps
// the partition itself (nobody holds it) is eligible at once.
const catchupMarker = "catching-up"

// voteGuard tracks one partition's eligibility to vote.
type voteGuard struct {
	dir      string
	eligible atomic.Bool
	target   atomic.Uint64
	raft     atomic.Pointer[raft.Raft]
	once     sync.Once
	member   string
	addr     string
	onErr    func(error)
}

// newVoteGuard returns the guard of the partition in dir; fresh says the
// partition starts with no raft state (then the marker is written before
// raft may store anything).
func newVoteGuard(dir string, fresh bool, member, addr string, onErr func(error)) (*voteGuard, error) {
	g := &voteGuard{dir: dir, member: member, addr: addr, onErr: onErr}
	path := filepath.Join(dir, catchupMarker)
	_, err := os.Stat(path)
	switch {
	case err == nil:
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("replication: %w", err)
	case fresh:
		if err := writeAtomic(path, nil, true); err != nil {
			return nil, fmt.Errorf("replication: %w", err)
		}
	default:
		g.eligible.Store(true)
	}
	return g, nil
}

// confirm makes the partition eligible and removes the marker.
func (g *voteGuard) confirm() {
	g.eligible.Store(true)
	g.once.Do(func() {
		if err := os.Remove(filepath.Join(g.dir, catchupMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
			g.onErr(err)
			return
		}
		if err := syncDir(g.dir); err != nil {
			g.onErr(err)
		}
	})
}

// mayVote reports whether the partition may grant votes now.
func (g *voteGuard) mayVote() bool {
	if g.eligible.Load() {
		return true
	}
	r := g.raft.Load()
	if t := g.target.Load(); t > 0 && r != nil && r.LastIndex() >= t {
		g.confirm()
		return true
	}
	return false
}

// observe notes a leader's append: the first non-zero commit index it
// carries is the catch-up target.
func (g *voteGuard) observe(req *raft.AppendEntriesRequest) {
	if req.LeaderCommitIndex > 0 {
		g.target.CompareAndSwap(0, req.LeaderCommitIndex)
	}
}

// guardedTransport is a partition's transport while its guard is not
// eligible at start: it refuses votes until the guard says otherwise.
// A partition eligible at start uses the plain transport.
type guardedTransport struct {
	*raft.NetworkTransport
	g    *voteGuard
	out  chan raft.RPC
	done <-chan struct{}
}

func newGuardedTransport(t *raft.NetworkTransport, g *voteGuard, done <-chan struct{}) *guardedTransport {
	gt := &guardedTransport{NetworkTransport: t, g: g, out: make(chan raft.RPC), done: done}
	go gt.run()
	return gt
}

// Consumer is the channel raft reads its requests from.
func (t *guardedTransport) Consumer() <-chan raft.RPC { return t.out }

func (t *guardedTransport) run() {
	in := t.NetworkTransport.Consumer()
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-t.done:
			return
		}
		if t.refuse(rpc) {
			continue
		}
		select {
		case t.out <- rpc:
		case <-t.done:
			return
		}
		if !t.g.eligible.Load() {
			t.g.mayVote() // removes the marker once caught up
		}
	}
}

// refuse answers a vote or pre-vote request the partition may not grant;
// it reports whether it did.
func (t *guardedTransport) refuse(rpc raft.RPC) bool {
	g := t.g
	switch req := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		if !g.eligible.Load() {
			g.observe(req)
		}
	case *raft.RequestVoteRequest:
		if !g.mayVote() {
			rpc.Respond(&raft.RequestVoteResponse{RPCHeader: g.header(), Term: req.Term, Granted: false}, nil)
			return true
		}
	case *raft.RequestPreVoteRequest:
		if !g.mayVote() {
			rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: g.header(), Term: req.Term, Granted: false}, nil)
			return true
		}
	}
	return false
}

// header is the RPC header of this member's refusals.
func (g *voteGuard) header() raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(g.member), Addr: []byte(g.addr)}
}
