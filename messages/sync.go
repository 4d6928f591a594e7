package messages

import (
	"fmt"
)

// SyncVersion is the version of the SSP/1 §14 push messages this build
// speaks. A push or result with another version is rejected with
// ErrUnsupportedVersion.
const SyncVersion = 1

// Limits of one push (SSP/1 §14 delivery between nodes).
const (
	// MaxPushEvents bounds the events of one push; a sender splits its log
	// into batches no larger than this.
	MaxPushEvents = 4096
	// MaxPushBytes bounds an encoded push or push result.
	MaxPushBytes = 64 << 20
	// maxPeerName bounds a peer name.
	maxPeerName = 256
)

// PushedEvent is one entry of the sender's retained log offered in a push:
// its local sequence there and the signed event exactly as the sender
// received or produced it.
type PushedEvent struct {
	_   struct{} `cbor:",toarray"`
	Seq uint64
	Raw []byte
}

// Group names a sync group (site_id, schema, table) on the wire.
type Group struct {
	_      struct{} `cbor:",toarray"`
	Site   SiteID
	Schema string
	Table  string
}

// WatermarkClaim is a sender's statement about its own log: every event of
// Group with an HLC at or below HLC is in the sender's log at a sequence at
// or below Seq. A receiver that has applied everything the sender offered
// up to Seq may raise its own watermark for Group to HLC (SSP/1 §14.2).
type WatermarkClaim struct {
	_     struct{} `cbor:",toarray"`
	Group Group
	HLC   HLC
	Seq   uint64
}

// GroupWatermark is an applied watermark: everything from Group.Site for
// the table at or below HLC has been applied (SSP/1 §14.2).
type GroupWatermark struct {
	_     struct{} `cbor:",toarray"`
	Group Group
	HLC   HLC
}

// SyncPush offers a range of the sender's log to a receiver (SSP/1 §14.1).
// It covers the sender's sequences in (After, Through]: every retained
// event in that range is in Events unless the sender knew, from the
// receiver's reported watermarks, that the receiver already applied it.
// Events may also hold re-offers (sequences at or below After that the
// receiver held or rejected before). Events are in ascending Seq order.
type SyncPush struct {
	V       uint64           `cbor:"v"`
	From    string           `cbor:"from"`         // the sender's peer name as the receiver knows it
	To      string           `cbor:"to,omitempty"` // the receiver's name as the sender knows it (routes it on a shared transport)
	Log     []byte           `cbor:"log"`          // the sender's log id (16 bytes): a new id means a new log
	After   uint64           `cbor:"after"`        // the sender's cursor for this receiver
	Through uint64           `cbor:"through"`      // the last sequence covered
	Tail    uint64           `cbor:"tail"`         // the sender's last log sequence (for progress display)
	Events  []PushedEvent    `cbor:"events"`
	Claims  []WatermarkClaim `cbor:"claims"`
	// Offer makes the push a probe: it carries no events and no claims and
	// covers nothing (Through = After); it describes the batch the sender
	// is about to push, per origin site, and the result answers each range
	// with a Verdict. A joiner catching up from several peers at once uses
	// it to take each event from one of them (docs/protocol.md).
	Offer []OfferRange `cbor:"offer,omitempty"`
}

// OfferRange describes the events of one origin site in the batch a sender
// is about to push: Count events with HLCs in [From, To], and Digest over
// their (HLC, id) pairs in that order. The receiver answers VerdictHave
// only when the events it holds of Site in [From, To] are exactly these.
type OfferRange struct {
	_      struct{} `cbor:",toarray"`
	Site   SiteID
	From   HLC
	To     HLC
	Count  uint64
	Digest []byte
}

// Verdicts a receiver gives the ranges of a probe, in PushResult.Verdicts.
const (
	// VerdictSend: push the range (the receiver leased its site to this sender).
	VerdictSend = 1
	// VerdictHave: the receiver holds exactly these events; leave them out.
	VerdictHave = 2
	// VerdictBusy: another sender holds the site's lease; push nothing of
	// the range yet and stop the push before its first event.
	VerdictBusy = 3
)

// Limits of a probe.
const (
	// MaxOfferRanges bounds the ranges of one probe (and its verdicts).
	MaxOfferRanges = 256
	// OfferDigestSize is the size of an OfferRange digest.
	OfferDigestSize = 16
)

// PushResult is the receiver's answer to a SyncPush: which offered events
// must be offered again (held for a missing table, rejected for clock
// skew: SSP/1 §13.6), and the receiver's applied watermarks for the groups
// the push touched (SSP/1 §14.2).
type PushResult struct {
	V uint64 `cbor:"v"`
	// Applied counts the events of the push that applied, were duplicates
	// or were dropped for good (the watermark may move past them).
	Applied uint64 `cbor:"applied"`
	// Held lists the groups waiting for their table.
	Held []Group `cbor:"held"`
	// Retry lists the sequences (of this push's events) the sender must
	// offer again next cycle: held and rejected events.
	Retry []uint64 `cbor:"retry"`
	// Rejected counts the events of Retry rejected for clock skew.
	Rejected uint64 `cbor:"rejected"`
	// Watermarks are the receiver's applied watermarks for the groups of
	// the push's events and claims.
	Watermarks []GroupWatermark `cbor:"wm"`
	// Verdicts answer a probe's Offer, one per range, in order.
	Verdicts []uint64 `cbor:"verdicts,omitempty"`
	// Probe asks the sender to probe before its next pushes: another
	// sender holds a lease on a site this sender offered or pushed.
	Probe bool `cbor:"probe,omitempty"`
}

