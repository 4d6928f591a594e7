package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
	"github.com/syncmesh/syncmesh/runtime"
)

// pending lists, from a running node's admin endpoint, the received
// messages its application has not committed, a page at a time with the
// cursor of the next page; help lists the command.
func TestPendingCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	net := runtime.NewNetwork(1)
	aAddr, bAddr := runtime.DeviceAddress{User: "alice", Device: 1}, runtime.DeviceAddress{User: "bob", Device: 1}
	open := func(name string, addr runtime.DeviceAddress, metrics string) *runtime.Node {
		n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: name, SyncInterval: -1, MetricsAddr: metrics,
			Device: &runtime.DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Buffer: 8}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		net.RegisterDevice(name, n)
		return n
	}
	a, b := open("alice", aAddr, ""), open("bob", bAddr, "127.0.0.1:0")
	for range 3 {
		if _, err := a.Send(ctx, bAddr, []byte("hello")); err != nil {
			t.Fatal(err)
		}
	}
	// Receives are asynchronous: a generous deadline on a shared machine.
	for i := 0; ; i++ {
		if n, err := b.PendingReceivedMessageCount(ctx, nil); err == nil && n == 3 {
			break
		}
		if i == 600 {
			t.Fatal("3 pending messages not reached in 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	addr := b.MetricsAddr()
	out := mustRun(t, "", "pending", "--addr", addr, "--limit", "2")
	lines := regexp.MustCompile(`(?m)^seq=(\d+) sender=alice\.1 id=[0-9a-f]{32} age=\d+s deliveries=[1-9]`).FindAllStringSubmatch(out, -1)
	if len(lines) != 2 || !strings.Contains(out, "pending=3 shown=2 more: sspctl pending --addr "+addr+" --after "+lines[1][1]) {
		t.Fatalf("pending --limit 2: %q", out)
	}
	rest := mustRun(t, "", "pending", "--addr", addr, "--after", lines[1][1])
	if strings.Count(rest, "sender=alice.1") != 1 || !strings.Contains(rest, "pending=3 shown=1\n") {
		t.Fatalf("pending --after %s: %q", lines[1][1], rest)
	}
	if out := mustRun(t, "", "pending", "--addr", addr, "--json"); !strings.Contains(out, `"total": 3`) {
		t.Fatalf("pending --json: %q", out)
	}
	if r := inProcess(t, "", "pending", "--addr", addr, "--limit", "101"); r.code != exitUsage {
		t.Fatalf("pending --limit 101: %+v", r)
	}
	// A node without a delivery plane has nothing pending: 404.
	if r := inProcess(t, "", "pending", "--addr", mustMetricsNode(t)); r.code != exitError || !strings.Contains(r.err, "404") {
		t.Fatalf("pending without a delivery plane: %+v", r)
	}
	if out := mustRun(t, "", "--help"); !strings.Contains(out, "\n  pending ") {
		t.Fatalf("--help does not list pending: %q", out)
	}
}

// mustMetricsNode opens an in-memory node serving its admin endpoint and
// returns the endpoint's address.
func mustMetricsNode(t *testing.T) string {
	t.Helper()
	n, err := runtime.Open(context.Background(), runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "plain", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n.MetricsAddr()
}

// inbound shows, from a running node's admin endpoint, how far each
// sender's pushes reached and applied there, and every group's applied
// watermark.
func TestInboundCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	a, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "c", SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addr := a.MetricsAddr()
	if out := mustRun(t, "", "inbound", "--addr", addr); !strings.Contains(out, "no sender pushed") {
		t.Fatalf("inbound before any push: %q", out)
	}
	def := runtime.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	for _, n := range []*runtime.Node{a, c} {
		if err := n.DefineTable(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := c.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	id := c.Identity()
	if err := a.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		t.Fatal(err)
	}
	if err := a.AcceptPeer("c", runtime.PeerSite(id.Site)); err != nil {
		t.Fatal(err)
	}
	net := runtime.NewNetwork(1)
	net.Register("a", a)
	if err := c.AddPeer("a", net.Transport("c"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SyncNow(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	ws, err := c.Watermarks(ctx)
	if err != nil || len(ws) != 1 {
		t.Fatalf("c's watermarks %v %v", ws, err)
	}
	out := mustRun(t, "", "inbound", "--addr", addr)
	if !strings.Contains(out, "from=c through=5 tail=5 applied=5 gaps=0") {
		t.Fatalf("inbound: %q", out)
	}
	if !strings.Contains(out, "group site="+id.Site.String()+" table=app.t applied_through="+ws[0].HLC.String()) {
		t.Fatalf("inbound: no applied watermark %s for c's group: %q", ws[0].HLC, out)
	}
	if out := mustRun(t, "", "inbound", "--addr", addr, "--json"); !strings.Contains(out, `"applied": 5`) || !strings.Contains(out, `"table": "t"`) {
		t.Fatalf("inbound --json: %q", out)
	}
	if out := mustRun(t, "", "--help"); !strings.Contains(out, "\n  inbound ") {
		t.Fatalf("--help does not list inbound: %q", out)
	}
}

// backup copies a running node's store through its admin endpoint (token
// required); the copy opens with persistence/bolt under the node's
// storage key, and as a node directory beside that key it holds the rows
// written before the backup.
func TestBackupCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	const token = "0123456789abcdef-admin"
	dir := t.TempDir()
	a, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: []byte("m"), Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	def := runtime.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	if err := a.DefineTable(ctx, def); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"v": "row-" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	wantSeq, err := a.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addr := a.MetricsAddr()
	out := filepath.Join(t.TempDir(), "copy.db")
	t.Setenv(tokenEnv, "")
	if r := inProcess(t, "", "backup", "--addr", addr, out); r.code != exitUsage || !strings.Contains(r.err, "an admin token is required") {
		t.Fatalf("backup without a token: %+v", r)
	}
	t.Setenv(tokenEnv, "wrong-token-wrong")
	if r := inProcess(t, "", "backup", "--addr", addr, out); r.code != exitError || !strings.Contains(r.err, "401") {
		t.Fatalf("backup with a wrong token: %+v", r)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused backup left %s: %v", out, err)
	}
	t.Setenv(tokenEnv, token)
	if r := inProcess(t, "", "backup", "--addr", addr); r.code != exitUsage {
		t.Fatalf("backup without FILE: %+v", r)
	}
	res := mustRun(t, "", "backup", "--addr", addr, out)
	if !strings.Contains(res, "backup="+out+" bytes=") {
		t.Fatalf("backup: %q", res)
	}
	if r := inProcess(t, "", "backup", "--addr", addr, out); r.code != exitUsage || !strings.Contains(r.err, "exists") {
		t.Fatalf("backup over an existing file: %+v", r)
	}
	if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 99}, map[string]any{"v": "after"}); err != nil {
		t.Fatal(err)
	}

	// The copy is a valid store under the node's storage key.
	key, err := sealed.LoadOrCreateKeyFile(filepath.Join(dir, "storage.key"))
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(out, bolt.Options{Sealer: sealer, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open the copy with persistence/bolt: %v", err)
	}
	var rows int
	var seq uint64
	err = db.Sync().View(ctx, func(tx persistence.SyncReader) error {
		if seq, err = tx.LastSeq(); err != nil {
			return err
		}
		return tx.Rows(persistence.TableKey{Schema: "app", Table: "t"}, nil, func([]byte, persistence.Row) (bool, error) {
			rows++
			return true, nil
		})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil || seq != wantSeq || rows != 4 {
		t.Fatalf("copy: last seq %d (want %d), %d rows (want 4), %v", seq, wantSeq, rows, err)
	}

	// Restored as a node directory (the copy and the key): the rows.
	restored := t.TempDir()
	copyFile(t, out, filepath.Join(restored, "node.db"))
	copyFile(t, filepath.Join(dir, "storage.key"), filepath.Join(restored, "storage.key"))
	r, err := runtime.Open(ctx, runtime.Config{Dir: restored, MeshID: []byte("m"), Name: "a", SyncInterval: -1})
	if err != nil {
		t.Fatalf("open the restored directory: %v", err)
	}
	defer r.Close()
	row, ok, err := r.Get(ctx, "app", "t", map[string]any{"id": 3})
	var v string
	if err != nil || !ok {
		t.Fatalf("row 3 in the restored node: %v %v", ok, err)
	}
	if _, err := row.Value("v", &v); err != nil || v != "row-3" {
		t.Fatalf("row 3 in the restored node: %q %v", v, err)
	}
	if _, ok, err := r.Get(ctx, "app", "t", map[string]any{"id": 99}); err != nil || ok {
		t.Fatalf("a row written after the backup is in it: %v %v", ok, err)
	}
	if out := mustRun(t, "", "--help"); !strings.Contains(out, "\n  backup ") {
		t.Fatalf("--help does not list backup: %q", out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// rotate-storage-key replaces a stopped node's storage key; the node opens
// under the new key with its rows. A running node's directory is refused
// (its lock is held) and keeps its key.
func TestRotateStorageKeyCommand(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: []byte("m"), Name: "a", SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	def := runtime.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	if err := a.DefineTable(ctx, def); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"v": "sealed"}); err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dir, "storage.key")
	before, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if r := inProcess(t, "", "rotate-storage-key", "--dir", dir); r.code != exitError || !strings.Contains(r.err, "stop the node first") {
		t.Fatalf("rotate-storage-key on a running node: %+v", r)
	}
	if now, _ := os.ReadFile(keyPath); !bytes.Equal(now, before) {
		t.Fatal("a refused rotation changed storage.key")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, "", "rotate-storage-key", "--dir", dir); !strings.Contains(out, "rotated") {
		t.Fatalf("rotate-storage-key: %q", out)
	}
	after, err := os.ReadFile(keyPath)
	if err != nil || bytes.Equal(after, before) {
		t.Fatalf("storage.key not replaced: %v", err)
	}
	b, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: []byte("m"), Name: "a", SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	row, ok, err := b.Get(ctx, "app", "t", map[string]any{"id": 1})
	var v string
	if err != nil || !ok {
		t.Fatalf("row after the rotation: %v %v", ok, err)
	}
	if _, err := row.Value("v", &v); err != nil || v != "sealed" {
		t.Fatalf("row after the rotation: %q %v", v, err)
	}
	if r := inProcess(t, "", "rotate-storage-key", "--dir", t.TempDir()); r.code == exitOK {
		t.Fatalf("rotate-storage-key on an empty directory: %+v", r)
	}
	if out := mustRun(t, "", "--help"); !strings.Contains(out, "rotate-storage-key") {
		t.Fatalf("--help does not list rotate-storage-key: %q", out)
	}
}

// A backup cut off on the way (fewer bytes than the endpoint announced) is
// an error and leaves neither FILE nor a partial file behind.
func TestBackupCutOffLeavesNoFile(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/admin/backup" || r.Header.Get("Authorization") != "Bearer 0123456789abcdef-admin" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", "4096")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(make([]byte, 100)) // then the handler ends: the connection closes short
	}))
	defer srv.Close()
	t.Setenv(tokenEnv, "0123456789abcdef-admin")
	dir := t.TempDir()
	out := filepath.Join(dir, "copy.db")
	r := inProcess(t, "", "backup", "--addr", srv.URL, out)
	if r.code != exitError || !strings.Contains(r.err, "cut off after 100 of 4096 bytes") {
		t.Fatalf("cut-off backup: %+v", r)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Fatalf("a cut-off backup left files: %v %v", left, err)
	}
}
