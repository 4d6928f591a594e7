package device_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

var (
	bg        = context.Background()
	aliceAddr = messages.DeviceAddress{User: "alice", Device: 1}
	bobAddr   = messages.DeviceAddress{User: "bob", Device: 1}
	carolAddr = messages.DeviceAddress{User: "carol", Device: 1}
)

// lossyTransport wraps a transport; while dropAcks is set it fails every
// hand-off of an envelope whose plaintext we cannot see, so tests flip it
// only around ACK sends.
type lossyTransport struct {
	session.Transport
	fail atomic.Bool
}

var errTransportDown = errors.New("test: transport down")

func (t *lossyTransport) Send(ctx context.Context, peer messages.DeviceAddress, env []byte) error {
	if t.fail.Load() {
		return errTransportDown
	}
	return t.Transport.Send(ctx, peer, env)
}

// mesh is a set of devices over an in-process network.
type mesh struct {
	tb    testing.TB
	sys   *actor.ActorSystem
	net   *session.InProcess
	clock *actortest.Clock
}

func newMesh(tb testing.TB) *mesh {
	return &mesh{tb: tb, sys: actortest.System(tb), net: session.NewInProcess(), clock: actortest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
}

// dev is one device of the mesh.
type dev struct {
	ms    *mesh
	addr  messages.DeviceAddress
	store persistence.DeliveryStore
	tr    *lossyTransport
	tweak func(*device.Config)
	d     *device.Device

	// bolt-backed devices
	path string
	db   *bolt.DB
	fail atomic.Pointer[string] // failpoint name armed (nil: none)
}

func (ms *mesh) add(addr messages.DeviceAddress, tweak func(*device.Config)) *dev {
	ms.tb.Helper()
	v := &dev{ms: ms, addr: addr, store: memory.NewDelivery(), tweak: tweak}
	v.start()
	return v
}

// addBolt adds a device over a bbolt file with armable failpoints.
func (ms *mesh) addBolt(addr messages.DeviceAddress, tweak func(*device.Config)) *dev {
	ms.tb.Helper()
	v := &dev{ms: ms, addr: addr, tweak: tweak, path: filepath.Join(ms.tb.TempDir(), addr.User+".db")}
	v.openDB()
	v.start()
	return v
}

func (v *dev) openDB() {
	v.ms.tb.Helper()
	db, err := bolt.Open(v.path, bolt.Options{NoSync: true, Failpoint: func(name string) error {
		if p := v.fail.Load(); p != nil && *p == name {
			return persistence.ErrInjected
		}
		return nil
	}})
	if err != nil {
		v.ms.tb.Fatalf("bolt.Open: %v", err)
	}
	v.db = db
	v.store = db.Delivery()
	v.ms.tb.Cleanup(func() { _ = db.Close() })
}

// arm makes the named failpoint fail until disarm.
func (v *dev) arm(name string) { v.fail.Store(&name) }
func (v *dev) disarm()         { v.fail.Store(nil) }

func (v *dev) start() {
	v.ms.tb.Helper()
	v.tr = &lossyTransport{Transport: v.ms.net.Endpoint(v.addr)}
	cfg := device.Config{Store: v.store, Transport: v.tr, Address: v.addr, Now: v.ms.clock.Now,
		Session: func(c *session.Config) { c.RefreshInterval = -1 }}
	if v.tweak != nil {
		v.tweak(&cfg)
	}
	d, err := device.Open(bg, v.ms.sys, cfg)
	if err != nil {
		v.ms.tb.Fatalf("device.Open(%s): %v", v.addr, err)
	}
	v.d = d
	v.ms.net.Register(v.addr, d.Sessions())
	v.ms.tb.Cleanup(func() { _ = d.Close() })
}

// restart closes the device (and its bolt file, if any) and opens it
// again over the same data, as a process restart would.
func (v *dev) restart() {
	v.ms.tb.Helper()
	_ = v.d.Close()
	if v.db != nil {
		v.disarm()
		_ = v.db.Close()
		v.openDB()
	} else if m, ok := v.store.(*memory.DeliveryStore); ok {
		v.store = m.Reopen()
	}
	v.start()
}

// take returns the envelopes queued for v.
func (v *dev) take() []session.Delivered { return v.ms.net.Take(v.addr) }

// takeOne returns the single envelope queued for v.
func (v *dev) takeOne() session.Delivered {
	v.ms.tb.Helper()
	got := v.take()
	if len(got) != 1 {
		v.ms.tb.Fatalf("%s has %d envelopes queued, want 1", v.addr, len(got))
	}
	return got[0]
}

// pump receives every envelope queued for v and returns the results.
func (v *dev) pump() []device.ReceiveResult {
	v.ms.tb.Helper()
	var out []device.ReceiveResult
	for _, e := range v.take() {
		r, err := v.d.Receive(bg, e.From, e.Envelope)
		if err != nil {
			v.ms.tb.Fatalf("%s Receive from %s: %v", v.addr, e.From, err)
		}
		out = append(out, r)
	}
	return out
}

// acksOf drops the held receipts from rs (a copy of a pending message is
// answered with one): what is left are the ACKs and other results.
func acksOf(rs []device.ReceiveResult) []device.ReceiveResult {
	var out []device.ReceiveResult
	for _, r := range rs {
		if r.Kind != device.Held {
			out = append(out, r)
		}
	}
	return out
}

func (v *dev) recv(e session.Delivered) (device.ReceiveResult, error) {
	return v.d.Receive(bg, e.From, e.Envelope)
}

func (v *dev) mustRecv(e session.Delivered) device.ReceiveResult {
	v.ms.tb.Helper()
	r, err := v.recv(e)
	if err != nil {
		v.ms.tb.Fatalf("%s Receive: %v", v.addr, err)
	}
	return r
}

func (v *dev) send(to *dev, body string) device.SentMessage {
	v.ms.tb.Helper()
	sm, err := v.d.Send(bg, to.addr, []byte(body))
	if err != nil {
		v.ms.tb.Fatalf("%s Send: %v", v.addr, err)
	}
	return sm
}

func (v *dev) resend(to *dev, id messages.LogicalMessageID) {
	v.ms.tb.Helper()
	if err := v.d.Resend(bg, to.addr, id); err != nil {
		v.ms.tb.Fatalf("%s Resend: %v", v.addr, err)
	}
}

// sendRaw sends an application frame with an arbitrary (id, body) on the
// session, bypassing the outbox (a buggy or hostile sender).
func (v *dev) sendRaw(to *dev, id messages.LogicalMessageID, body string) {
	v.ms.tb.Helper()
	frame, err := messages.EncodeSecurePayload(&messages.SecurePayload{Type: messages.PayloadApplicationMessage, ID: id, Body: []byte(body)})
	if err != nil {
		v.ms.tb.Fatal(err)
	}
	if _, err := v.d.Sessions().Send(bg, to.addr, frame); err != nil {
		v.ms.tb.Fatalf("raw send: %v", err)
	}
}

func (v *dev) pendingCount() int {
	v.ms.tb.Helper()
	n, err := v.d.PendingReceivedMessageCount(bg, nil)
	if err != nil {
		v.ms.tb.Fatalf("PendingReceivedMessageCount: %v", err)
	}
	return n
}

func (v *dev) pendingAll() []device.ReceivedMessage {
	v.ms.tb.Helper()
	var out []device.ReceivedMessage
	var after uint64
	for {
		p, err := v.d.PendingReceivedMessages(bg, after, device.MaxPageSize, nil)
		if err != nil {
			v.ms.tb.Fatalf("PendingReceivedMessages: %v", err)
		}
		out = append(out, p.Messages...)
		if !p.More {
			return out
		}
		after = p.Next
	}
}

func (v *dev) sentPending() []device.SentMessage {
	v.ms.tb.Helper()
	p, err := v.d.PendingSentMessages(bg, 0, device.MaxPageSize, nil)
	if err != nil {
		v.ms.tb.Fatalf("PendingSentMessages: %v", err)
	}
	return p.Messages
}

func (v *dev) processed(from *dev, id messages.LogicalMessageID) (device.ProcessedMessage, bool) {
	v.ms.tb.Helper()
	p, ok, err := v.d.ProcessedMessage(bg, from.addr, id)
	if err != nil {
		v.ms.tb.Fatalf("ProcessedMessage: %v", err)
	}
	return p, ok
}

func (v *dev) session(peer messages.DeviceAddress) []byte {
	v.ms.tb.Helper()
	var out []byte
	if err := v.store.View(bg, func(r persistence.DeliveryReader) error {
		var err error
		out, _, err = r.Session(peer)
		return err
	}); err != nil {
		v.ms.tb.Fatal(err)
	}
	return out
}

func (v *dev) commit(from *dev, id messages.LogicalMessageID) device.CommitResult {
	v.ms.tb.Helper()
	r, err := v.d.CommitReceivedMessage(bg, from.addr, id)
	if err != nil {
		v.ms.tb.Fatalf("CommitReceivedMessage: %v", err)
	}
	return r
}

// pair returns alice and bob (memory stores) with an established session
// in both directions.
func pair(tb testing.TB) (*mesh, *dev, *dev) {
	ms := newMesh(tb)
	a := ms.add(aliceAddr, nil)
	b := ms.add(bobAddr, nil)
	return ms, a, b
}

func newMemoryStore() persistence.DeliveryStore { return memory.NewDelivery() }
