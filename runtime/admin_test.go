package runtime

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func adminDo(t *testing.T, method, url, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func adminGet[T any](t *testing.T, n *Node, path string) T {
	t.Helper()
	code, b := adminDo(t, http.MethodGet, "http://"+n.MetricsAddr()+path, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
	return v
}

// The admin endpoint reports status, peers (lag in events while the time
// lag is still 0: a joiner without watermarks), watermarks, inbound
// progress and pending messages, read-only; a sync needs the token.
func TestAdminEndpoint(t *testing.T) {
	ctx := context.Background()
	const token = "0123456789abcdef-admin"
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	a := openTestNode(t, Config{Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token,
		Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("a", aAddr)}})
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, Wall: a.wall.Now, MetricsAddr: "127.0.0.1:0",
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("b", bAddr), Buffer: 4}})
	for _, n := range []*testNode{a, b} {
		net.Register(n.Name(), n.Node)
		net.RegisterDevice(n.Name(), n.Node)
		n.define(defT)
	}
	trustNode(t, b.Node, a.Node)
	upsertN(t, a.Node, 0, 40, "a")
	if err := b.AcceptPeer("a", PeerSite(a.Identity().Site)); err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	// b has nothing yet: 40 events behind, no watermark, time lag 0.
	peers := adminGet[[]PeerReport](t, a.Node, "/admin/peers")
	if len(peers) != 1 || peers[0].Peer != "b" || peers[0].LagEvents != 40 || peers[0].BacklogEvents != 40 || peers[0].LagMS != 0 || peers[0].GroupsWithoutWatermark != 1 {
		t.Fatalf("peers before sync: %+v", peers)
	}
	st := adminGet[Status](t, a.Node, "/admin/status")
	if st.Name != "a" || st.LastSeq != 40 || st.Tables != 1 || st.Peers != 1 || st.BacklogEvents != 40 || st.Site != a.Identity().Site.String() || st.Messages == nil || st.Device != aAddr.String() {
		t.Fatalf("status: %+v", st)
	}
	// State-changing actions: refused without the token, run with it.
	url := "http://" + a.MetricsAddr() + "/admin/sync?peer=b"
	if code, _ := adminDo(t, http.MethodPost, url, ""); code != http.StatusUnauthorized {
		t.Fatalf("sync without token: %d", code)
	}
	if code, _ := adminDo(t, http.MethodPost, url, "wrong-token-wrong-token"); code != http.StatusUnauthorized {
		t.Fatalf("sync with a wrong token: %d", code)
	}
	if code, _ := adminDo(t, http.MethodGet, url, token); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET sync: %d", code)
	}
	if code, body := adminDo(t, http.MethodPost, "http://"+b.MetricsAddr()+"/admin/sync?peer=a", ""); code != http.StatusForbidden || !strings.Contains(string(body), "AdminToken") {
		t.Fatalf("sync on a node without AdminToken: %d %s", code, body)
	}
	if code, body := adminDo(t, http.MethodPost, url, token); code != 200 {
		t.Fatalf("sync with token: %d %s", code, body)
	}
	peers = adminGet[[]PeerReport](t, a.Node, "/admin/peers")
	if peers[0].LagEvents != 0 || peers[0].Cursor != 40 || peers[0].GroupsWithoutWatermark != 0 || peers[0].LastError != "" {
		t.Fatalf("peers after sync: %+v", peers)
	}
	// Read-only endpoints refuse writes.
	if code, _ := adminDo(t, http.MethodPost, "http://"+a.MetricsAddr()+"/admin/status", token); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST status: %d", code)
	}
	marks := adminGet[[]WatermarkReport](t, b.Node, "/admin/watermarks")
	found := false
	for _, w := range marks {
		found = found || w.Site == a.Identity().Site.String() && w.Table == "t" && w.Raw != 0
	}
	if !found {
		t.Fatalf("b's watermarks lack a's group: %+v", marks)
	}
	in := adminGet[[]InboundReport](t, b.Node, "/admin/inbound")
	if len(in) != 1 || in[0].From != "a" || in[0].Through != 40 || in[0].Tail != 40 {
		t.Fatalf("inbound: %+v", in)
	}
	// Pending messages: one sent by a, pending at b until b commits.
	if _, err := a.Send(ctx, bAddr, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	m := <-b.Messages()
	mc := adminGet[MessageCounts](t, b.Node, "/admin/messages")
	if mc.PendingInbound != 1 {
		t.Fatalf("b's messages: %+v", mc)
	}
	if _, err := b.CommitMessage(ctx, m); err != nil {
		t.Fatal(err)
	}
	if mc = adminGet[MessageCounts](t, b.Node, "/admin/messages"); mc.PendingInbound != 0 {
		t.Fatalf("after commit: %+v", mc)
	}
}

func TestAdminTokenValidated(t *testing.T) {
	for _, cfg := range []Config{{AdminToken: "short", MetricsAddr: "127.0.0.1:0"}, {AdminToken: "0123456789abcdef-long"}} {
		cfg.InMemory, cfg.MeshID = true, testMesh
		if _, err := Open(context.Background(), cfg); !isConfigErr(err, "AdminToken") {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}
