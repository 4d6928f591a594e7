package session

import (
	"sync"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/messages"
)

// maxAbandonedIDs bounds the abandoned ids a Manager remembers; past it
// the oldest are forgotten first.
const maxAbandonedIDs = 4096

type abandonedKey struct {
	peer messages.DeviceAddress
	id   messages.LogicalMessageID
}

// abandonedIDs remembers, for the ids Abandon removed, the digest of the
// body that was pending: a Send of another body under such an id is
// refused before anything is decided. The store's retired entries
// (persistence.RetiredOutbound, written in the Abandon's and the ACK's
// own transactions) are what decides, across restarts (checkReuse);
// this memory only spares a refused Send the reset of the peer's
// speculative state that a failed write costs. Bounded (maxAbandonedIDs,
// oldest forgotten first).
type abandonedIDs struct {
	mu    sync.Mutex
	m     map[abandonedKey][digest.Size]byte
	order []abandonedKey // oldest first
}

func (a *abandonedIDs) add(peer messages.DeviceAddress, id messages.LogicalMessageID, body []byte) {
	d := digest.ApplicationMessage(body)
	k := abandonedKey{peer, id}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[abandonedKey][digest.Size]byte{}
	}
	if _, ok := a.m[k]; !ok {
		a.order = append(a.order, k)
	}
	a.m[k] = d
	for len(a.order) > maxAbandonedIDs {
		delete(a.m, a.order[0])
		a.order = a.order[1:]
	}
}

// conflicts reports whether (peer, id) was abandoned with a body other
// than body.
func (a *abandonedIDs) conflicts(peer messages.DeviceAddress, id messages.LogicalMessageID, body []byte) bool {
	a.mu.Lock()
	d, ok := a.m[abandonedKey{peer, id}]
	a.mu.Unlock()
	return ok && d != digest.ApplicationMessage(body)
}
