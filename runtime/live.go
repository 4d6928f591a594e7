package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"sort"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// ErrInvalidLiveQuery: a live query whose Query names no table.
var ErrInvalidLiveQuery = errors.New("runtime: invalid live query")

// LiveKind says what a LiveEvent tells.
type LiveKind uint8

// Live event kinds.
const (
	// LiveEnter: the row entered the answer (on a first refresh, every
	// row of the answer enters).
	LiveEnter LiveKind = iota + 1
	// LiveUpdate: the row was in the answer and still is, and changed.
	LiveUpdate
	// LiveLeave: the row left the answer: deleted, no longer matching, or
	// pushed past the limit.
	LiveLeave
	// LiveSettled: the events delivered so far make up the answer as of
	// change Seq. It ends every refresh.
	LiveSettled
)

// String names the kind.
func (k LiveKind) String() string {
	switch k {
	case LiveEnter:
		return "enter"
	case LiveUpdate:
		return "update"
	case LiveLeave:
		return "leave"
	case LiveSettled:
		return "settled"
	}
	return fmt.Sprintf("LiveKind(%d)", uint8(k))
}

// LiveEvent is one event of a live query.
type LiveEvent struct {
	Kind LiveKind
	// Seq is the change sequence (see Change.Seq) the refresh that
	// produced the event read up to: every event of one refresh carries
	// the same Seq. After a LiveSettled, LivePosition{After: Seq, Held:
	// the rows held} resumes the query.
	Seq uint64
	// Row is, for LiveEnter and LiveUpdate, the row as it is in the
	// answer now (with its Row.Cursor); for LiveLeave, the row that left:
	// its Schema, Table and Key only (it may be deleted, no longer
	// match, or be past the limit). Zero for LiveSettled.
	Row Row
}

// LivePosition is where a live query resumes: the Seq of the last
// LiveSettled handled and the rows the consumer holds as the answer
// (those delivered by LiveEnter and LiveUpdate, minus those LiveLeave
// removed). The zero LivePosition starts from nothing: the first refresh
// delivers the whole answer as LiveEnter.
type LivePosition struct {
	After uint64
	Held  []Row
}

// Live keeps q's answer live: it yields the rows that enter, change in
// and leave the answer of Query(q), each refresh ended by a LiveSettled,
// until ctx ends, the node closes or the consumer stops.
//
// A refresh runs the query and compares its answer with the answer
// delivered before, so after every LiveSettled the rows held by a
// consumer that applied the events are exactly the query's answer as of
// that refresh. The first refresh runs at once; the next ones whenever a
// change of the table (see Change) committed after the last one. Changes
// that land together, or while the consumer was busy, are delivered as
// one refresh: a live query reports answers, not every intermediate
// write, so a slow consumer costs one query per refresh it reads, never a
// buffer.
//
// Memory is bounded by the query's limit (at most MaxQueryLimit rows): a
// key and a 32-byte digest per row of the answer, plus one refresh's
// events. A refresh costs what Query(q) costs.
//
// Resuming after a restart, with the position of the last LiveSettled
// and the rows held, continues without loss: the first refresh compares
// the answer with what is held, so a change committed while the consumer
// was away is delivered once, whatever the change log retained meanwhile
// (a trimmed log, a restored store); unlike Watch, a live query never
// needs a re-read.
//
// A table not defined yet has an empty answer (events held for it
// materialize when it is defined, and those are changes). The iteration
// ends after yielding a non-nil error: ErrInvalidLiveQuery, what Query
// yields for a bad query (ErrUnknownIndex, ErrBadQuery, *TypeError) or
// an index whose build was interrupted (ErrIndexBuilding),
// ctx.Err(), ErrClosed or a storage error.
func (n *Node) Live(ctx context.Context, q Query, from LivePosition) iter.Seq2[LiveEvent, error] {
	if q.Schema == "" || q.Table == "" {
		return func(yield func(LiveEvent, error) bool) {
			yield(LiveEvent{}, fmt.Errorf("%w: table %q.%q", ErrInvalidLiveQuery, q.Schema, q.Table))
		}
	}
	t := persistence.TableKey{Schema: q.Schema, Table: q.Table}
	return n.live(ctx, t, from, func(ctx context.Context) ([]Row, error) {
		rows, err := n.queryRows(ctx, q)
		if errors.Is(err, ErrUnknownTable) {
			return nil, nil
		}
		return rows, err
	})
}

// heldRow is what a live query keeps of a row of the answer delivered.
type heldRow struct {
	key    Row // liveKey
	digest [32]byte
}

