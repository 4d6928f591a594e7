package runtime

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// POST /admin/reconcile runs one reconciliation (token required, POST
// only), and Peers()/admin peers show the last one: time, result, events
// fetched, error. Background reconciliation is off, so every session here
// is one the test started.
func TestAdminReconcileAndLastReconcileInPeers(t *testing.T) {
	const token = "0123456789abcdef-admin"
	net := NewNetwork(1)
	a := openTestNode(t, Config{Name: "a", SyncInterval: -1, ReconcileInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token})
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	for _, n := range []*testNode{a, b} {
		n.define(defT)
		net.Register(n.Name(), n.Node)
	}
	trustNode(t, a.Node, b.Node)
	upsertN(t, b.Node, 0, 5, "a")
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	if ps := peerStatus(t, a.Node, "b"); !ps.LastReconcile.At.IsZero() {
		t.Fatalf("a reconciliation before any: %+v", ps.LastReconcile)
	}
	if p := adminGet[[]PeerReport](t, a.Node, "/admin/peers"); len(p) != 1 || p[0].LastReconcile != nil {
		t.Fatalf("admin peers before any reconciliation: %+v", p)
	}
	url := "http://" + a.MetricsAddr() + "/admin/reconcile?peer=b"
	if code, _ := adminDo(t, http.MethodPost, url, ""); code != http.StatusUnauthorized {
		t.Fatalf("reconcile without token: %d", code)
	}
	if code, _ := adminDo(t, http.MethodGet, url, token); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET reconcile: %d", code)
	}
	if code, _ := adminDo(t, http.MethodPost, "http://"+a.MetricsAddr()+"/admin/reconcile?peer=zz", token); code != http.StatusNotFound {
		t.Fatalf("reconcile with an unknown peer: %d", code)
	}
	if rowCount(t, a) != 0 {
		t.Fatal("a holds rows before reconciling")
	}
	code, body := adminDo(t, http.MethodPost, url, token)
	var s ReconcileSummary
	if err := json.Unmarshal(body, &s); code != 200 || err != nil || s.Result != "ok" || s.EventsMissing != 5 || s.EventsFetched != 5 || s.RoundTrips < 1 || s.BytesReceived == 0 {
		t.Fatalf("reconcile with token: %d %s", code, body)
	}
	if rowCount(t, a) != 5 {
		t.Fatalf("a holds %d rows after reconciling, want 5", rowCount(t, a))
	}
	ps := peerStatus(t, a.Node, "b")
	if l := ps.LastReconcile; !l.OK() || l.Fetched != 5 || l.Missing != 5 || l.At.IsZero() {
		t.Fatalf("Peers after reconciling: %+v", l)
	}
	p := adminGet[[]PeerReport](t, a.Node, "/admin/peers")
	if l := p[0].LastReconcile; l == nil || l.Result != "ok" || l.EventsFetched != 5 || l.Error != "" {
		t.Fatalf("admin peers after reconciling: %+v", l)
	}
	// A failed session is shown with its error.
	net.Cut("a", "b")
	if code, body := adminDo(t, http.MethodPost, url, token); code != http.StatusInternalServerError || !strings.Contains(string(body), "partitioned") {
		t.Fatalf("reconcile across a cut: %d %s", code, body)
	}
	if l := peerStatus(t, a.Node, "b").LastReconcile; l.OK() || l.Err == nil || l.Fetched != 0 {
		t.Fatalf("Peers after a failed reconciliation: %+v", l)
	}
	p = adminGet[[]PeerReport](t, a.Node, "/admin/peers")
	if l := p[0].LastReconcile; l == nil || l.Result != "error" || !strings.Contains(l.Error, "partitioned") {
		t.Fatalf("admin peers after a failed reconciliation: %+v", l)
	}
}
