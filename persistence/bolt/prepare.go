package bolt

import (
	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// PrepareEvents seals the bytes of evs and sums their reconciliation keys
// per (table, site) ahead of their transaction (persistence.PreparedEvent):
// AppendEvent, in the single writer, then only copies the sealed bytes
// into the record, and flushSums adds one prepared sum per group.
func (s *syncStore) PrepareEvents(evs []*persistence.StoredEvent) {
	persistence.PrepareEvents(evs, s.d.opts.Sealer)
}

// addPrepared adds a prepared share of count appended events to the
// transaction's pending change of (tk, site) (persistence.PreparedSums).
func (t *syncTx) addPrepared(tk persistence.TableKey, site messages.SiteID, count int64, sum *lthash.Sum) {
	d := t.sumDelta(tk, site)
	d.count += count
	d.sum.Combine(sum)
}
