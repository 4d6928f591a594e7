package session

import (
	"context"
	"fmt"
	"sync"

	"github.com/syncmesh/syncmesh/messages"
)

// Transport is the session layer's seam to the network: fetching a peer's
// prekey bundle and handing an envelope to a peer. Real transports come
// with the runtime; InProcess wires managers in one process.
type Transport interface {
	// FetchBundle returns a fresh prekey bundle published by peer.
	FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error)
	// Send hands envelope to the transport for delivery to peer. It is
	// called once the writes that produced the envelope are durable, on
	// the caller's goroutine (never the committer's), so a transport may
	// deliver synchronously.
	Send(ctx context.Context, peer messages.DeviceAddress, envelope []byte) error
}

// OrderedTransport is implemented by a Transport that only queues: its
// Enqueue puts an envelope on the (local device, peer) link's queue and
// returns without waiting for the receiver or calling into any device. The
// Manager then hands every envelope it produces (messages, resends, ACKs)
// over from its committer's replier goroutine, as soon as the transaction that
// produced it is durable and before its caller is answered — so one peer's
// envelopes reach the transport in the order of its ratchet chain, and the
// receiver decrypts on its current chain instead of through skipped keys
// (calls to Send from each caller's goroutine overtake each other). A
// transport whose Send waits for the receiver must not implement it: the
// committer would wait on a device whose ACK comes back through it. Without
// it, envelopes go through Send from the callers' goroutines.
type OrderedTransport interface {
	Transport
	// Enqueue queues envelope for peer behind every envelope enqueued for
	// peer before it, and returns at once. It takes ownership of envelope.
	// An error means it was not queued (as a failed Send: the message
	// stays pending). It must not block.
	Enqueue(peer messages.DeviceAddress, envelope []byte) error
}

// LocalAddresser is implemented by a Transport that knows the address of
// the device it serves (Config.Local defaults to it).
type LocalAddresser interface {
	LocalAddress() messages.DeviceAddress
}

// Delivered is one envelope queued by the in-process transport.
type Delivered struct {
	From     messages.DeviceAddress
	Envelope []byte
}

// InProcess connects managers of one process: a bundle fetch calls the
// peer manager's Bundle, and Send (or Enqueue: its endpoints implement
// OrderedTransport) queues the envelope in the recipient's inbox, from which the test (or a driver) takes it with Take. It is safe
// for concurrent use.
type InProcess struct {
	mu       sync.Mutex
	managers map[messages.DeviceAddress]*Manager
	inbox    map[messages.DeviceAddress][]Delivered
}

// NewInProcess returns an empty in-process network.
func NewInProcess() *InProcess {
	return &InProcess{managers: make(map[messages.DeviceAddress]*Manager), inbox: make(map[messages.DeviceAddress][]Delivered)}
}

// Register makes m reachable at addr (replacing a previous manager).
func (n *InProcess) Register(addr messages.DeviceAddress, m *Manager) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.managers[addr] = m
}

// Endpoint returns the Transport of the device at self.
func (n *InProcess) Endpoint(self messages.DeviceAddress) Transport {
	return &endpoint{n: n, self: self}
}

// Take removes and returns every envelope queued for addr, in send order.
func (n *InProcess) Take(addr messages.DeviceAddress) []Delivered {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.inbox[addr]
	delete(n.inbox, addr)
	return out
}

type endpoint struct {
	n    *InProcess
	self messages.DeviceAddress
}

// LocalAddress implements LocalAddresser.
func (e *endpoint) LocalAddress() messages.DeviceAddress { return e.self }

func (e *endpoint) FetchBundle(ctx context.Context, peer messages.DeviceAddress) (*messages.PrekeyBundle, error) {
	e.n.mu.Lock()
	m := e.n.managers[peer]
	e.n.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPeer, peer)
	}
	return m.Bundle(ctx)
}

func (e *endpoint) Send(ctx context.Context, peer messages.DeviceAddress, envelope []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return e.Enqueue(peer, append([]byte(nil), envelope...))
}

// Enqueue implements OrderedTransport: the inbox is a queue.
func (e *endpoint) Enqueue(peer messages.DeviceAddress, envelope []byte) error {
	e.n.mu.Lock()
	defer e.n.mu.Unlock()
	if _, ok := e.n.managers[peer]; !ok {
		return fmt.Errorf("%w: %s", ErrUnknownPeer, peer)
	}
	e.n.inbox[peer] = append(e.n.inbox[peer], Delivered{From: e.self, Envelope: envelope})
	return nil
}
