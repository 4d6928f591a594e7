package meshtls_test

import (
	"fmt"

	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// A mesh CA, one node certificate, and the node's remote configuration.
func Example() {
	ca, err := meshtls.NewCA("my mesh", 0)
	if err != nil {
		panic(err)
	}
	nc, err := ca.Issue("node-a", meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		panic(err)
	}
	cert := nc.TLSCertificate()
	rc := runtime.RemoteConfig{Port: 7400,
		TLS:       meshtls.ServerConfig(cert, ca.Pool()),
		ClientTLS: meshtls.ClientConfig(cert, ca.Pool())}
	name, _ := meshtls.NodeName(nc.Cert)
	fmt.Println(name, nc.Cert.DNSNames, nc.Cert.URIs[0], rc.TLS.ClientAuth)
	// Output: node-a [node-a] syncmesh://node/node-a RequireAndVerifyClientCert
}
