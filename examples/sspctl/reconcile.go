package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// ---- reconcile (a running node's admin endpoint, state-changing) ----

// tokenEnv names the environment variable that may hold the admin token
// (so it is not on the command line, visible to every local user).
const tokenEnv = "SYNCMESH_ADMIN_TOKEN"

func reconcileFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	peer := fs.String("peer", "", "the peer to reconcile with, as the node added it (required)")
	tokenFile := fs.String("token-file", "", "file holding the node's admin token (Config.AdminToken); default: $"+tokenEnv)
	raw := fs.Bool("json", false, "print the endpoint's JSON as is")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr", "peer"); err != nil {
			return err
		}
		token := os.Getenv(tokenEnv)
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return inputErr("--token-file: %v", err)
			}
			token = strings.TrimSpace(string(b))
		}
		if token == "" {
			return inputErr("an admin token is required: --token-file or $%s", tokenEnv)
		}
		body, err := adminPost(e.ctx, *addr, "/admin/reconcile?peer="+url.QueryEscape(*peer), token, *timeout)
		if err != nil {
			return err
		}
		if *raw {
			_, err := e.stdout.Write(body)
			return err
		}
		var s runtime.ReconcileSummary
		if err := json.Unmarshal(body, &s); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "peer=%s result=%s round_trips=%d events_missing=%d events_fetched=%d peer_lacks=%d bytes_sent=%d bytes_received=%d took_ms=%.1f\n",
			s.Peer, s.Result, s.RoundTrips, s.EventsMissing, s.EventsFetched, s.PeerLacks, s.BytesSent, s.BytesReceived, s.TookMS)
		if s.Truncated {
			fmt.Fprintln(e.stdout, "truncated: more differences remain; run it again")
		}
		return nil
	}
}

// adminPost runs a state-changing admin action (POST with the bearer
// token).
func adminPost(ctx context.Context, addr, path, token string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(addr, "/")+path, nil)
	if err != nil {
		return nil, inputErr("--addr: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", strings.SplitN(path, "?", 2)[0], resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}
