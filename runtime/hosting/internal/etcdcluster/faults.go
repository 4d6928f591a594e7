package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/syncmesh/syncmesh/runtime/hosting"
)

// replicasFromEnv is SYNCMESH_REPLICAS (0 when unset or not a number).
func replicasFromEnv() int {
	n, _ := strconv.Atoi(os.Getenv("SYNCMESH_REPLICAS"))
	return n
}

// setReplicas sets the replication factor of the units on cc: the field
// ClusterConfig.Replicas when this build's hosting has it (set through
// reflection, so this program compiles with and without it and the
// harness needs no change when replication lands). 0 and 1 mean one
// copy: without the field they change nothing; a factor above 1 without
// it is an error, so a replicated run cannot silently test one copy.
func setReplicas(cc *hosting.ClusterConfig, n int) error {
	if n <= 1 {
		return nil
	}
	f := reflect.ValueOf(cc).Elem().FieldByName("Replicas")
	if !f.IsValid() || !f.CanSet() || f.Kind() != reflect.Int {
		return fmt.Errorf("replicas %d: this build's hosting.ClusterConfig has no Replicas field (no replication)", n)
	}
	f.SetInt(int64(n))
	return nil
}

// dialFrom makes the member's remote dial every other member from the
// loopback address src, with the member's transport credentials (the
// option replaces the remote's dial options: the same credentials as
// hosting's own, plus the dialer), so the fault proxy can tell which
// process a connection comes from.
func dialFrom(src string, client *tls.Config) remote.ConfigOption {
	creds := insecure.NewCredentials()
	if client != nil {
		creds = credentials.NewTLS(client.Clone())
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return remote.WithDialOptions(
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
	)
}
