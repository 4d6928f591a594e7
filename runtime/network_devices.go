package runtime

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
)

// The delivery plane on the in-process Network: devices register with the
// node name that hosts them, so partitions cut both planes alike. Each
// link (from, to) delivers its envelopes in order on its own goroutine,
// asynchronously, as a wire would: Send returns once the envelope is
// handed over, and the faults (drop, duplicate, reorder, delay) apply.
// The receiver pipelines a link: up to linkWindow envelopes of it are being
// decided and written at once (in order, by the sender's peer actor), so
// consecutive envelopes share the receiver's transactions.

// linkWindow bounds the envelopes of one link the receiver holds in flight
// (decided, not yet durable): what one link can make a node hold.
const linkWindow = 64

type deviceEntry struct {
	name string
	node *Node
}

// envelopeLink is one (from, to) queue of envelopes, delivered in order
// by one drainer goroutine that runs only while the queue holds some.
type envelopeLink struct {
	mu      sync.Mutex
	queue   [][]byte
	running bool
	window  chan struct{} // one token per envelope in flight at the receiver
}

func newEnvelopeLink() *envelopeLink { return &envelopeLink{window: make(chan struct{}, linkWindow)} }

// maxLinkQueue bounds the envelopes one link queues ahead of its window,
// so one sender's flood holds bounded memory. Past it the Network refuses
// the hand-off (Enqueue answers ErrLinkFull: the sender is told, counts it
// and its retry schedule sends the message again); the remote, whose
// sender is in another process, drops the envelope at the receiver and
// says so there (Remote.deliverDevice).
const maxLinkQueue = 4 * linkWindow

// add queues env (first, with front) and reports whether the caller must
// start the drainer; ok false when the queue is full (env dropped).
func (l *envelopeLink) add(env []byte, front bool) (start, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) >= maxLinkQueue {
		return false, false
	}
	if front && len(l.queue) > 0 {
		l.queue = append([][]byte{env}, l.queue...)
	} else {
		l.queue = append(l.queue, env)
	}
	start = !l.running
	l.running = true
	return start, true
}

// next returns the next envelope, or false when the queue is empty (the
// drainer then stops).
func (l *envelopeLink) next() ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		l.running = false
		return nil, false
	}
	env := l.queue[0]
	l.queue = l.queue[1:]
	return env, true
}

type linkKey struct{ from, to messages.DeviceAddress }

// RegisterDevice makes n's device reachable at its address, hosted by the
// network name name (as used by Partition and Cut).
func (n *Network) RegisterDevice(name string, node *Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.devices == nil {
		n.devices = map[messages.DeviceAddress]deviceEntry{}
	}
	n.devices[node.DeviceAddress()] = deviceEntry{name: name, node: node}
}

// UnregisterDevice makes the device at addr unreachable (its node crashed).
func (n *Network) UnregisterDevice(addr messages.DeviceAddress) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.devices, addr)
}

// DeviceTransport returns the transport of the device self hosted by
// the node named name.
func (n *Network) DeviceTransport(name string, self messages.DeviceAddress) DeviceTransport {
	return &deviceTransport{n: n, name: name, self: self}
}

