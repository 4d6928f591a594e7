package runtime

import (
	"bytes"
	"context"
	"iter"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/persistence"
)

// listPage is how many items a listing reads per read transaction: all
// it holds in memory however long the listing, and how long one read
// transaction of a listing lasts at most.
const listPage = 256

// pageThrough yields the items of successive pages, one read each: fetch
// reads the page after cursor c and returns its items, the cursor after
// them and whether more may follow. It ends after the first error, when
// a page says no more follow, or when the consumer stops.
func pageThrough[T, C any](ctx context.Context, c C, fetch func(ctx context.Context, c C) ([]T, C, bool, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for {
			if err := ctx.Err(); err != nil {
				var zero T
				yield(zero, err)
				return
			}
			items, next, more, err := fetch(ctx, c)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, it := range items {
				if !yield(it, nil) {
					return
				}
			}
			if !more {
				return
			}
			c = next
		}
	}
}

// Rows returns a table's rows in key order, after opts.After when it is
// set. Each row's position is its key: to resume a listing (after a
// restart too), list again with ScanOptions.After set to the last row's
// Key.Encode(). Rows are read a page at a time, each page in its own read
// transaction, so a long listing holds one page in memory and never
// holds a transaction open while the caller works; a row written while
// the listing runs is seen if it lies ahead of the position reached.
//
// The iteration ends after yielding a non-nil error: ErrUnknownTable,
// ctx.Err() or a storage error.
func (n *Node) Rows(ctx context.Context, schema, table string, opts ScanOptions) iter.Seq2[Row, error] {
	return pageThrough(ctx, opts.After, func(ctx context.Context, after []byte) ([]Row, []byte, bool, error) {
		var page []Row
		var next []byte
		more := false
		err := n.store.View(ctx, func(tx persistence.SyncReader) error {
			t, def, err := requireTable(tx, schema, table)
			if err != nil {
				return err
			}
			visited := 0
			return tx.Rows(t, after, func(k []byte, pr persistence.Row) (bool, error) {
				// Tombstoned rows skipped count too: a page's work is
				// bounded whatever the table holds.
				if visited == listPage {
					more = true
					return false, nil
				}
				visited++
				next = bytes.Clone(k)
				if pr.Exists || opts.IncludeDeleted {
					page = append(page, viewRow(def, pr))
				}
				return true, ctx.Err()
			})
		})
		return page, next, more, err
	})
}

// LogEntries returns the retained events with Seq > after, in local log
// order (see Log for what the log holds). Each entry's position is its
// Seq: resume after the last Seq processed. Entries are read a page at a
// time, each page in its own read transaction.
//
// The iteration ends after yielding a non-nil error: ctx.Err(),
// ErrClosed or a storage error.
func (n *Node) LogEntries(ctx context.Context, after uint64) iter.Seq2[LogEntry, error] {
	return pageThrough(ctx, after, func(ctx context.Context, after uint64) ([]LogEntry, uint64, bool, error) {
		if n.isClosed() {
			return nil, after, false, ErrClosed
		}
		var page []LogEntry
		err := n.store.View(ctx, func(tx persistence.SyncReader) error {
			return tx.EventsAfter(after, listPage, func(se persistence.StoredEvent) (bool, error) {
				page = append(page, LogEntry{Seq: se.Seq, ID: se.ID, Raw: se.Raw, Site: se.Site, HLC: se.HLC, Schema: se.Schema, Table: se.Table})
				return true, ctx.Err()
			})
		})
		if len(page) > 0 {
			after = page[len(page)-1].Seq
		}
		return page, after, len(page) == listPage, err
	})
}

// PendingSent returns the sent messages still waiting for their ACK, in
// send order, after the send sequence after (0: from the first), only
// those to *to when to is not nil. Each message's position is its
// Sequence: resume after the last Sequence processed. Messages are read
// a page at a time, each page in its own read transaction; bodies are
// copies the caller owns.
//
// The iteration ends after yielding a non-nil error: ErrNoDevice without
// a delivery plane, ErrClosed, ctx.Err() or a storage error.
func (n *Node) PendingSent(ctx context.Context, after uint64, to *DeviceAddress) iter.Seq2[SentMessage, error] {
	return pageThrough(ctx, after, func(ctx context.Context, after uint64) ([]SentMessage, uint64, bool, error) {
		d, err := n.dev()
		if err != nil {
			return nil, after, false, err
		}
		p, err := d.PendingSentMessages(ctx, after, device.MaxPageSize, to)
		return p.Messages, p.Next, p.More, err
	})
}

// PendingReceived returns the received messages waiting for a commit or
// a discard, in receive sequence order, after the receive sequence after
// (0: from the first), only those from *sender when sender is not nil.
// Each message's position is its Sequence: resume after the last
// Sequence processed. Messages are read a page at a time, each page in
// its own read transaction; plaintexts are copies the caller owns.
//
// The iteration ends after yielding a non-nil error: ErrNoDevice without
// a delivery plane, ErrClosed, ctx.Err() or a storage error.
func (n *Node) PendingReceived(ctx context.Context, after uint64, sender *DeviceAddress) iter.Seq2[ReceivedMessage, error] {
	return pageThrough(ctx, after, func(ctx context.Context, after uint64) ([]ReceivedMessage, uint64, bool, error) {
		d, err := n.dev()
		if err != nil {
			return nil, after, false, err
		}
		p, err := d.PendingReceivedMessages(ctx, after, device.MaxPageSize, sender)
		return p.Messages, p.Next, p.More, err
	})
}

// PendingReceivedReports returns what /admin/pending reports of the
// received messages pending the application's commit — metadata only,
// never a body — in receive order after the receive sequence after.
// Each report's position is its Sequence. Reports are read a page at a
// time (MaxPendingReportPage), each page in its own read transaction.
//
// The iteration ends after yielding a non-nil error: ErrNoDevice without
// a delivery plane, ErrClosed, ctx.Err() or a storage error.
func (n *Node) PendingReceivedReports(ctx context.Context, after uint64) iter.Seq2[PendingReport, error] {
	return pageThrough(ctx, after, func(ctx context.Context, after uint64) ([]PendingReport, uint64, bool, error) {
		p, err := n.PendingReports(ctx, after, MaxPendingReportPage)
		return p.Messages, p.Next, p.More, err
	})
}
