package main

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"strconv"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// replicasFromEnv is SYNCMESH_REPLICAS (0 when unset or not a number).
func replicasFromEnv() int {
	n, _ := strconv.Atoi(os.Getenv("SYNCMESH_REPLICAS"))
	return n
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