// Flush waits until every envelope handed to the network was delivered or
// lost (the delivery plane is asynchronous).
func (n *Network) Flush(ctx context.Context) error {
	for {
		n.mu.Lock()
		busy := n.inflight
		n.mu.Unlock()
		if busy == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

type deviceTransport struct {
	n    *Network
	name string
	self messages.DeviceAddress
}

func (t *deviceTransport) target(peer messages.DeviceAddress) (deviceEntry, error) {
	t.n.mu.Lock()
	defer t.n.mu.Unlock()
	e, ok := t.n.devices[peer]
	if !ok {
		return deviceEntry{}, fmt.Errorf("%w: device %s is not on the network", replicate.ErrUnreachable, peer)
	}
	if t.n.cut[pair(t.name, e.name)] {
		return deviceEntry{}, fmt.Errorf("%w: %s and %s are partitioned", replicate.ErrUnreachable, t.name, e.name)
	}
	return e, nil
}

func (t *deviceTransport) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	e, err := t.target(peer)
	if err != nil {
		return nil, err
	}
	b, err := e.node.Bundle(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", replicate.ErrUnreachable, err)
	}
	// As on a wire: the caller gets its own copy.
	raw, err := messages.EncodePrekeyBundle(b)
	if err != nil {
		return nil, err
	}
	return messages.DecodePrekeyBundle(raw)
}

// The link queues are the ordered hand-off of the session layer: the
// device's committer enqueues each envelope once it is durable, in chain
// order, and the link's drainer delivers them in that order.
var _ session.OrderedTransport = (*deviceTransport)(nil)

func (t *deviceTransport) Send(_ context.Context, peer messages.DeviceAddress, envelope []byte) error {
	return t.Enqueue(peer, append([]byte(nil), envelope...))
}

// Enqueue implements session.OrderedTransport: the envelope joins its
// link's queue (the faults apply) and Enqueue returns; the link's drainer
// delivers it.
func (t *deviceTransport) Enqueue(peer messages.DeviceAddress, env []byte) error {
	if _, err := t.target(peer); err != nil {
		return err
	}
	n := t.n
	n.mu.Lock()
	f := n.faults
	drop := n.rng.Float64() < f.Drop
	dup := n.rng.Float64() < f.Duplicate
	reorder := n.rng.Float64() < f.Reorder
	var delay time.Duration
	if f.Delay > 0 {
		delay = time.Duration(n.rng.Int64N(int64(f.Delay) + 1))
	}
	k := linkKey{t.self, peer}
	if n.links == nil {
		n.links = map[linkKey]*envelopeLink{}
	}
	l := n.links[k]
	if l == nil {
		l = newEnvelopeLink()
		n.links[k] = l
	}
	copies := 1
	if dup {
		copies = 2
	}
	if drop {
		copies = 0
	}
	start, full := false, false
	// Added under n.mu: the drainer removes an empty link under it too
	// (idle links keep no state), so nothing lands on a removed link.
	for i := 0; i < copies; i++ {
		s, ok := l.add(env, reorder)
		if ok {
			n.inflight++
		} else if i == 0 {
			full = true
		}
		start = s || start
	}
	if len(l.queue) == 0 && !l.running && n.links[k] == l {
		delete(n.links, k)
	}
	n.mu.Unlock()
	if start {
		go t.drain(l, k, delay)
	}
	if full {
		// Never silent: the sender's device counts and reports a refused
		// hand-off, and keeps the message pending for its retry schedule.
		return fmt.Errorf("%w: %s to %s holds %d envelopes", ErrLinkFull, t.self, peer, maxLinkQueue)
	}
	return nil
}

// drain delivers a link's envelopes in queue order until it is empty,
// then removes the link.
func (t *deviceTransport) drain(l *envelopeLink, k linkKey, delay time.Duration) {
	peer := k.to
	for {
		t.n.mu.Lock()
		env, ok := l.next()
		if !ok && t.n.links[k] == l {
			delete(t.n.links, k)
		}
		t.n.mu.Unlock()
		if !ok {
			return
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		if hold := t.n.linkHold; hold != nil {
			hold()
		}
		// Looked up at delivery: a restarted node is registered anew; a
		// partition or a stopped node loses the envelope.
		l.window <- struct{}{}
		delivered := func() {
			<-l.window
			t.n.mu.Lock()
			t.n.inflight--
			t.n.mu.Unlock()
		}
		to, err := t.target(peer)
		if err == nil {
			err = to.node.receiveEnvelopeAsync(context.Background(), t.self, env, func(error) { delivered() })
		}
		if err != nil {
			delivered()
		}
	}
}
