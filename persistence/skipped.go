package persistence

import (
	"slices"

	"github.com/syncmesh/syncmesh/messages"
)

// MaxSkippedKeyEntry is the largest skipped-key entry a store accepts
// (PutSkippedKey); ratchet entries are ratchet.SkippedKeyEntrySize (109)
// bytes.
const MaxSkippedKeyEntry = 256

// SkippedHolder is a peer and the number of skipped keys stored for it.
type SkippedHolder struct {
	Peer  messages.DeviceAddress
	Count int
}

// SkippedEviction is how many of a peer's skipped keys a device-wide cap
// deleted (EvictSkippedKeys).
type SkippedEviction struct {
	Peer  messages.DeviceAddress
	Count int
}

// PlanSkippedEviction decides what EvictSkippedKeys deletes when holders
// store more than limit keys together: keys are taken from the peer
// holding the most, one at a time, so the largest holders are cut down to
// a common level and a peer holding fewer keys than every peer above it
// loses nothing while those hold more (ties: the lower address loses one
// more). A hostile peer that floods skipped keys is the largest holder,
// so its own keys go first; it cannot make the device drop the keys of a
// peer that holds fewer (docs/threat-model.md). Both
// stores use this one plan. The result is in address order.
func PlanSkippedEviction(holders []SkippedHolder, limit int) []SkippedEviction {
	total := 0
	for _, h := range holders {
		total += h.Count
	}
	excess := total - max(limit, 0)
	if excess <= 0 {
		return nil
	}
	hs := slices.Clone(holders)
	slices.SortFunc(hs, func(a, b SkippedHolder) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return a.Peer.Compare(b.Peer)
	})
	// hs is in count order, so the holders at or above a level are a
	// prefix hs[:k]: lower their common level to the next holder's count,
	// or as far as the excess goes.
	level, k := hs[0].Count, 0
	extra := make([]bool, len(hs))
	for excess > 0 {
		for k < len(hs) && hs[k].Count >= level {
			k++
		}
		next := 0
		if k < len(hs) {
			next = hs[k].Count
		}
		room := k * (level - next)
		if room == 0 {
			break
		}
		if room <= excess {
			excess -= room
			level = next
			continue
		}
		// Not all the way: each of the k loses q more, the first r in
		// address order one more still.
		q, r := excess/k, excess%k
		level -= q
		idx := make([]int, k)
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return hs[a].Peer.Compare(hs[b].Peer) })
		for _, i := range idx[:r] {
			extra[i] = true
		}
		excess = 0
	}
	drop := make([]int, len(hs))
	for i := range k {
		drop[i] = hs[i].Count - level
		if extra[i] {
			drop[i]++
		}
	}
	var out []SkippedEviction
	for i, h := range hs {
		if drop[i] > 0 {
			out = append(out, SkippedEviction{Peer: h.Peer, Count: drop[i]})
		}
	}
	slices.SortFunc(out, func(a, b SkippedEviction) int { return a.Peer.Compare(b.Peer) })
	return out
}
