package bolt

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/persistence"
)

// TestWriteBackupIsAnOpenableSnapshot: WriteBackup of an open DB announces
// the exact size, writes a file that opens as a store with what was
// committed before it; an error from start writes nothing; after Close it
// is ErrClosed.
func TestWriteBackupIsAnOpenableSnapshot(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d := mustOpen(t, filepath.Join(dir, "node.db"), Options{NoSync: true})
	put := func(v string) {
		if err := d.Sync().Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta("k", []byte(v)) }); err != nil {
			t.Fatal(err)
		}
	}
	put("before")
	var buf bytes.Buffer
	var announced int64
	n, err := d.WriteBackup(ctx, func(size int64) (io.Writer, error) { announced = size; return &buf, nil })
	if err != nil || n != announced || int64(buf.Len()) != n || n == 0 {
		t.Fatalf("backup: %d bytes written, %d announced, %d buffered, %v", n, announced, buf.Len(), err)
	}
	put("after")
	copyPath := filepath.Join(dir, "copy.db")
	if err := os.WriteFile(copyPath, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := mustOpen(t, copyPath, Options{NoSync: true})
	defer c.Close()
	if err := c.Sync().View(ctx, func(tx persistence.SyncReader) error {
		v, ok, err := tx.Meta("k")
		if err != nil || !ok || string(v) != "before" {
			t.Errorf("copy's meta k = %q %v %v, want before", v, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("no room")
	if n, err := d.WriteBackup(ctx, func(int64) (io.Writer, error) { return nil, refused }); !errors.Is(err, refused) || n != 0 {
		t.Fatalf("start's error: %d %v", n, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteBackup(ctx, func(int64) (io.Writer, error) { return io.Discard, nil }); !errors.Is(err, persistence.ErrClosed) {
		t.Fatalf("backup after Close: %v, want ErrClosed", err)
	}
}
