package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A second Open of a directory whose node is open fails with ErrLocked
// once Config.LockTimeout passes: the runtime learns of bbolt's lock
// timeout only through persistence.ErrLocked.
func TestOpenOfALockedNodeIsErrLocked(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n, err := Open(ctx, Config{Dir: dir, MeshID: []byte("m"), NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_, err = Open(ctx, Config{Dir: dir, MeshID: []byte("m"), NoSync: true, SyncInterval: -1, ReconcileInterval: -1, LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
}
