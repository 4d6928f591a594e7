package persistence

import (
	"github.com/syncmesh/syncmesh/messages"
)

// SenderCursor is a sender's durable progress toward one peer over one
// transport path (SSP/1 §14.1): every local log entry at or below Seq was
// offered in a push that succeeded. It is never set from anything the
// peer advertises.
type SenderCursor struct {
	Seq uint64
	// Retry holds sequences at or below Seq the peer held or rejected;
	// they are offered again next cycle (SSP/1 §13.6).
	Retry []uint64
}

// Watermark is an applied watermark (SSP/1 §14.2): every event of the
// group at or below HLC has been applied here, and all of them are in the
// local log at a sequence at or below Seq (so this node can pass the
// statement on to its own peers).
type Watermark struct {
	HLC messages.HLC
	Seq uint64
}

// PeerGap is one event a sender offered that did not apply here yet (held
// or rejected): it keeps the watermark of its group from moving past it.
type PeerGap struct {
	Seq   uint64
	Group GroupKey
}

// PeerProgress is what a receiver has applied from one sender's log:
// everything the sender offered at sequences at or below Through, except
// Gaps. It is reset when the sender's log id changes.
type PeerProgress struct {
	Log     []byte
	Through uint64
	Gaps    []PeerGap
}

// Limits of the SSP/1 §14 delivery state. They are enforced on write by
// every store and are the same on read, so a record that was written can
// always be read back (bbolt stores one key per gap and per re-offer, with
// no element limit of a record decoder in the way).
const (
	// MaxPeerGaps bounds PeerProgress.Gaps.
	MaxPeerGaps = 16384
	// MaxRetry bounds SenderCursor.Retry.
	MaxRetry = 16384
)

// HeldUsage is what one signer's held events (SSP/1 §13.6) cost a node:
// how many are held and the bytes they take in the store (at least their
// signed size).
type HeldUsage struct {
	Events int
	Bytes  int64
}

// SyncDeliveryReader reads the SSP/1 §14 delivery state. Peer keys are the
// caller's names for (peer, transport path); at most 1024 bytes.
type SyncDeliveryReader interface {
	// Cursor returns the sender cursor for peer; ok is false for a peer
	// never pushed to (its cursor is genesis).
	Cursor(peer string) (c SenderCursor, ok bool, err error)
	// Watermark returns the applied watermark of g; ok is false when none
	// exists (fail closed: absent means not applied).
	Watermark(g GroupKey) (w Watermark, ok bool, err error)
	// Watermarks calls fn for every stored watermark until fn returns false.
	Watermarks(fn func(g GroupKey, w Watermark) (bool, error)) error
	// PeerProgress returns what was applied from sender peer.
	PeerProgress(peer string) (p PeerProgress, ok bool, err error)
	// IsHeld reports whether the event at seq is held in group g: a point
	// lookup, whatever the number of held events.
	IsHeld(g GroupKey, seq uint64) (bool, error)
	// HeldUsage returns what site's held events cost (every group of it).
	HeldUsage(site messages.SiteID) (HeldUsage, error)
}

// SyncDeliveryWriter writes the SSP/1 §14 delivery state.
type SyncDeliveryWriter interface {
	// PutCursor stores peer's sender cursor. More than MaxRetry re-offers
	// is ErrLimit.
	PutCursor(peer string, c SenderCursor) error
	// PutWatermark stores g's watermark. It refuses to lower the HLC
	// (ErrWatermarkRegression): watermarks are monotonic (SSP/1 §14.2).
	PutWatermark(g GroupKey, w Watermark) error
	// PutPeerProgress stores what was applied from sender peer. More than
	// MaxPeerGaps gaps is ErrLimit.
	PutPeerProgress(peer string, p PeerProgress) error
	// DeleteWatermarks removes every stored watermark (the one exception
	// to monotonicity: absence fails closed, SSP/1 §14.2) and returns how
	// many it removed.
	DeleteWatermarks() (int, error)
	// PurgeHeld removes group g's held entries and their events from the
	// log and returns how many it removed: an operator's way to drop what
	// was held for a table that will never exist here.
	PurgeHeld(g GroupKey) (int, error)
}
