package runtime

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAdminPendingPagesReceivedMessages: /admin/pending lists the received
// messages the application has not committed (sender, id, age,
// deliveries; never the body) in pages with a cursor; a limit out of
// range or a malformed cursor answers 400, a node without a delivery
// plane 404, a write 405.
func TestAdminPendingPagesReceivedMessages(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	open := func(name string, addr DeviceAddress, metrics string) *Node {
		n, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), Name: name, SyncInterval: -1, MetricsAddr: metrics,
			Device: &DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Buffer: 8}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		net.RegisterDevice(name, n)
		return n
	}
	a, b := open("alice", aAddr, ""), open("bob", bAddr, "127.0.0.1:0")
	const sent = 3
	for range sent {
		if _, err := a.Send(ctx, bAddr, []byte("secret body")); err != nil {
			t.Fatal(err)
		}
	}
	waitPending(t, b, sent)

	first := adminGet[PendingReportPage](t, b, "/admin/pending?limit=2")
	if first.Total != sent || len(first.Messages) != 2 || !first.More || first.Next != first.Messages[1].Sequence {
		t.Fatalf("first page %+v: want 2 of %d, more, next = last sequence", first, sent)
	}
	for _, m := range first.Messages {
		if m.Sender != aAddr.String() || len(m.ID) != 32 || m.Deliveries < 1 || m.FrameBytes == 0 || m.ReceivedAt.IsZero() || m.AgeSeconds < 0 {
			t.Fatalf("pending report %+v", m)
		}
	}
	rest := adminGet[PendingReportPage](t, b, "/admin/pending?after="+strconv.FormatUint(first.Next, 10))
	if len(rest.Messages) != 1 || rest.More || rest.Messages[0].Sequence <= first.Next {
		t.Fatalf("second page %+v", rest)
	}
	_, raw := adminDo(t, http.MethodGet, "http://"+b.MetricsAddr()+"/admin/pending", "")
	if strings.Contains(string(raw), "secret body") {
		t.Fatalf("/admin/pending shows a message body: %s", raw)
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=x", "after=-1"} {
		if code, body := adminDo(t, http.MethodGet, "http://"+b.MetricsAddr()+"/admin/pending?"+q, ""); code != http.StatusBadRequest {
			t.Fatalf("/admin/pending?%s: %d %s, want 400", q, code, body)
		}
	}
	if code, _ := adminDo(t, http.MethodPost, "http://"+b.MetricsAddr()+"/admin/pending", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /admin/pending: %d, want 405", code)
	}
	plain, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), Name: "plain", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if code, _ := adminDo(t, http.MethodGet, "http://"+plain.MetricsAddr()+"/admin/pending", ""); code != http.StatusNotFound {
		t.Fatalf("/admin/pending without a delivery plane: %d, want 404", code)
	}
}

func waitPending(t *testing.T, n *Node, want int) {
	t.Helper()
	// Receives are asynchronous: a generous deadline on a shared machine.
	for range 600 {
		if got, err := n.PendingReceivedMessageCount(context.Background(), nil); err == nil && got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%d pending messages not reached in 30 s", want)
}
