// Package membercerts issues the member certificates of runtime/hosting's
// test clusters with the mesh's own CA tooling (runtime/meshtls, what
// `sspctl tls ca` and `sspctl tls node` run), into a directory laid out
// as sspctl lays it out, so hosting.MemberTLS loads them.
package membercerts

import (
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// Write creates a CA in dir (unless one is there) and a certificate for
// each name, valid for 127.0.0.1.
func Write(dir string, names ...string) error {
	ca, err := meshtls.LoadOrCreateCA(dir, "hosting test CA")
	if err != nil {
		return err
	}
	for _, n := range names {
		nc, err := ca.Issue(n, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			return err
		}
		if err := nc.Save(dir); err != nil {
			return err
		}
	}
	return nil
}
