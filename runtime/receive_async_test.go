package runtime

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// recordingTransport fetches bundles over the Network and keeps the
// envelopes it is handed instead of delivering them.
type recordingTransport struct {
	DeviceTransport
	mu   sync.Mutex
	envs [][]byte
}

func (c *recordingTransport) Send(_ context.Context, _ messages.DeviceAddress, env []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.envs = append(c.envs, append([]byte(nil), env...))
	return nil
}

// ReceiveEnvelopeAsync, what a transport outside this package pipelines a
// link with: envelopes queued back to back are each answered once,
// with the result ReceiveEnvelope would give (a Delivery of the
// message), after which the messages are pending at the receiver; a
// malformed envelope is answered with an error and changes nothing; a
// node without a device refuses.
func TestReceiveEnvelopeAsyncAnswersEachEnvelope(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	ct := &recordingTransport{DeviceTransport: net.DeviceTransport("alice", aAddr)}
	alice := openTestNode(t, Config{Name: "alice", SyncInterval: -1, Device: &DeviceConfig{Address: aAddr, Transport: ct}})
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	for _, n := range []*testNode{alice, bob} {
		net.RegisterDevice(n.Name(), n.Node)
	}
	const n = 5
	var ids []MessageID
	for i := 0; i < n; i++ {
		s, err := alice.Send(ctx, bAddr, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if len(ct.envs) != n {
		t.Fatalf("%d envelopes handed over, want %d", len(ct.envs), n)
	}
	type answer struct {
		res ReceiveResult
		err error
	}
	answers := make(chan answer, n+1)
	for _, env := range ct.envs {
		if err := bob.ReceiveEnvelopeAsync(ctx, aAddr, env, func(r ReceiveResult, err error) { answers <- answer{r, err} }); err != nil {
			t.Fatal(err)
		}
	}
	got := map[MessageID]bool{}
	for i := 0; i < n; i++ {
		a := <-answers
		if a.err != nil || a.res.Kind != Delivery || a.res.Message == nil || a.res.Message.ID != a.res.ID {
			t.Fatalf("answer %d: %+v %v", i, a.res, a.err)
		}
		got[a.res.ID] = true
	}
	for _, id := range ids {
		if !got[id] {
			t.Fatalf("message %s not answered", id)
		}
	}
	if c, err := bob.PendingReceivedMessageCount(ctx, nil); err != nil || c != n {
		t.Fatalf("bob has %d pending (%v), want %d", c, err, n)
	}
	if err := bob.ReceiveEnvelopeAsync(ctx, aAddr, []byte{0x01}, func(r ReceiveResult, err error) { answers <- answer{r, err} }); err != nil {
		t.Fatal(err)
	}
	if a := <-answers; !errors.Is(a.err, messages.ErrMalformed) {
		t.Fatalf("malformed envelope: %+v %v", a.res, a.err)
	}
	if c, _ := bob.PendingReceivedMessageCount(ctx, nil); c != n {
		t.Fatalf("a malformed envelope changed the pending count to %d", c)
	}
	plain := openTestNode(t, Config{})
	if err := plain.ReceiveEnvelopeAsync(ctx, aAddr, ct.envs[0], func(ReceiveResult, error) { t.Error("answered without a device") }); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("without a device: %v", err)
	}
}
