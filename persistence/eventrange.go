package persistence

import (
	"bytes"
	"cmp"

	"github.com/syncmesh/syncmesh/crypto/lthash"
	"github.com/syncmesh/syncmesh/messages"
)

// EventKey is a retained event's place in the order reconciliation uses:
// (site, HLC, id).
type EventKey struct {
	Site messages.SiteID
	HLC  messages.HLC
	ID   EventID
}

// Compare orders keys by site bytes, then HLC, then id bytes.
func (k EventKey) Compare(o EventKey) int {
	if c := bytes.Compare(k.Site[:], o.Site[:]); c != 0 {
		return c
	}
	if c := cmp.Compare(k.HLC, o.HLC); c != 0 {
		return c
	}
	return bytes.Compare(k.ID[:], o.ID[:])
}

// EventRangeReader is the read-only range API over the retained event
// log that set reconciliation uses. The signed bytes of a key are read
// with SyncReader.Event(key.Site, key.HLC, key.ID).
type EventRangeReader interface {
	// TableEventKeys calls fn, in (site, HLC, id) order, for the keys of
	// the table's retained events with an HLC at or above min, until fn
	// returns false or an error.
	TableEventKeys(t TableKey, min messages.HLC, fn func(EventKey) (bool, error)) error
	// TableEventSum returns the RangeSum of the same keys TableEventKeys
	// lists from min. Stores keep it as per-(table, site) sums maintained
	// in the transaction that appends or deletes an event, so it reads
	// one record per site, plus the retained keys below min (none when
	// min is at or below the oldest retained HLC, as after an eviction to
	// min), instead of every key.
	TableEventSum(t TableKey, min messages.HLC) (RangeSum, error)
}

// RangeSum aggregates a set of event keys: their number and the LtHash16
// of their reconciliation keys (site | HLC | id), so sums of disjoint sets
// add up to the sum of their union.
type RangeSum struct {
	Count uint64
	Sum   lthash.Sum
}

// Add adds k to the set (k must not be in it).
func (r *RangeSum) Add(k EventKey) {
	b := messages.NewReconcileKey(k.Site, k.HLC, k.ID)
	r.Count++
	r.Sum.Add(b[:])
}

// Remove removes k from the set (k must be in it).
func (r *RangeSum) Remove(k EventKey) {
	b := messages.NewReconcileKey(k.Site, k.HLC, k.ID)
	r.Count--
	r.Sum.Remove(b[:])
}

// Combine adds the disjoint set o.
func (r *RangeSum) Combine(o *RangeSum) {
	r.Count += o.Count
	r.Sum.Combine(&o.Sum)
}

// Subtract removes o, a subset.
func (r *RangeSum) Subtract(o *RangeSum) {
	r.Count -= o.Count
	r.Sum.Subtract(&o.Sum)
}
