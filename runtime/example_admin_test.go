package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// The admin endpoint: Config.MetricsAddr serves /metrics, /healthz and
// read-only JSON under /admin/ (status, peers, watermarks, inbound,
// messages) — what "sspctl status --addr" reads. Node.Status returns the
// same summary in-process.
func ExampleNode_Status() {
	ctx := context.Background()
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("example"), Name: "a", MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close()
	_ = n.DefineTable(ctx, runtime.TableDef{Schema: "app", Table: "todo", KeyColumns: []string{"id"}, Columns: []string{"title"}})
	_, _ = n.Upsert(ctx, "app", "todo", map[string]any{"id": 1}, map[string]any{"title": "ship"})

	resp, err := http.Get("http://" + n.MetricsAddr() + "/admin/status")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var st runtime.Status
	_ = json.NewDecoder(resp.Body).Decode(&st)
	fmt.Println(resp.StatusCode, st.Name, st.LastSeq, st.Tables)
	// A state-changing action needs Config.AdminToken.
	post, err := http.Post("http://"+n.MetricsAddr()+"/admin/sync?peer=b", "", nil)
	if err == nil {
		post.Body.Close()
		fmt.Println(post.StatusCode)
	}
	// Output:
	// 200 a 1 1
	// 403
}

// TLS helpers: package meshtls creates a mesh CA and per-node
// certificates (also "sspctl tls ca|node") for RemoteConfig's mutual TLS;
// the node name is bound into the certificate, which is what the remote
// checks a push's sender against.
func ExampleRemoteConfig() {
	ca, err := meshtls.NewCA("my mesh", 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	nc, err := ca.Issue("node-a", meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	cert := nc.TLSCertificate()
	rc := &runtime.RemoteConfig{Host: "127.0.0.1",
		TLS:       meshtls.ServerConfig(cert, ca.Pool()),
		ClientTLS: meshtls.ClientConfig(cert, ca.Pool())}
	fmt.Println(rc.TLS.ClientAuth, len(rc.ClientTLS.Certificates))
	// Output: RequireAndVerifyClientCert 1
}