// liveDigest summarizes what a reader of the row can see: by the change
// rule (see Change) a change of the row changes it.
func liveDigest(r Row) [32]byte {
	h := sha256.New()
	var b []byte
	clock := func(c messages.Clock) {
		b = binary.BigEndian.AppendUint64(b, uint64(c.HLC))
		b = append(b, c.Site[:]...)
		b = append(b, c.ID[:]...)
	}
	if r.Exists {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	clock(r.Existence)
	clock(r.Tomb)
	names := make([]string, 0, len(r.Cells))
	for name := range r.Cells {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := r.Cells[name]
		if c.State == Unmaterialized || (c.State == Cleared && c.Clock == r.Tomb) {
			// A column added to the table changes no row: a new column
			// reads as never written, or as cleared by the row's delete,
			// whose clock (Tomb) is summarized already.
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = append(b, byte(c.State))
		clock(c.Clock)
		b = binary.AppendUvarint(b, uint64(len(c.Value)))
		b = append(b, c.Value...)
		h.Write(b)
		b = b[:0]
	}
	h.Write(b)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// live runs the refresh loop of a live query over table t; answer reads
// the answer.
//
// A refresh first reads, in one read transaction, the newest change
// sequence and whether the table changed since the last refresh, then
// reads the answer: the answer is at least as new as that sequence, and a
// change that lands between the two reads is read again by the next
// refresh, where it finds the rows already held and yields nothing for
// them.
func (n *Node) live(ctx context.Context, t persistence.TableKey, from LivePosition, answer func(context.Context) ([]Row, error)) iter.Seq2[LiveEvent, error] {
	return func(yield func(LiveEvent, error) bool) {
		held := make(map[string]heldRow, len(from.Held))
		for _, r := range from.Held {
			held[string(r.Key.Encode())] = heldRow{key: liveKey(r), digest: liveDigest(r)}
		}
		after, first := from.After, true
		for {
			if n.isClosed() {
				yield(LiveEvent{}, ErrClosed)
				return
			}
			// Taken before the read: a change committed after the read
			// has closed this channel already.
			wake := n.changes.wait(t)
			var last uint64
			changed := first
			err := n.store.View(ctx, func(tx persistence.SyncReader) error {
				var err error
				if last, err = n.changes.lastPosition(tx); err != nil || changed {
					return err
				}
				changed, err = n.changes.tableChangedAfter(tx, t, after)
				return err
			})
			var events []LiveEvent
			if err == nil && changed {
				events, held, err = liveDiff(ctx, held, answer)
			}
			if err != nil {
				if n.isClosed() {
					err = ErrClosed
				}
				yield(LiveEvent{}, err)
				return
			}
			// Refreshed or not, the table was read up to last: the next
			// read starts there, so a quiet table's query never walks
			// other tables' changes twice.
			after, first = last, false
			for _, e := range events {
				e.Seq = last
				if !yield(e, nil) {
					return
				}
			}
			select {
			case <-wake:
			case <-ctx.Done():
				yield(LiveEvent{}, ctx.Err())
				return
			case <-n.closed:
				yield(LiveEvent{}, ErrClosed)
				return
			}
		}
	}
}

// liveKey is the identity of a row: its table and key.
func liveKey(r Row) Row { return Row{Schema: r.Schema, Table: r.Table, Key: r.Key} }

// liveDiff reads the answer and compares it with held: the events of the
// refresh (leaves first, in key order, so a consumer applying them never
// holds more rows than the limit; then enters and updates in the
// answer's order; then LiveSettled) and what to hold next.
func liveDiff(ctx context.Context, held map[string]heldRow, answer func(context.Context) ([]Row, error)) ([]LiveEvent, map[string]heldRow, error) {
	rows, err := answer(ctx)
	if err != nil {
		return nil, held, err
	}
	next := make(map[string]heldRow, len(rows))
	var events []LiveEvent
	for _, r := range rows {
		k := string(r.Key.Encode())
		d := liveDigest(r)
		next[k] = heldRow{key: liveKey(r), digest: d}
		if h, was := held[k]; !was {
			events = append(events, LiveEvent{Kind: LiveEnter, Row: r})
		} else if h.digest != d {
			events = append(events, LiveEvent{Kind: LiveUpdate, Row: r})
		}
	}
	var leaves []LiveEvent
	for k, h := range held {
		if _, still := next[k]; !still {
			leaves = append(leaves, LiveEvent{Kind: LiveLeave, Row: h.key})
		}
	}
	sort.Slice(leaves, func(i, j int) bool {
		return string(leaves[i].Row.Key.Encode()) < string(leaves[j].Row.Key.Encode())
	})
	events = append(leaves, events...)
	return append(events, LiveEvent{Kind: LiveSettled}), next, nil
}

// tableChangedAfter reports whether table t may have changed after
// change after: a retained change of it, a change of it trimmed from the
// log, or a restore that lost changes, which may have been its.
func (f *changeFeed) tableChangedAfter(tx persistence.SyncReader, t persistence.TableKey, after uint64) (bool, error) {
	changed := false
	if err := tx.ChangesAfter(t, after, 1, func(persistence.RowChange) (bool, error) {
		changed = true
		return false, nil
	}); err != nil || changed {
		return changed, err
	}
	trimmed, err := tableTrimmed(tx, t)
	if err != nil || trimmed > after {
		return trimmed > after, err
	}
	_, lost, err := f.restoredGap(tx, after)
	return lost, err
}
