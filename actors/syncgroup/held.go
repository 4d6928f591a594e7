package syncgroup

import (
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Per-signer held quotas (SSP/1 §13.6). Holding is for a table that has
// not been created yet; a signer naming tables that never will be must
// not make a node keep, relay and re-offer its events without bound. An
// event past the quota is rejected in §13.6's sense: nothing retained,
// the watermark does not pass it, and the sender offers it again.
const (
	// MaxHeldEventsPerSigner bounds the events held for one site.
	MaxHeldEventsPerSigner = 1024
	// MaxHeldBytesPerSigner bounds their signed bytes.
	MaxHeldBytesPerSigner = 8 << 20
)

// overHeldQuota says why holding one more event of size bytes from site
// would exceed its quota ("" when it fits).
func overHeldQuota(tx persistence.SyncReader, site messages.SiteID, size int) (string, error) {
	u, err := tx.HeldUsage(site)
	if err != nil {
		return "", err
	}
	switch {
	case u.Events >= MaxHeldEventsPerSigner:
		return fmt.Sprintf("held quota: %d events held for this signer, limit %d", u.Events, MaxHeldEventsPerSigner), nil
	case u.Bytes+int64(size) > MaxHeldBytesPerSigner:
		return fmt.Sprintf("held quota: %d bytes held for this signer, limit %d", u.Bytes, MaxHeldBytesPerSigner), nil
	}
	return "", nil
}
