package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// ---- pending / inbound (a running node's admin endpoint) ----

func pendingFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	after := fs.Uint64("after", 0, "list the messages received after this sequence (the previous page's next cursor)")
	limit := fs.Int("limit", runtime.MaxPendingReportPage, fmt.Sprintf("at most this many messages (1..%d)", runtime.MaxPendingReportPage))
	raw := fs.Bool("json", false, "print the endpoint's JSON as is")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr"); err != nil {
			return err
		}
		if *limit < 1 || *limit > runtime.MaxPendingReportPage {
			return inputErr("--limit %d: out of range (1..%d)", *limit, runtime.MaxPendingReportPage)
		}
		body, err := adminGet(e.ctx, *addr, fmt.Sprintf("/admin/pending?after=%d&limit=%d", *after, *limit), *timeout)
		if err != nil {
			return err
		}
		if *raw {
			_, err := e.stdout.Write(body)
			return err
		}
		var p runtime.PendingReportPage
		if err := json.Unmarshal(body, &p); err != nil {
			return err
		}
		for _, m := range p.Messages {
			fmt.Fprintf(e.stdout, "seq=%d sender=%s id=%s age=%.0fs deliveries=%d received=%s\n",
				m.Sequence, m.Sender, m.ID, m.AgeSeconds, m.Deliveries, m.ReceivedAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(e.stdout, "pending=%d shown=%d", p.Total, len(p.Messages))
		if p.More {
			fmt.Fprintf(e.stdout, " more: sspctl pending --addr %s --after %d", *addr, p.Next)
		}
		fmt.Fprintln(e.stdout)
		return nil
	}
}

// inboundFlags reads what a running node applied from each sender: the
// senders' push progress (/admin/inbound) and the applied watermark of
// every group (/admin/watermarks, SSP/1 §14.2).
func inboundFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	raw := fs.Bool("json", false, "print the endpoints' JSON as is (inbound, then watermarks)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr"); err != nil {
			return err
		}
		in, err := adminGet(e.ctx, *addr, "/admin/inbound", *timeout)
		if err != nil {
			return err
		}
		wm, err := adminGet(e.ctx, *addr, "/admin/watermarks", *timeout)
		if err != nil {
			return err
		}
		if *raw {
			_, err := fmt.Fprintf(e.stdout, "%s%s", in, wm)
			return err
		}
		var senders []runtime.InboundReport
		if err := json.Unmarshal(in, &senders); err != nil {
			return err
		}
		var groups []runtime.WatermarkReport
		if err := json.Unmarshal(wm, &groups); err != nil {
			return err
		}
		if len(senders) == 0 {
			fmt.Fprintln(e.stdout, "no sender pushed to this node since it opened")
		}
		for _, s := range senders {
			at := ""
			if !s.At.IsZero() {
				at = " at=" + s.At.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(e.stdout, "from=%s through=%d tail=%d applied=%d gaps=%d%s\n", s.From, s.Through, s.Tail, s.Applied, s.Gaps, at)
		}
		for _, g := range groups {
			fmt.Fprintf(e.stdout, "group site=%s table=%s.%s applied_through=%s\n", g.Site, g.Schema, g.Table, g.HLC)
		}
		return nil
	}
}

// ---- backup (a running node's admin endpoint, token required) ----

func backupFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	tokenFile := fs.String("token-file", "", "file holding the node's admin token (Config.AdminToken); default: $"+tokenEnv)
	timeout := fs.Duration("timeout", time.Hour, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr"); err != nil {
			return err
		}
		if fs.NArg() != 1 || fs.Arg(0) == "" {
			return inputErr("one FILE argument is required: where to write the copy")
		}
		out := fs.Arg(0)
		if _, err := os.Lstat(out); err == nil {
			return inputErr("%s exists: not replaced", out)
		}
		token, err := adminToken(*tokenFile)
		if err != nil {
			return err
		}
		n, err := adminBackup(e.ctx, *addr, token, out, *timeout)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "backup=%s bytes=%d\n", out, n)
		return nil
	}
}

// adminToken reads the admin token from file, else from $SYNCMESH_ADMIN_TOKEN.
func adminToken(file string) (string, error) {
	token := os.Getenv(tokenEnv)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", inputErr("--token-file: %v", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return "", inputErr("an admin token is required: --token-file or $%s", tokenEnv)
	}
	return token, nil
}

// adminBackup streams /admin/backup into a temporary file beside out,
// checks it is as long as announced (a cut-off copy is no backup), syncs
// it and renames it to out: out appears whole or not at all.
func adminBackup(ctx context.Context, addr, token, out string, timeout time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+"/admin/backup", nil)
	if err != nil {
		return 0, inputErr("--addr: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return 0, fmt.Errorf("/admin/backup: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if resp.ContentLength < 0 {
		return 0, errors.New("/admin/backup: no Content-Length: cannot tell a whole copy from a cut-off one")
	}
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-*")
	if err != nil {
		return 0, err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, resp.Body)
	if err != nil {
		return n, fmt.Errorf("/admin/backup: cut off after %d of %d bytes: %w", n, resp.ContentLength, err)
	}
	if n != resp.ContentLength {
		return n, fmt.Errorf("/admin/backup: %d of %d bytes", n, resp.ContentLength)
	}
	if err := f.Sync(); err != nil {
		return n, err
	}
	if err := f.Close(); err != nil {
		return n, err
	}
	done = true
	if err := os.Rename(tmp, out); err != nil {
		_ = os.Remove(tmp)
		return n, err
	}
	return n, nil
}

// ---- rotate-storage-key (a stopped node's directory) ----

// rotateKeyFlags rotates a key-file node's storage key offline: the
// runtime re-seals every record in one resumable pass that needs the file
// to itself (runtime.RotateStorageKey), so there is no admin-endpoint
// form for a running node.
func rotateKeyFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "the stopped node's directory (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		if !nodeExists(*dir) {
			return fmt.Errorf("%w: %s", errNoNode, *dir)
		}
		err := runtime.RotateStorageKey(e.ctx, *dir)
		if errors.Is(err, runtime.ErrLocked) {
			return fmt.Errorf("%s is open in another process: stop the node first (the rotation needs the store to itself): %w", filepath.Join(*dir, "node.db"), err)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "storage key of %s rotated: every sealed record re-sealed under the new storage.key\n", *dir)
		return nil
	}
}
