package session_test

import (
	"context"
	"crypto/rand"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/syncmesh/syncmesh/actors/inbound"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func newID(tb testing.TB) messages.LogicalMessageID {
	tb.Helper()
	var id messages.LogicalMessageID
	if _, err := rand.Read(id[:]); err != nil {
		tb.Fatal(err)
	}
	return id
}

// checkChainOrder fails unless the envelopes are consecutive messages of
// one sending chain, in order.
func checkChainOrder(tb testing.TB, what string, got []session.Delivered, n int) {
	tb.Helper()
	if len(got) != n {
		tb.Fatalf("%s: %d envelopes queued, want %d", what, len(got), n)
	}
	var first messages.RatchetHeader
	for i, d := range got {
		env, err := messages.DecodeEnvelope(d.Envelope)
		if err != nil {
			tb.Fatalf("%s: envelope %d: %v", what, i, err)
		}
		h := env.Header
		if i == 0 {
			first = h
			continue
		}
		if h.DH != first.DH || h.N != first.N+uint32(i) {
			tb.Fatalf("%s: envelope %d of the queue is message %d of its chain (chain changed: %v), want %d", what, i, h.N, h.DH != first.DH, first.N+uint32(i))
		}
	}
}

// With an OrderedTransport (InProcess's endpoints are), concurrent sends
// and commits of one peer reach the transport in the order of the ratchet
// chain: each envelope is queued by the committer once it is durable,
// before its caller is answered — not by the callers, which overtake each
// other.
func TestOrderedTransportGetsOnePeersEnvelopesInChainOrder(t *testing.T) {
	ms := newMesh(t)
	var acks atomic.Int64
	a := ms.add(aliceAddr, nil, nil)
	b := ms.add(bobAddr, nil, func(c *session.Config) {
		c.OnAck = func(to messages.DeviceAddress, _ messages.LogicalMessageID, err error) {
			if to == aliceAddr && err == nil {
				acks.Add(1)
			}
		}
	})
	if _, ok := ms.net.Endpoint(aliceAddr).(session.OrderedTransport); !ok {
		t.Fatal("InProcess endpoints are not an OrderedTransport")
	}

	// The session, established by one message and its ACK.
	first := newID(t)
	if s, err := a.m.SendMessage(bg, b.addr, first, []byte("hello")); err != nil || s.HandOff != nil {
		t.Fatalf("first send: %v, hand-off %v", err, s.HandOff)
	}
	receiveAll(t, b, ms.net.Take(b.addr), 1)
	if f, err := b.m.Finalize(bg, a.addr, first, persistence.FinalizationCommitted, 0); err != nil || !f.AckSent {
		t.Fatalf("first commit: %v, AckSent %v", err, f.AckSent)
	}
	receiveAll(t, a, ms.net.Take(a.addr), 1)

	const n = 64
	ids := make([]messages.LogicalMessageID, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		ids[i] = newID(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := a.m.SendMessage(bg, b.addr, ids[i], []byte("m"))
			if err == nil {
				err = s.HandOff
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := ms.net.Take(b.addr)
	checkChainOrder(t, "alice's messages", got, n)
	receiveAll(t, b, got, n)

	// bob's commits, concurrent: the ACKs, one chain of bob's, in order.
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := b.m.Finalize(bg, a.addr, ids[i], persistence.FinalizationCommitted, 0)
			if err == nil && (f.Outcome != inbound.OutcomeCommitted || !f.AckSent) {
				err = errOutcome(f.Outcome)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := acks.Load(); got != n+1 {
		t.Fatalf("OnAck told of %d ACKs handed over, want %d", got, n+1)
	}
	acksGot := ms.net.Take(a.addr)
	checkChainOrder(t, "bob's ACKs", acksGot, n)
	for i, r := range receiveAll(t, a, acksGot, n) {
		if r.Outcome != inbound.OutcomeAcknowledgement || !r.Cleared {
			t.Fatalf("ACK %d: %v, cleared %v", i, r.Outcome, r.Cleared)
		}
	}
}

type errOutcome inbound.Outcome

func (e errOutcome) Error() string { return "outcome " + inbound.Outcome(e).String() }

// receiveAll receives each envelope at n in order and checks the count.
func receiveAll(tb testing.TB, at *node, ds []session.Delivered, want int) []session.Received {
	tb.Helper()
	if len(ds) != want {
		tb.Fatalf("%s: %d envelopes, want %d", at.addr, len(ds), want)
	}
	out := make([]session.Received, 0, len(ds))
	for i, d := range ds {
		r, err := at.m.Receive(bg, d.From, d.Envelope)
		if err != nil {
			tb.Fatalf("%s: receive %d from %s: %v", at.addr, i, d.From, err)
		}
		out = append(out, r)
	}
	return out
}

// syncTransport delivers synchronously, as runtime/hosting's transport
// does: Send returns once the receiving manager processed the envelope
// (its ACK, if any, comes back through Send too). It is not an
// OrderedTransport (the embedded interface hides Enqueue), so the managers
// hand envelopes over from the callers' goroutines.
type syncTransport struct {
	session.Transport
	self messages.DeviceAddress
	to   func() *session.Manager
}

func (t syncTransport) Send(ctx context.Context, peer messages.DeviceAddress, env []byte) error {
	_, err := t.to().Receive(ctx, t.self, env)
	return err
}

// A transport that waits for the receiver never runs on the committer's
// goroutine: concurrent sends whose hand-off synchronously receives at the
// peer, and commits whose ACK synchronously clears at the sender, all
// complete (calling Send from the committer would deadlock on the peer's
// ACK coming back through it, or serialize every hand-off).
func TestSynchronousTransportIsCalledFromTheCallers(t *testing.T) {
	ms := newMesh(t)
	var a, b *node
	a = ms.add(aliceAddr, nil, func(c *session.Config) {
		c.Transport = syncTransport{Transport: c.Transport, self: aliceAddr, to: func() *session.Manager { return b.m }}
	})
	b = ms.add(bobAddr, nil, func(c *session.Config) {
		c.Transport = syncTransport{Transport: c.Transport, self: bobAddr, to: func() *session.Manager { return a.m }}
	})
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := newID(t)
			s, err := a.m.SendMessage(bg, b.addr, id, []byte("m"))
			if err == nil {
				err = s.HandOff
			}
			if err == nil {
				var f session.Finalized
				f, err = b.m.Finalize(bg, a.addr, id, persistence.FinalizationCommitted, 0)
				if err == nil && !f.AckSent {
					err = errOutcome(f.Outcome)
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(ms.net.Take(a.addr))+len(ms.net.Take(b.addr)) != 0 {
		t.Fatal("envelopes went to the in-process inboxes, not through the synchronous Send")
	}
	var pending int
	if err := a.store.View(bg, func(r persistence.DeliveryReader) error {
		var err error
		pending, err = r.PendingOutboundCount()
		return err
	}); err != nil || pending != 0 {
		t.Fatalf("alice: %d sent messages still pending (%v): the ACKs did not clear them", pending, err)
	}
}
