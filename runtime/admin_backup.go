package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// ErrNoBackup is returned by Backup for a node without a store file
// (Config.InMemory).
var ErrNoBackup = errors.New("runtime: node has no store file to back up (Config.InMemory)")

// backupWriteTimeout bounds one write of a backup to the admin client: a
// client that stops reading ends the copy (and its read transaction)
// instead of holding the store open.
const backupWriteTimeout = time.Minute

// Backup writes an online, consistent copy of the node's store file
// (node.db) while the node runs: one read transaction, so the copy is the
// state of one commit and writers go on meanwhile. start is called with
// the copy's exact size before anything is written and returns where to
// write it. The copy is sealed under the node's storage key, which is not
// part of it: back the key (storage.key, or Config.StorageKey) up apart.
// Opening the copy as a node directory is a restore (Config.Restored,
// RestoreStatus).
func (n *Node) Backup(ctx context.Context, start func(size int64) (io.Writer, error)) (int64, error) {
	if n.isClosed() {
		return 0, ErrClosed
	}
	if n.db == nil {
		return 0, ErrNoBackup
	}
	w, err := n.db.WriteBackup(ctx, start)
	if err != nil {
		return w, fmt.Errorf("runtime: backup: %w", err)
	}
	return w, nil
}

// adminBackupRoute serves GET /admin/backup: the Backup copy as
// application/octet-stream with its exact Content-Length, for the admin
// token only (the copy holds every row and the node's keys, sealed).
func (n *Node) adminBackupRoute(mux *http.ServeMux) {
	mux.HandleFunc("/admin/backup", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		if !n.authorized(w, r) {
			return
		}
		started := false
		rc := http.NewResponseController(w)
		written, err := n.Backup(r.Context(), func(size int64) (io.Writer, error) {
			started = true
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			w.Header().Set("Content-Disposition", `attachment; filename="node.db"`)
			w.WriteHeader(http.StatusOK)
			return backupWriter{n: n, w: w, rc: rc}, nil
		})
		switch {
		case err == nil:
			n.log.Info("runtime: admin: backup written", "bytes", written, "remote", r.RemoteAddr)
		case started:
			// The status is sent: the client sees a body shorter than its
			// Content-Length.
			n.log.Warn("runtime: admin: backup cut off", "bytes", written, "remote", r.RemoteAddr, "err", err)
		case errors.Is(err, ErrNoBackup):
			http.Error(w, err.Error(), http.StatusNotImplemented)
		default:
			n.writeJSON(w, nil, err)
		}
	})
}

// backupWriter ends a backup when the node closes or the client stops
// reading for backupWriteTimeout.
type backupWriter struct {
	n  *Node
	w  io.Writer
	rc *http.ResponseController
}

func (b backupWriter) Write(p []byte) (int, error) {
	if b.n.isClosed() {
		return 0, ErrClosed
	}
	_ = b.rc.SetWriteDeadline(time.Now().Add(backupWriteTimeout)) // best effort: not every writer supports it
	return b.w.Write(p)
}
