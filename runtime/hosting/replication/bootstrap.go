package replication

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Bootstrap. A partition that exists nowhere is started by one member
// with raft's BootstrapCluster; a partition that exists somewhere must
// never be bootstrapped again, or two groups would each commit on their
// own quorum: a member that lost its disk, or two new empty members
// chosen as voters together, could otherwise elect themselves on their
// empty logs. Waiting to be contacted by a leader is not enough (the
// leader may be down, or may not know the new members yet), so before
// bootstrapping the candidate asks every other member in its view:
//
//	"SMQ1" | partitions-1(2) → len(uvarint) | state bitmap | view digest(32)
//
// and bootstraps only the partitions that no member holds state for (nor
// is itself about to bootstrap), and only if every member answered with
// the same view (so the same lowest-named voter) as its own, unchanged
// after the answers. An unreachable member may hold the partition: then
// nothing is bootstrapped until it answers or leaves the membership.
var probeMagic = []byte("SMQ1")

// probeTimeout bounds one probe, connection included.
const probeTimeout = 5 * time.Second

// probeAnswer is one member's answer to a bootstrap probe.
type probeAnswer struct {
	member string
	err    error    // no answer: the member may hold anything
	state  []byte   // bit p set: the member holds state for partition p
	view   [32]byte // digest of the member's membership view
}

// viewDigest is a digest of a membership view: members and addresses.
func viewDigest(peers map[string]string) [32]byte {
	ms := make([]string, 0, len(peers))
	for m := range peers {
		ms = append(ms, m)
	}
	sort.Strings(ms)
	h := sha256.New()
	for _, m := range ms {
		_, _ = fmt.Fprintf(h, "%d:%s%d:%s", len(m), m, len(peers[m]), peers[m])
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

func hasBit(b []byte, p int) bool { return p/8 < len(b) && b[p/8]&(1<<(p%8)) != 0 }

// bootstrapDecision returns the candidates that may be bootstrapped given
// every other member's answer: none unless each answered with view; then
// those no answer marks as held.
func bootstrapDecision(cands []int, view [32]byte, answers []probeAnswer) []int {
	for _, a := range answers {
		if a.err != nil || a.view != view {
			return nil
		}
	}
	var out []int
	for _, p := range cands {
		held := false
		for _, a := range answers {
			held = held || hasBit(a.state, p)
		}
		if !held {
			out = append(out, p)
		}
	}
	return out
}

// holds reports whether this member holds (or is about to create) raft
// state for partition p; a partition not started here holds none.
func (e *Engine) holds(p int) bool {
	e.mu.Lock()
	pt, probing := e.parts[p], e.probing[p]
	e.mu.Unlock()
	if probing {
		return true
	}
	if pt == nil {
		return false
	}
	if !pt.fresh || pt.raft.LastIndex() > 0 || !pt.raft.LastContact().IsZero() {
		return true
	}
	cf := pt.raft.GetConfiguration()
	return cf.Error() != nil || len(cf.Configuration().Servers) > 0
}

// stateBitmap is this member's answer's state bitmap.
func (e *Engine) stateBitmap() []byte {
	b := make([]byte, (e.cfg.Partitions+7)/8)
	for p := range e.cfg.Partitions {
		if e.holds(p) {
			b[p/8] |= 1 << (p % 8)
		}
	}
	return b
}

// serveProbe answers a bootstrap probe from an authenticated member.
// (the header carries the prober's partitions - 1).
func (m *mux) serveProbe(c net.Conn, partitions int) {
	defer c.Close()
	m.mu.Lock()
	refused := m.cut || m.closed
	m.mu.Unlock()
	if refused || partitions+1 != m.e.cfg.Partitions {
		return
	}
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	m.e.mu.Lock()
	view := viewDigest(m.e.peers)
	m.e.mu.Unlock()
	b := m.e.stateBitmap()
	out := binary.AppendUvarint(nil, uint64(len(b)))
	out = append(append(out, b...), view[:]...)
	_, _ = c.Write(out)
}

// errBadProbe marks a malformed probe answer.
var errBadProbe = errors.New("replication: malformed bootstrap probe answer")

// probe asks member t for its state bitmap and view.
func (m *mux) probe(ctx context.Context, t Peer) probeAnswer {
	a := probeAnswer{member: t.Member}
	deadline := time.Now().Add(probeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c, err := m.dial(t.Addr, time.Until(deadline), binary.BigEndian.AppendUint16(append([]byte(nil), probeMagic...), uint16(m.e.cfg.Partitions-1)))
	if err != nil {
		a.err = err
		return a
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	_ = c.SetDeadline(deadline)
	a.state, a.view, a.err = readProbeAnswer(bufio.NewReader(c), m.e.cfg.Partitions)
	return a
}

// readProbeAnswer decodes an answer for a cluster of partitions.
func readProbeAnswer(r *bufio.Reader, partitions int) ([]byte, [32]byte, error) {
	var view [32]byte
	want := (partitions + 7) / 8
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, view, fmt.Errorf("%w: %w", errBadProbe, err)
	}
	if n != uint64(want) {
		return nil, view, fmt.Errorf("%w: bitmap of %d bytes, want %d", errBadProbe, n, want)
	}
	b := make([]byte, want)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, view, fmt.Errorf("%w: %w", errBadProbe, err)
	}
	if _, err := io.ReadFull(r, view[:]); err != nil {
		return nil, view, fmt.Errorf("%w: %w", errBadProbe, err)
	}
	return b, view, nil
}

// bootstrap bootstraps those of cands (partitions fresh here, of which
// this member is the lowest-named voter, uncontacted for BootstrapWait)
// that every other member confirms exist nowhere, as a configuration
// of this member alone.
func (e *Engine) bootstrap(cands []int, peers map[string]string) {
	view := viewDigest(peers)
	e.mu.Lock()
	for _, p := range cands {
		e.probing[p] = true
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		for _, p := range cands {
			delete(e.probing, p)
		}
		e.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*e.cfg.ElectionTimeout)
	defer cancel()
	go func() {
		select {
		case <-e.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var answers []probeAnswer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for m, addr := range peers {
		if m == e.cfg.Member {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := e.mux.probe(ctx, Peer{Member: m, Addr: addr})
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		}()
	}
	wg.Wait()
	ok := bootstrapDecision(cands, view, answers)
	if len(ok) < len(cands) {
		for _, a := range answers {
			if a.err != nil {
				e.log.Debug("replication: bootstrap waits for a member's answer", "member", a.member, "err", a.err)
			} else if a.view != view {
				e.log.Debug("replication: bootstrap waits for the same membership view", "member", a.member)
			}
		}
	}
	e.mu.Lock()
	same := viewDigest(e.peers) == view
	e.mu.Unlock()
	if !same {
		return
	}
	for _, p := range ok {
		pt, err := e.part(p)
		if err != nil || !pt.raft.LastContact().IsZero() || pt.raft.LastIndex() > 0 {
			continue
		}
		// A lone configuration: the leader then adds the other voters
		// one at a time, and each votes once it holds the log (voteGuard).
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(e.cfg.Member), Address: raft.ServerAddress(peers[e.cfg.Member])}}}
		if err := pt.raft.BootstrapCluster(conf).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			e.log.Warn("replication: bootstrap", "partition", p, "err", err)
		} else if err == nil {
			pt.guard.confirm()
			e.log.Info("replication: bootstrapped partition", "partition", p, "voters", conf.Servers[0].ID)
		}
	}
}
