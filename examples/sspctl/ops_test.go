package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// pending lists, from a running node's admin endpoint, the received
// messages its application has not committed, a page at a time with the
// cursor of the next page; help lists the command.
func TestPendingCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	net := runtime.NewNetwork(1)
	aAddr, bAddr := runtime.DeviceAddress{User: "alice", Device: 1}, runtime.DeviceAddress{User: "bob", Device: 1}
	open := func(name string, addr runtime.DeviceAddress, metrics string) *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: name, SyncInterval: -1, MetricsAddr: metrics,
			Device: &runtime.DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Buffer: 8}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		net.RegisterDevice(name, n)
		return n
	}
	a, b := open("alice", aAddr, ""), open("bob", bAddr, "127.0.0.1:0")
	for range 3 {
		if _, err := a.Send(ctx, bAddr, []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	// Receives are asynchronous: a generous deadline on a shared machine.
	for i := 0; ; i++ {
		if n, err := b.PendingReceivedMessageCount(ctx, nil); err == nil && n == 3 {
			break
		}
		if i == 600 {
			t.Fatal("3 pending messages not reached in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	addr := b.MetricsAddr()
	out := mustRun(t, "", "pending", "--addr", addr, "--limit", "2")
	lines := regexp.MustCompile(`(?m)^seq=(\d+) sender=alice\.1 id=[0-9a-f]{32} age=\d+s deliveries=[1-9]`).FindAllStringSubmatch(out, -1)
	if len(lines) != 2 || !strings.Contains(out, "pending=3 shown=2 more: sspctl pending --addr "+addr+" --after "+lines[1][1]) {
		t.Fatalf("pending --limit 2: %q", out)
	}
	rest := mustRun(t, "", "pending", "--addr", addr, "--after", lines[1][1])
	if strings.Count(rest, "sender=alice.1") != 1 || !strings.Contains(rest, "pending=3 shown=1\n") {
		t.Fatalf("pending --after %s: %q", lines[1][1], rest)
	}
	if out := mustRun(t, "", "pending", "--addr", addr, "--json"); !strings.Contains(out, `"total": 3`) {
		t.Fatalf("pending --json: %q", out)
	}
	if r := inProcess(t, "", "pending", "--addr", addr, "--limit", "101"); r.code != exitUsage {
		t.Fatalf("pending --limit 101: %+v", r)
	}
	// A node without a delivery plane has nothing pending: 404.
	if r := inProcess(t, "", "pending", "--addr", mustMetricsNode(t)); r.code != exitError || !strings.Contains(r.err, "404") {
		t.Fatalf("pending without a delivery plane: %+v", r)
	}
	if out := mustRun(t, "", "--help"); !strings.Contains(out, "\n  pending ") {
		t.Fatalf("--help does not list pending: %q", out)
	}
}

// mustMetricsNode opens an in-memory node serving its admin endpoint and
// returns the endpoint's address.
func mustMetricsNode(t *testing.T) string {
	t.Helper()
	n, err := runtime.Open(context.Background(), runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "plain", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n.MetricsAddr()
}
