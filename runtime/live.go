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

// MaxLiveRows bounds the answer of a live query: what a live query holds
// in memory is the key and a 32-byte digest of each row of its answer,
// and one refresh's events, so this bounds it whatever the table holds.
const MaxLiveRows = 10_000

// ErrInvalidLiveQuery: a LiveQuery without a table or with a limit out
// of range (1..MaxLiveRows, or 0 for MaxLiveRows).
var ErrInvalidLiveQuery = errors.New("runtime: invalid live query")

// LiveQuery is a query kept live by Node.Live: its answer is the first
// Limit existing rows of the table, in key order, that Match accepts.
type LiveQuery struct {
	Schema, Table string
	// Match selects the rows of the answer; nil accepts every row. It is
	// called inside a read transaction and must not call the node.
	Match func(Row) bool
	// Limit bounds the answer (0: MaxLiveRows). Rows past it are not in
	// the answer: when a row leaves, the next one enters.
	Limit int
}

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
	// Row is the row as it is now: for LiveEnter and LiveUpdate the row
	// in the answer; for LiveLeave the row's current state (Exists false
	// when it was deleted; only Schema, Table and Key when it has no
	// state at all). Zero for LiveSettled.
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
// and leave the answer, each refresh ended by a LiveSettled, until ctx
// ends, the node closes or the consumer stops.
//
// A refresh runs the query in one read transaction and compares its
// answer with the answer delivered before, so after every LiveSettled
// the rows held by a consumer that applied the events are exactly the
// query's answer at that point. The first refresh runs at once; the next
// ones whenever a change of the table (see Change) committed after the
// last one. Changes that land together, or while the consumer was busy,
// are delivered as one refresh: a live query reports answers, not every
// intermediate write, so a slow consumer costs one query per refresh it
// reads, never a buffer.
//
// Memory is bounded by the answer (MaxLiveRows): a key and a digest per
// row, plus one refresh's events. Without an index a refresh reads the
// table up to the limit.
//
// Resuming after a restart, with the position of the last LiveSettled
// and the rows held, continues without loss: the first refresh compares
// the answer with what is held, so a change committed while the consumer
// was away is delivered once, whatever the change log retained meanwhile
// (a trimmed log, a restored store) — unlike Watch, a live query never
// needs a re-read.
//
// The iteration ends after yielding a non-nil error: ErrInvalidLiveQuery,
// ctx.Err(), ErrClosed or a storage error.
func (n *Node) Live(ctx context.Context, q LiveQuery, from LivePosition) iter.Seq2[LiveEvent, error] {
	limit := q.Limit
	if limit == 0 {
		limit = MaxLiveRows
	}
	t := persistence.TableKey{Schema: q.Schema, Table: q.Table}
	answer := func(tx persistence.SyncReader, def TableDef) ([]Row, error) {
		var out []Row
		return out, tx.Rows(t, nil, func(_ []byte, pr persistence.Row) (bool, error) {
			if !pr.Exists {
				return true, ctx.Err()
			}
			r := viewRow(def, pr)
			if q.Match == nil || q.Match(r) {
				out = append(out, r)
			}
			return len(out) < limit, ctx.Err()
		})
	}
	if q.Schema == "" || q.Table == "" || limit < 1 || limit > MaxLiveRows {
		return func(yield func(LiveEvent, error) bool) {
			yield(LiveEvent{}, fmt.Errorf("%w: table %q.%q, limit %d (1..%d)", ErrInvalidLiveQuery, q.Schema, q.Table, q.Limit, MaxLiveRows))
		}
	}
	return n.live(ctx, t, from, answer)
}

// heldRow is what a live query keeps of a row of the answer delivered.
type heldRow struct {
	key    Row // Schema, Table and Key only
	digest [32]byte
}

// rowDigest summarizes what a reader of the row can see: by the change
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
// the answer in the refresh's read transaction (def is the table's
// definition; an undefined table has an empty answer).
func (n *Node) live(ctx context.Context, t persistence.TableKey, from LivePosition, answer func(persistence.SyncReader, TableDef) ([]Row, error)) iter.Seq2[LiveEvent, error] {
	return func(yield func(LiveEvent, error) bool) {
		held := make(map[string]heldRow, len(from.Held))
		for _, r := range from.Held {
			held[string(r.Key.Encode())] = heldRow{key: Row{Schema: r.Schema, Table: r.Table, Key: r.Key}, digest: liveDigest(r)}
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
			var events []LiveEvent
			var last uint64
			next := held
			err := n.store.View(ctx, func(tx persistence.SyncReader) error {
				var err error
				if _, last, err = tx.ChangeBounds(); err != nil {
					return err
				}
				if !first {
					changed, err := tableChangedAfter(tx, t, after)
					if err != nil || !changed {
						return err
					}
				}
				def, ok, err := tx.Table(t)
				if err != nil {
					return err
				}
				var rows []Row
				if ok {
					if rows, err = answer(tx, def); err != nil {
						return err
					}
				}
				next = make(map[string]heldRow, len(rows))
				for _, r := range rows {
					k := string(r.Key.Encode())
					d := liveDigest(r)
					next[k] = heldRow{key: Row{Schema: r.Schema, Table: r.Table, Key: r.Key}, digest: d}
					if h, was := held[k]; !was {
						events = append(events, LiveEvent{Kind: LiveEnter, Row: r})
					} else if h.digest != d {
						events = append(events, LiveEvent{Kind: LiveUpdate, Row: r})
					}
				}
				var leaves []LiveEvent
				for k, h := range held {
					if _, still := next[k]; still {
						continue
					}
					r := h.key
					if ok {
						pr, found, err := tx.Row(t, []byte(k))
						if err != nil {
							return err
						}
						if found {
							r = viewRow(def, pr)
						}
					}
					leaves = append(leaves, LiveEvent{Kind: LiveLeave, Row: r})
				}
				// Leaves first, in key order: a consumer applying the
				// events never holds more than the limit.
				sort.Slice(leaves, func(i, j int) bool { return string(leaves[i].Row.Key.Encode()) < string(leaves[j].Row.Key.Encode()) })
				events = append(leaves, events...)
				events = append(events, LiveEvent{Kind: LiveSettled})
				return nil
			})
			if err != nil {
				if n.isClosed() {
					err = ErrClosed
				}
				yield(LiveEvent{}, err)
				return
			}
			held, first = next, false
			// Refreshed or not, the read saw the table up to last: the
			// next read starts there, so a quiet table's query never
			// walks other tables' changes twice.
			after = last
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

// tableChangedAfter reports whether table t may have changed after
// change after: a retained change of it, a change of it trimmed from the
// log, or a restore that lost changes, which may have been its.
func tableChangedAfter(tx persistence.SyncReader, t persistence.TableKey, after uint64) (bool, error) {
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
	_, lost, err := restoredGap(tx, after)
	return lost, err
}
