package messages

import (
	"bytes"
	"encoding/hex"
	"fmt"
)

// HLC is a hybrid logical clock value: 48 bits of physical milliseconds and a
// 16-bit logical counter, packed as physical_ms<<16 | logical. Its CBOR form
// is that single unsigned integer.
type HLC uint64

// MaxPhysicalMS is the largest physical time an HLC can carry.
const MaxPhysicalMS = 1<<48 - 1

// NewHLC packs a physical time and a logical counter. It returns an error
// when physicalMS needs more than 48 bits.
func NewHLC(physicalMS uint64, logical uint16) (HLC, error) {
	if physicalMS > MaxPhysicalMS {
		return 0, fmt.Errorf("messages: physical time %d exceeds 48 bits", physicalMS)
	}
	return HLC(physicalMS<<16 | uint64(logical)), nil
}

// Physical returns the physical milliseconds.
func (h HLC) Physical() uint64 { return uint64(h) >> 16 }

// Logical returns the logical counter.
func (h HLC) Logical() uint16 { return uint16(h) }

// String returns a readable form of the HLC.
func (h HLC) String() string { return fmt.Sprintf("%d.%d", h.Physical(), h.Logical()) }

// SiteID identifies a writer (a node's signing identity) in the mesh.
type SiteID [16]byte

// String returns a readable form of the SiteID.
func (s SiteID) String() string { return hex.EncodeToString(s[:]) }

// ParseSiteID parses the 32-hex-digit form printed by String.
func ParseSiteID(s string) (SiteID, error) {
	var id SiteID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return id, fmt.Errorf("messages: site id must be 32 hex digits")
	}
	copy(id[:], b)
	return id, nil
}

// Clock is the total order SSP/1 resolves conflicts with: HLC first, then
// the site id bytes as the tiebreak, then the event id bytes. The zero
// Clock means "no clock": it is beaten by every event clock.
//
// The event id is the last resort for one (site, HLC) carried by two
// distinct events. An honest site never issues that (SSP/1 §13.5 makes HLC
// reuse a precondition violation), but a hostile or restored site can, and
// a receiver must still reach the same state from the same events whatever
// their order; without the id the first arrival would win.
type Clock struct {
	HLC  HLC     `cbor:"1,keyasint"`
	Site SiteID  `cbor:"2,keyasint"`
	ID   EventID `cbor:"3,keyasint"`
}

// Compare returns -1, 0 or +1 as c is before, equal to or after o.
func (c Clock) Compare(o Clock) int {
	switch {
	case c.HLC < o.HLC:
		return -1
	case c.HLC > o.HLC:
		return 1
	}
	if s := bytes.Compare(c.Site[:], o.Site[:]); s != 0 {
		return s
	}
	return bytes.Compare(c.ID[:], o.ID[:])
}

// SameStamp reports whether c and o carry one (HLC, site): two distinct
// events with the same stamp are an equivocation of that site.
func (c Clock) SameStamp(o Clock) bool { return c.HLC == o.HLC && c.Site == o.Site }

// Beats reports whether c is strictly after o.
func (c Clock) Beats(o Clock) bool { return c.Compare(o) > 0 }

// IsZero reports whether c is the zero clock.
func (c Clock) IsZero() bool { return c == Clock{} }

// String returns a readable form of the Clock: HLC@site, then #id (its
// first 4 bytes) when the clock names its event.
func (c Clock) String() string {
	if c.IsZero() {
		return "none"
	}
	s := c.HLC.String() + "@" + c.Site.String()[:8]
	if c.ID != (EventID{}) {
		s += "#" + c.ID.String()[:8]
	}
	return s
}

// EventID is the BLAKE3-256 of a signed event's bytes exactly as received.
type EventID [32]byte

// String returns a readable form of the EventID.
func (id EventID) String() string { return hex.EncodeToString(id[:]) }