// EncodeSyncPush encodes p deterministically.
func EncodeSyncPush(p *SyncPush) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return Marshal(p)
}

// DecodeSyncPush decodes and validates a push. Errors match
// ErrMalformed, ErrUnsupportedVersion, ErrTrailingBytes, ErrTooLarge or
// ErrSyncInvalid.
func DecodeSyncPush(data []byte) (*SyncPush, error) {
	var p SyncPush
	if err := Unmarshal("sync push", data, &p, MaxPushBytes); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate checks the protocol rules of a push.
func (p *SyncPush) Validate() error {
	if p.V != SyncVersion {
		return decodeErr("sync push", ErrUnsupportedVersion, fmt.Errorf("version %d", p.V))
	}
	if p.From == "" || len(p.From) > maxPeerName || len(p.To) > maxPeerName {
		return fmt.Errorf("%w: peer names of %d and %d bytes", ErrSyncInvalid, len(p.From), len(p.To))
	}
	if len(p.Log) != 16 {
		return fmt.Errorf("%w: log id of %d bytes", ErrSyncInvalid, len(p.Log))
	}
	if p.Through < p.After || p.Tail < p.Through {
		return fmt.Errorf("%w: range (%d, %d] with tail %d", ErrSyncInvalid, p.After, p.Through, p.Tail)
	}
	if len(p.Events) > MaxPushEvents {
		return fmt.Errorf("%w: %d events, limit %d", ErrSyncInvalid, len(p.Events), MaxPushEvents)
	}
	var prev uint64
	for i, e := range p.Events {
		if e.Seq == 0 || e.Seq > p.Through || (i > 0 && e.Seq <= prev) {
			return fmt.Errorf("%w: event %d has sequence %d", ErrSyncInvalid, i, e.Seq)
		}
		if len(e.Raw) == 0 {
			return fmt.Errorf("%w: event %d is empty", ErrSyncInvalid, i)
		}
		prev = e.Seq
	}
	for i, c := range p.Claims {
		if err := c.Group.validate(); err != nil {
			return fmt.Errorf("claim %d: %w", i, err)
		}
		if c.Seq > p.Through {
			return fmt.Errorf("%w: claim %d beyond the push (seq %d > %d)", ErrSyncInvalid, i, c.Seq, p.Through)
		}
	}
	return p.validateOffer()
}

// validateOffer checks a probe: nothing but its ranges, each well formed,
// at most MaxPushEvents events described in all (what one push carries).
func (p *SyncPush) validateOffer() error {
	if len(p.Offer) == 0 {
		return nil
	}
	if len(p.Offer) > MaxOfferRanges {
		return fmt.Errorf("%w: probe of %d ranges, limit %d", ErrSyncInvalid, len(p.Offer), MaxOfferRanges)
	}
	if len(p.Events) > 0 || len(p.Claims) > 0 || p.Through != p.After {
		return fmt.Errorf("%w: a probe carries events, claims or a range", ErrSyncInvalid)
	}
	var total uint64
	for i, o := range p.Offer {
		if o.Count == 0 || o.Count > MaxPushEvents || o.From > o.To || len(o.Digest) != OfferDigestSize {
			return fmt.Errorf("%w: probe range %d", ErrSyncInvalid, i)
		}
		total += o.Count
	}
	if total > MaxPushEvents {
		return fmt.Errorf("%w: probe describes %d events, limit %d", ErrSyncInvalid, total, MaxPushEvents)
	}
	return nil
}

func (g Group) validate() error {
	if g.Schema == "" || g.Table == "" || len(g.Schema) > maxPeerName || len(g.Table) > maxPeerName {
		return fmt.Errorf("%w: group %q/%q", ErrSyncInvalid, g.Schema, g.Table)
	}
	return nil
}

// EncodePushResult encodes r deterministically.
func EncodePushResult(r *PushResult) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return Marshal(r)
}

// DecodePushResult decodes and validates a push result.
func DecodePushResult(data []byte) (*PushResult, error) {
	var r PushResult
	if err := Unmarshal("push result", data, &r, MaxPushBytes); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate checks the protocol rules of a push result.
func (r *PushResult) Validate() error {
	if r.V != SyncVersion {
		return decodeErr("push result", ErrUnsupportedVersion, fmt.Errorf("version %d", r.V))
	}
	if len(r.Retry) > MaxPushEvents || r.Rejected > uint64(len(r.Retry)) {
		return fmt.Errorf("%w: %d retries, %d rejected", ErrSyncInvalid, len(r.Retry), r.Rejected)
	}
	for i, g := range r.Held {
		if err := g.validate(); err != nil {
			return fmt.Errorf("held %d: %w", i, err)
		}
	}
	for i, w := range r.Watermarks {
		if err := w.Group.validate(); err != nil {
			return fmt.Errorf("watermark %d: %w", i, err)
		}
	}
	if len(r.Verdicts) > MaxOfferRanges {
		return fmt.Errorf("%w: %d verdicts", ErrSyncInvalid, len(r.Verdicts))
	}
	for i, v := range r.Verdicts {
		if v < VerdictSend || v > VerdictBusy {
			return fmt.Errorf("%w: verdict %d is %d", ErrSyncInvalid, i, v)
		}
	}
	return nil
}
