package runtime

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// TestAdminBackupIsAConsistentStoreCopy: GET /admin/backup with the admin
// token streams a copy of a running node's node.db, its length announced
// in Content-Length; the copy opens with persistence/bolt under the
// node's storage key and holds the rows written before it, and none
// written after. Without the token it answers 401, with none configured
// 403, for an in-memory node 501.
func TestAdminBackupIsAConsistentStoreCopy(t *testing.T) {
	ctx := context.Background()
	const token = "0123456789abcdef-admin"
	dir := t.TempDir()
	n, err := Open(ctx, Config{Dir: dir, MeshID: []byte("m"), Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	def := TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	if err := n.DefineTable(ctx, def); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"v": "before-" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + n.MetricsAddr() + "/admin/backup"
	if code, _ := adminDo(t, http.MethodGet, url, ""); code != http.StatusUnauthorized {
		t.Fatalf("backup without a token: %d, want 401", code)
	}
	if code, _ := adminDo(t, http.MethodGet, url, "wrong-token-wrong"); code != http.StatusUnauthorized {
		t.Fatalf("backup with a wrong token: %d, want 401", code)
	}
	if code, _ := adminDo(t, http.MethodPost, url, token); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST backup: %d, want 405", code)
	}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "node.db")
	f, err := os.Create(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	written, err := f.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || written != resp.ContentLength || written == 0 {
		t.Fatalf("backup: status %d, %d bytes of %d announced, %v", resp.StatusCode, written, resp.ContentLength, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Written after the copy: not in it.
	if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 9}, map[string]any{"v": "after"}); err != nil {
		t.Fatal(err)
	}
	wantSeq, err := n.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}

	key, err := sealed.LoadOrCreateKeyFile(filepath.Join(dir, "storage.key"))
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := sealed.New(key)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(copyPath, bolt.Options{Sealer: sealer, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open the copy: %v", err)
	}
	defer db.Close()
	if err := db.Sync().View(ctx, func(tx persistence.SyncReader) error {
		seq, err := tx.LastSeq()
		if err != nil {
			return err
		}
		if seq != wantSeq-1 {
			t.Errorf("copy's last seq %d, want %d (the node's before the last write)", seq, wantSeq-1)
		}
		tk := persistence.TableKey{Schema: "app", Table: "t"}
		for id, want := range map[int]string{1: "before-1", 2: "before-2"} {
			k, err := encodeKey(map[string]any{"id": id})
			if err != nil {
				return err
			}
			pr, ok, err := tx.Row(tk, k.Encode())
			if err != nil {
				return err
			}
			var got string
			if !ok || !pr.Exists {
				t.Errorf("row %d missing from the copy", id)
			} else if st, err := viewRow(def, pr).Value("v", &got); err != nil || st != Written || got != want {
				t.Errorf("row %d in the copy: %v %q %v, want %q", id, st, got, err, want)
			}
		}
		k, _ := encodeKey(map[string]any{"id": 9})
		if _, ok, err := tx.Row(tk, k.Encode()); err != nil || ok {
			t.Errorf("row written after the copy is in it: %v %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	mem, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), Name: "mem", SyncInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if code, _ := adminDo(t, http.MethodGet, "http://"+mem.MetricsAddr()+"/admin/backup", token); code != http.StatusNotImplemented {
		t.Fatalf("backup of an in-memory node: %d, want 501", code)
	}
	open, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), Name: "open", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if code, _ := adminDo(t, http.MethodGet, "http://"+open.MetricsAddr()+"/admin/backup", token); code != http.StatusForbidden {
		t.Fatalf("backup without Config.AdminToken: %d, want 403", code)
	}
}
