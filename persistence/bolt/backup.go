package bolt

import (
	"context"
	"fmt"
	"io"
)

// WriteBackup writes a consistent copy of the whole file while the DB
// stays open: one read transaction (bbolt's Tx.WriteTo), so writers go on
// and the copy is the state of one commit. start is called inside the
// transaction with the copy's exact size and returns where to write it
// (an HTTP handler sets Content-Length from it, so a reader can tell a
// cut-off copy from a whole one). The copy opens as a store of the same
// layout, sealed under the same storage key.
//
// The transaction pins the pages it reads: a long copy delays the reuse
// of pages freed meanwhile, and a commit that must grow the file's memory
// map waits for it to end.
func (d *DB) WriteBackup(ctx context.Context, start func(size int64) (io.Writer, error)) (int64, error) {
	if err := d.begin(ctx, "backup"); err != nil {
		return 0, err
	}
	var n int64
	err := d.view(func(tx *wtx) error {
		w, err := start(tx.Size())
		if err != nil {
			return err
		}
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		if m := mapErr("backup", err); m != err {
			return n, m
		}
		return n, fmt.Errorf("bolt: backup: %w", err)
	}
	return n, nil
}
