package messages

import "fmt"

// UnmarshalCBOR decodes a site id from a byte string of exactly 16 bytes
// (the generic decoder would silently accept a shorter or longer one).
func (s *SiteID) UnmarshalCBOR(data []byte) error {
	return fixedBytes("site id", data, s[:])
}

// UnmarshalCBOR decodes an event id from a byte string of exactly 32 bytes.
func (id *EventID) UnmarshalCBOR(data []byte) error {
	return fixedBytes("event id", data, id[:])
}

func fixedBytes(what string, data []byte, out []byte) error {
	var b []byte
	if err := decMode.Unmarshal(data, &b); err != nil {
		return decodeErr(what, ErrMalformed, err)
	}
	if len(b) != len(out) {
		return decodeErr(what, ErrMalformed, fmt.Errorf("%d bytes, want %d", len(b), len(out)))
	}
	copy(out, b)
	return nil
}
