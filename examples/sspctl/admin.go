package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// ---- status / peers / watermarks (a running node's admin endpoint) ----

// adminFlags builds a command that reads one admin path of a running node
// (runtime.Config.MetricsAddr) and prints it.
func adminFlags(path string, print func(e env, body []byte) error) func(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	return func(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
		addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
		raw := fs.Bool("json", false, "print the endpoint's JSON as is")
		timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
		return func(e env, fs *flag.FlagSet) error {
			if err := require(fs, "addr"); err != nil {
				return err
			}
			body, err := adminGet(e.ctx, *addr, path, *timeout)
			if err != nil {
				return err
			}
			if *raw {
				_, err := e.stdout.Write(body)
				return err
			}
			return print(e, body)
		}
	}
}

func adminGet(ctx context.Context, addr, path string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+path, nil)
	if err != nil {
		return nil, inputErr("--addr: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

func printStatus(e env, body []byte) error {
	var st runtime.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "name=%s site=%s kid=%s mesh=%s\nclock=%s last_seq=%d tables=%d trusted_keys=%d peers=%d backlog_events=%d\n",
		st.Name, st.Site, st.Kid, st.MeshID, st.Clock, st.LastSeq, st.Tables, st.Trusted, st.Peers, st.BacklogEvents)
	if st.Remote != "" {
		fmt.Fprintf(e.stdout, "remote=%s\n", st.Remote)
	}
	if st.Messages != nil {
		fmt.Fprintf(e.stdout, "device=%s pending_inbound=%d pending_outbound=%d\n", st.Device, st.Messages.PendingInbound, st.Messages.PendingOutbound)
	}
	fmt.Fprintf(e.stdout, "held_groups=%d restore_suspected=%t writes_held=%t log_rotated=%t\n",
		st.HeldGroups, st.Restore.Suspected, st.Restore.Held, st.Restore.LogRotated)
	if st.Restore.Reason != "" {
		fmt.Fprintf(e.stdout, "restore_reason=%q\n", st.Restore.Reason)
	}
	return nil
}

func printHeld(e env, body []byte) error {
	var hs []runtime.HeldReport
	if err := json.Unmarshal(body, &hs); err != nil {
		return err
	}
	if len(hs) == 0 {
		fmt.Fprintln(e.stdout, "nothing held")
	}
	for _, h := range hs {
		fmt.Fprintf(e.stdout, "site=%s missing_table=%s events=%d oldest=%s age=%.0fs\n", h.Site, h.MissingTable, h.Events, h.OldestHLC, h.AgeSeconds)
	}
	return nil
}

func printPeers(e env, body []byte) error {
	var ps []runtime.PeerReport
	if err := json.Unmarshal(body, &ps); err != nil {
		return err
	}
	for _, p := range ps {
		lag := fmt.Sprintf("%d ms", p.LagMS)
		if p.GroupsWithoutWatermark > 0 {
			lag += fmt.Sprintf(" (no watermark yet for %d groups)", p.GroupsWithoutWatermark)
		}
		errs := ""
		if p.LastError != "" {
			errs = " last_error=" + p.LastError
		}
		if l := p.LastReconcile; l != nil {
			errs += fmt.Sprintf(" last_reconcile=%s result=%s fetched=%d", l.At.Format(time.RFC3339), l.Result, l.EventsFetched)
			if l.Error != "" {
				errs += " reconcile_error=" + l.Error
			}
		}
		fmt.Fprintf(e.stdout, "peer=%s path=%s behind=%d events (backlog %d, re-offers %d) lag=%s cursor=%d tail=%d%s\n",
			p.Peer, p.Path, p.LagEvents, p.BacklogEvents, p.RetryEvents, lag, p.Cursor, p.Tail, errs)
	}
	return nil
}

func printWatermarks(e env, body []byte) error {
	var ws []runtime.WatermarkReport
	if err := json.Unmarshal(body, &ws); err != nil {
		return err
	}
	for _, w := range ws {
		fmt.Fprintf(e.stdout, "site=%s table=%s.%s hlc=%s\n", w.Site, w.Schema, w.Table, w.HLC)
	}
	return nil
}
