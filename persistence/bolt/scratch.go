package bolt

import (
	"sync"
	"sync/atomic"
)

// txScratch is the memory of one sync write transaction, reused by the
// next instead of being garbage: the chunks its record values are carved
// from (valueBuf), which bbolt keeps by reference until the transaction's
// Commit or Rollback returns, and its working slices and map (the pending
// index entries, the rows to put). A scratch serves one transaction at a
// time: syncStore.Update takes it before bbolt's transaction begins and
// releases it only after bbolt.Update returned, when bbolt holds nothing
// of it any more; a transaction's reads return copies, never chunk
// memory (TestScratchReuseKeepsCommittedRecords).
//
// A store that writes batches (a transaction filling at least
// keepScratchChunks chunks: the apply path's group commits) keeps its
// scratch for its next transaction, at most maxScratchChunks of it: a
// pool alone loses it whenever two garbage collections fall between two
// transactions, which the allocation rate of the apply path makes the
// rule. Other scratches go to a process-wide pool, so the many small
// stores of a hosting node hold none while idle (the collector empties
// the pool). A nil *txScratch allocates.
type txScratch struct {
	chunks             []*[valueChunk]byte
	used               int // chunks[:used] are lent to the transaction
	rowsOut            map[string][]byte
	pendRow, pendTable [][]byte
	keys               []string // flushRows' sorted keys
}

// Bounds of what a released scratch keeps: a transaction larger than
// that (a catch-up batch) allocates the rest, and its excess is dropped.
const (
	keepScratchChunks = 4
	maxScratchChunks  = 128     // 8 MiB of values
	maxScratchRows    = 1 << 14 // rows and index entries per transaction
)

var scratchPool = sync.Pool{New: func() any { return new(txScratch) }}

// scratchPoison, set by this package's tests, overwrites every chunk a
// released scratch lent: a record or returned value that still pointed
// into one would read back wrong instead of by luck unchanged.
var scratchPoison atomic.Bool

// takeScratch returns a scratch no transaction uses: the one d kept, or
// one from the pool.
func (d *DB) takeScratch() *txScratch {
	if s := d.scratch.Swap(nil); s != nil {
		return s
	}
	return scratchPool.Get().(*txScratch)
}

// releaseScratch gives s back: to d when its transaction wrote a batch
// (and d keeps none), else to the pool. The transaction it served must
// have ended (bbolt.Update returned): its chunks are written over next.
func (d *DB) releaseScratch(s *txScratch) {
	batch := s.used >= keepScratchChunks
	s.reset()
	if batch && !d.closed.Load() && d.scratch.CompareAndSwap(nil, s) {
		return
	}
	scratchPool.Put(s)
}

// reset readies s for another transaction.
func (s *txScratch) reset() {
	if scratchPoison.Load() {
		for _, c := range s.chunks[:s.used] {
			for i := range c {
				c[i] = 0xdb
			}
		}
	}
	s.used = 0
	if len(s.chunks) > maxScratchChunks {
		clear(s.chunks[maxScratchChunks:])
		s.chunks = s.chunks[:maxScratchChunks]
	}
	if len(s.rowsOut) > 0 || cap(s.keys) > maxScratchRows {
		// A transaction that did not flush its rows (it failed): start
		// the next from an empty map.
		s.rowsOut, s.keys = nil, nil
	}
	for _, p := range []*[][]byte{&s.pendRow, &s.pendTable} {
		if cap(*p) > maxScratchRows {
			*p = nil
		}
		clear((*p)[:cap(*p)])
		*p = (*p)[:0]
	}
}

// chunk lends an empty chunk of valueChunk bytes (its old contents are
// garbage), valid until the scratch is released.
func (s *txScratch) chunk() []byte {
	if s == nil {
		return make([]byte, 0, valueChunk)
	}
	if s.used == len(s.chunks) {
		s.chunks = append(s.chunks, new([valueChunk]byte))
	}
	c := s.chunks[s.used]
	s.used++
	return c[:0:valueChunk]
}

// rows returns the map of rows to put, empty; hint sizes a new one.
func (s *txScratch) rows(hint int64) map[string][]byte {
	if s == nil {
		// Sized as the last transaction's: a batch writes thousands of
		// rows, and growing the map rehashed them at every doubling.
		return make(map[string][]byte, hint)
	}
	if s.rowsOut == nil {
		s.rowsOut = make(map[string][]byte, hint)
	}
	return s.rowsOut
}

// pending returns the two slices of pending index entries, empty; hint
// sizes new ones. The transaction hands them back with keepPending.
func (s *txScratch) pending(hint int64) (row, table [][]byte) {
	if s == nil || s.pendRow == nil {
		return make([][]byte, 0, hint), make([][]byte, 0, hint)
	}
	row, table = s.pendRow, s.pendTable
	s.pendRow, s.pendTable = nil, nil
	return row, table
}

// keepPending takes back the slices pending lent (grown since, maybe).
func (s *txScratch) keepPending(row, table [][]byte) {
	if s == nil || row == nil {
		return
	}
	s.pendRow, s.pendTable = row, table
}
