package runtime

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestMetricsAndHealthListener(t *testing.T) {
	n := openTestNode(t, Config{MetricsAddr: "127.0.0.1:0"})
	n.define(defT)
	upsertN(t, n.Node, 0, 2, "a")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + n.MetricsAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	code, body := get("/metrics")
	for _, want := range []string{`syncmesh_sync_events_total{outcome="applied",reason="none"} 2`, "syncmesh_storage_tx_seconds_bucket"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("metrics (%d) lack %q", code, want)
		}
	}
	addr := n.MetricsAddr()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatal("listener still serving after Close")
	}
}

func TestMetricsAddrTakenIsAConfigError(t *testing.T) {
	n := openTestNode(t, Config{MetricsAddr: "127.0.0.1:0"})
	_, err := Open(n.ctx, Config{InMemory: true, MeshID: testMesh, MetricsAddr: n.MetricsAddr()})
	var ce *ConfigError
	if err == nil || !errors.As(err, &ce) || ce.Field != "MetricsAddr" {
		t.Fatalf("taken address: %v", err)
	}
}
