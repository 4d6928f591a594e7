package hosting_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdtest"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/membercerts"
)

// tenantReport mirrors internal/etcdcluster's TenantReport.
type tenantReport struct {
	Refused                      map[string]string
	NotForbidden                 []string
	BIntact                      bool
	BState                       string
	Created, OverQuota           int
	DiskBefore, DiskFlood, After int64
	Errors                       []string
}

// TestTenantsEtcd: three hosting member processes on etcd, talking
// mutual TLS with certificates from the mesh CA tooling, and a fourth
// (router-only) member acting for two tenants:
//
//   - a member's port speaks TLS only and requires a client certificate
//     of the mesh CA: an HTTP/2 preface in the clear gets no SETTINGS back
//     and a TLS client without a certificate gets no answer;
//   - tenant A cannot read, commit, discard, send as, deliver as, create
//     or delete tenant B's units: each attempt is refused with
//     ErrForbidden, and B's pending message, processed record and pending
//     sent message are unchanged;
//   - A's creation flood stops at its quota (ErrQuota), and deleting the
//     units returns the disk (measured, printed).
func TestTenantsEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 4 processes")
	}
	const quota = 10
	endpoint := etcdtest.Start(t)
	exe := buildEtcdCluster(t)
	root, certs := t.TempDir(), t.TempDir()
	if err := membercerts.Write(certs, "member0", "member1", "member2", "front"); err != nil {
		t.Fatal(err)
	}
	common := []string{"-etcd", endpoint, "-root", root, "-ttl", etcdTTL.String(), "-certs", certs, "-quota", strconv.Itoa(quota)}
	var addrs []string
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("member%d", i)
		c := startChild(t, exe, name, append([]string{"-mode", "member", "-name", name}, common...)...)
		ev := c.wait(t, "joined", 30*time.Second)
		if ev.ID == "" || ev.ID[:len(name)+1] != name+"@" {
			t.Fatalf("%s joined with member id %q, want its certificate's name first", name, ev.ID)
		}
		addrs = append(addrs, ev.Member)
	}
	for _, a := range addrs {
		probeMemberTransport(t, a, certs)
	}

	front := startChild(t, exe, "front", append([]string{"-mode", "tenants", "-name", "front", "-members", "3"}, common...)...)
	tr := front.wait(t, "tenants", 3*time.Minute).Tenant
	if tr == nil {
		t.Fatal("no report")
	}
	for name, err := range tr.Refused {
		t.Logf("tenant A: %s → %s", name, err)
	}
	if len(tr.NotForbidden) > 0 || len(tr.Refused) != 11 {
		t.Errorf("not refused with ErrForbidden: %v (of %d attempts)", tr.NotForbidden, len(tr.Refused))
	}
	if !tr.BIntact {
		t.Errorf("tenant B's state after A's attempts: %s", tr.BState)
	}
	t.Logf("flood: %d created, %d over quota; disk %d KiB → %d KiB → %d KiB after delete", tr.Created, tr.OverQuota, tr.DiskBefore>>10, tr.DiskFlood>>10, tr.After>>10)
	// Tenant A owned one unit (a1.1) before its flood of quota+10.
	if tr.Created != quota-1 || tr.OverQuota != 11 || len(tr.Errors) > 0 {
		t.Errorf("flood: %d created, %d over quota (quota %d, A owning 1 before), errors %v", tr.Created, tr.OverQuota, quota, tr.Errors)
	}
	if tr.After > tr.DiskBefore+(tr.DiskFlood-tr.DiskBefore)/quota {
		t.Errorf("disk after deleting the flood %d, before it %d", tr.After, tr.DiskBefore)
	}
}

// probeMemberTransport checks that a member's port serves TLS only, to
// clients with a certificate of the mesh CA.
func probeMemberTransport(t *testing.T, addr, certs string) {
	t.Helper()
	// An HTTP/2 client preface in the clear: an h2c server answers with
	// a SETTINGS frame (type 4 in a 9-byte frame header).
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"))
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	hdr := make([]byte, 9)
	n, _ := io.ReadFull(conn, hdr)
	_ = conn.Close()
	if n == 9 && hdr[3] == 0x4 {
		t.Errorf("%s answered a cleartext HTTP/2 preface with SETTINGS: the member speaks h2c", addr)
	}
	// TLS with the mesh CA but no client certificate: no gRPC answer.
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Logf("%s: TLS without a client certificate refused at the handshake: %v", addr, err)
		return
	}
	_, _ = tc.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"))
	_ = tc.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err = io.ReadFull(tc, hdr)
	_ = tc.Close()
	if n == 9 {
		t.Errorf("%s served a TLS client without a certificate", addr)
	} else {
		t.Logf("%s: TLS without a client certificate: %v", addr, err)
	}
}
