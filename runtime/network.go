package runtime

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
)

// Faults are the in-process network's injected failures. Probabilities
// are in [0, 1]; every draw comes from the network's seeded generator, so
// a run that calls it in the same order fails the same way.
type Faults struct {
	// Drop loses the push before it reaches the receiver.
	Drop float64
	// DropReply delivers the push but loses the result: the receiver
	// applied it, the sender sees a failure and offers it again.
	DropReply float64
	// Duplicate delivers the push twice.
	Duplicate float64
	// Reorder first delivers an older push between the same two nodes
	// again (a stale, late copy overtaking the current one).
	Reorder float64
	// Delay holds each push for a random time up to Delay.
	Delay time.Duration
}

// Network is an in-process transport for tests and embedding: nodes
// register under their names and push to each other through it. Pushes
// and results are encoded and decoded on the way, as on a wire, so no
// slice is shared between nodes. It injects seeded faults (drop,
// duplicate, reorder, delay) and partitions. Safe for concurrent use.
type Network struct {
	mu       sync.Mutex
	rng      *rand.Rand
	nodes    map[string]replicate.Receiver
	faults   Faults
	cut      map[[2]string]bool // unordered pairs that cannot talk
	stale    map[[2]string][][]byte
	sent     uint64 // encoded push bytes handed to receivers
	received uint64 // encoded result bytes handed back

	// The delivery plane (network_devices.go).
	devices  map[messages.DeviceAddress]deviceEntry
	links    map[linkKey]*envelopeLink
	inflight int // envelopes handed over and not yet delivered or lost

	// linkHold, when set (tests: a receiver slower than its senders), is
	// called by a link's drainer before it hands on each envelope.
	linkHold func()
}

// NewNetwork returns an empty network whose faults draw from seed.
func NewNetwork(seed uint64) *Network {
	return &Network{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), nodes: map[string]replicate.Receiver{},
		cut: map[[2]string]bool{}, stale: map[[2]string][][]byte{}}
}

// Register makes r reachable as name (replacing a previous receiver, as a
// restarted node does).
func (n *Network) Register(name string, r Receiver) {
	n.mu.Lock()
	n.nodes[name] = r
	n.mu.Unlock()
	if a, ok := r.(transportAttacher); ok {
		a.attachTransport(n.Transport(name)) // a receive-only node pulls over it
	}
}

// transportAttacher is a receiver that reconciles with the peers it
// accepts over the transport that delivers their pushes (a Node).
type transportAttacher interface {
	attachTransport(Transport)
}

// Unregister makes name unreachable (a crashed or stopped node).
func (n *Network) Unregister(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, name)
}

// SetFaults replaces the injected faults.
func (n *Network) SetFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Partition cuts every link between two different groups; links inside a
// group and to nodes in no group are unchanged.
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.cut[pair(a, b)] = true
				}
			}
		}
	}
}

// Cut cuts the link between a and b.
func (n *Network) Cut(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[pair(a, b)] = true
}

// Heal restores every link.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]string]bool{}
}

// Bytes returns the encoded bytes of pushes delivered and of results
// returned so far.
func (n *Network) Bytes() (pushes, results uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent, n.received
}

// Transport returns the transport node from uses to push. Every push
// sent through it reaches the receiver with From set to from (the
// network stamps the sender, as an authenticating transport would).
func (n *Network) Transport(from string) Transport { return &netTransport{n: n, from: from} }

type netTransport struct {
	n    *Network
	from string
}

// plan is what the network decided for one push, drawn under its lock.
type plan struct {
	to                   replicate.Receiver
	drop, dropReply, dup bool
	stale                []byte
	delay                time.Duration
}

func (n *Network) plan(from, to string, raw []byte) (plan, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.nodes[to]
	if !ok {
		return plan{}, fmt.Errorf("%w: %s is not on the network", replicate.ErrUnreachable, to)
	}
	if n.cut[pair(from, to)] {
		return plan{}, fmt.Errorf("%w: %s and %s are partitioned", replicate.ErrUnreachable, from, to)
	}
	f := n.faults
	p := plan{to: r}
	p.drop = n.rng.Float64() < f.Drop
	p.dropReply = n.rng.Float64() < f.DropReply
	p.dup = n.rng.Float64() < f.Duplicate
	k := [2]string{from, to}
	if old := n.stale[k]; len(old) > 0 && n.rng.Float64() < f.Reorder {
		p.stale = old[n.rng.IntN(len(old))]
	}
	if f.Reorder > 0 {
		// Keep a few recent pushes per link to replay late.
		n.stale[k] = append(n.stale[k], raw)
		if len(n.stale[k]) > 4 {
			n.stale[k] = n.stale[k][1:]
		}
	}
	if f.Delay > 0 {
		p.delay = time.Duration(n.rng.Int64N(int64(f.Delay) + 1))
	}
	return p, nil
}

func (t *netTransport) Push(ctx context.Context, peer string, p *messages.SyncPush) (*messages.PushResult, error) {
	raw, err := messages.EncodeSyncPush(p)
	if err != nil {
		return nil, err
	}
	pl, err := t.n.plan(t.from, peer, raw)
	if err != nil {
		return nil, err
	}
	if pl.delay > 0 {
		select {
		case <-time.After(pl.delay):
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", replicate.ErrUnreachable, ctx.Err())
		}
	}
	if pl.drop {
		return nil, fmt.Errorf("%w: push to %s lost", replicate.ErrUnreachable, peer)
	}
	if pl.stale != nil {
		if _, err := t.deliver(ctx, pl.to, pl.stale); err != nil {
			return nil, err
		}
	}
	res, err := t.deliver(ctx, pl.to, raw)
	if err != nil {
		return nil, err
	}
	if pl.dup {
		if res, err = t.deliver(ctx, pl.to, raw); err != nil {
			return nil, err
		}
	}
	if pl.dropReply {
		return nil, fmt.Errorf("%w: result from %s lost", replicate.ErrUnreachable, peer)
	}
	return res, nil
}

// deliver hands an encoded push to the receiver and returns the decoded
// result, as a wire would.
func (t *netTransport) deliver(ctx context.Context, to replicate.Receiver, raw []byte) (*messages.PushResult, error) {
	p, err := messages.DecodeSyncPush(raw)
	if err != nil {
		return nil, err
	}
	// The network is the authenticator here: a push is from the node
	// whose transport sent it, whatever its From says.
	p.From = t.from
	res, err := to.HandlePush(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", replicate.ErrUnreachable, err)
	}
	out, err := messages.EncodePushResult(res)
	if err != nil {
		return nil, err
	}
	t.n.mu.Lock()
	t.n.sent += uint64(len(raw))
	t.n.received += uint64(len(out))
	t.n.mu.Unlock()
	return messages.DecodePushResult(out)
}
