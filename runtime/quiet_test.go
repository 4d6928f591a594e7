package runtime

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// levelRecorder keeps every record at or above min.
type levelRecorder struct {
	min  slog.Level
	mu   sync.Mutex
	recs []slog.Record
}

func (r *levelRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.min }
func (r *levelRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	return nil
}
func (r *levelRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *levelRecorder) WithGroup(string) slog.Handler      { return r }

func (r *levelRecorder) levels() map[string]slog.Level {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]slog.Level{}
	for _, rec := range r.recs {
		out[rec.Message] = rec.Level
	}
	return out
}

// A peer's normal shutdown, as protoactor logs it through the node's actor
// system, reaches an INFO logger as nothing; a lost connection for another
// reason is a WARN; the node's own errors stay errors.
func TestPeerShutdownIsNotAnError(t *testing.T) {
	rec := &levelRecorder{min: slog.LevelInfo}
	n := openTestNode(t, Config{Logger: slog.New(rec)})
	pl := n.System().Logger()
	pl.Error(lostConnection, slog.String("address", "127.0.0.1:1"), slog.Any("error", status.Error(codes.Unavailable, "error reading from server: EOF")))
	pl.Error(lostConnection, slog.String("address", "127.0.0.1:2"), slog.Any("error", status.Error(codes.Canceled, "context canceled")))
	pl.Error("EndpointReader failed to send disconnection message", slog.Any("error", io.EOF))
	pl.Info("EndpointWriter connected", slog.String("address", "127.0.0.1:1"))
	if got := rec.levels(); len(got) != 0 {
		t.Fatalf("normal shutdown logged at INFO or above: %v", got)
	}
	pl.Error(lostConnection, slog.Any("error", status.Error(codes.PermissionDenied, "x509: certificate signed by unknown authority")))
	pl.Error("EndpointWriter failed to serialize message", slog.Any("error", errors.New("boom")))
	got := rec.levels()
	if got[lostConnection] != slog.LevelWarn || got["EndpointWriter failed to serialize message"] != slog.LevelError {
		t.Fatalf("levels: %v", got)
	}
	// With DEBUG on, the shutdown lines are still there, at DEBUG.
	dbg := &levelRecorder{min: slog.LevelDebug}
	ProtoactorLogger(slog.New(dbg)).Error(lostConnection, slog.Any("error", status.Error(codes.Unavailable, "EOF")))
	if l, ok := dbg.levels()[lostConnection]; !ok || l != slog.LevelDebug {
		t.Fatalf("debug: %v", dbg.levels())
	}
}

// A new database logs no INFO line; upgrading an older layout logs one,
// however many steps it takes, the steps at DEBUG.
func TestMigrationsQuietAtInfo(t *testing.T) {
	rec := &levelRecorder{min: slog.LevelInfo}
	dir := t.TempDir()
	n, err := Open(context.Background(), Config{Dir: dir, MeshID: testMesh, NoSync: true, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rec.recs {
		if r.Level >= slog.LevelInfo {
			t.Fatalf("a new node logged %v %q", r.Level, r.Message)
		}
	}
	dbg := &levelRecorder{min: slog.LevelDebug}
	db, err := bolt.Open(filepath.Join(t.TempDir(), "x.db"), bolt.Options{NoSync: true, Logger: slog.New(dbg)})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	steps := 0
	for _, r := range dbg.recs {
		if r.Message == "bolt: migrated layout" {
			steps++
			if r.Level != slog.LevelDebug {
				t.Fatalf("migration step at %v", r.Level)
			}
		}
	}
	// One DEBUG line per step; a version number may be skipped (layout
	// versions are assigned per piece of work), so at most LayoutVersion.
	if steps == 0 || steps > int(bolt.LayoutVersion) {
		t.Fatalf("%d migration steps logged at DEBUG, want 1..%d", steps, bolt.LayoutVersion)
	}
}

// Upgrading the frozen layout-1 fixture logs exactly one INFO line.
func TestMigrationUpgradeLogsOneInfoLine(t *testing.T) {
	b, err := os.ReadFile("../persistence/bolt/testdata/layout_v1.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "v1.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := &levelRecorder{min: slog.LevelInfo}
	db, err := bolt.Open(path, bolt.Options{NoSync: true, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if len(rec.recs) != 1 || rec.recs[0].Message != "bolt: upgraded layout" {
		t.Fatalf("want one INFO line, got %d: %v", len(rec.recs), rec.levels())
	}
}
