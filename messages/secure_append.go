package messages

// Hand-written encoders of the delivery plane's fixed frames: the
// SecurePayload frame, the ratchet header and the envelope. Each message
// costs about ten of these encodings (every decoder re-encodes to check
// that its input was canonical, and the ratchet encodes each header for
// the AEAD associated data), and the reflective CBOR encoder spent more on
// them than AES-GCM. They write exactly the Core Deterministic encoding
// the wire structs would get (heads by appendHead) (RFC 8949 §4.2.1: shortest heads, map keys
// in bytewise order of their encodings); TestSecureAppendMatchesCBOR
// compares them with it over random and edge-sized values.

// The heads of the frames, each by appendHead (RFC 8949 §3.1 major types
// 0 unsigned, 2 byte string, 3 text string, 4 array, 5 map; simple value
// 22 is null), so no encoder spells a head byte by hand.

func appendUint(dst []byte, v uint64) []byte { return appendHead(dst, 0, v) }

func appendBstr(dst, b []byte) []byte {
	return append(appendHead(dst, 2, uint64(len(b))), b...)
}

func appendTstr(dst []byte, s string) []byte {
	return append(appendHead(dst, 3, uint64(len(s))), s...)
}

func appendArray(dst []byte, n int) []byte { return appendHead(dst, 4, uint64(n)) }

func appendMap(dst []byte, n int) []byte { return appendHead(dst, 5, uint64(n)) }

func appendNull(dst []byte) []byte { return appendHead(dst, 7, 22) }

// appendRatchetHeader appends the encoding of wireHeader: [session bstr,
// dh bstr, pn uint, n uint], or of wireHeaderSalted when h carries a salt:
// [session, dh, pn, n, salt bstr].
func appendRatchetHeader(dst []byte, h *RatchetHeader) []byte {
	if h.Salt != nil {
		dst = appendArray(dst, 5)
	} else {
		dst = appendArray(dst, 4)
	}
	dst = appendBstr(dst, h.Session[:])
	dst = appendBstr(dst, h.DH[:])
	dst = appendUint(dst, uint64(h.PN))
	dst = appendUint(dst, uint64(h.N))
	if h.Salt != nil {
		dst = appendBstr(dst, h.Salt[:])
	}
	return dst
}

// envelopeVersionOf is the version of an envelope whose header is h.
func envelopeVersionOf(h *RatchetHeader) uint64 {
	if h.Salt != nil {
		return EnvelopeVersionSalted
	}
	return EnvelopeVersion
}

// ratchetHeaderSize is the largest encoded ratchet header (salted).
const ratchetHeaderSize = 1 + 3*(2+32) + 2*5

// appendSecurePayload appends the frame [1, type, body] with body
// {"id": bstr} (an ack) or {"id": bstr, "body": bstr} (an application
// message): "id" (0x62…) sorts before "body" (0x64…).
func appendSecurePayload(dst []byte, t SecurePayloadType, id *LogicalMessageID, body []byte, app bool) []byte {
	dst = appendArray(dst, 3)
	dst = appendUint(dst, SecurePayloadVersion)
	dst = appendUint(dst, uint64(t))
	fields := 1
	if app {
		fields = 2
	}
	dst = appendMap(dst, fields)
	dst = appendTstr(dst, "id")
	dst = appendBstr(dst, id[:])
	if app {
		dst = appendTstr(dst, "body")
		dst = appendBstr(dst, body)
	}
	return dst
}

// appendHeldPayload appends the frame [1, 3, {"id": bstr, "digest":
// bstr}]: "id" (0x62…) sorts before "digest" (0x66…).
func appendHeldPayload(dst []byte, id *LogicalMessageID, d *[HeldDigestSize]byte) []byte {
	dst = appendArray(dst, 3)
	dst = appendUint(dst, SecurePayloadVersion)
	dst = appendUint(dst, uint64(PayloadHeld))
	dst = appendMap(dst, 2)
	dst = appendTstr(dst, "id")
	dst = appendBstr(dst, id[:])
	dst = appendTstr(dst, "digest")
	return appendBstr(dst, d[:])
}

// appendEnvelope appends the encoding of wireEnvelope: [version, header,
// initiation or null, ciphertext bstr]; initiation is the encoded
// initiation (nil: none).
func appendEnvelope(dst []byte, h *RatchetHeader, initiation, ciphertext []byte) []byte {
	dst = appendArray(dst, 4)
	dst = appendUint(dst, envelopeVersionOf(h))
	dst = appendRatchetHeader(dst, h)
	if initiation != nil {
		dst = append(dst, initiation...)
	} else {
		dst = appendNull(dst)
	}
	return appendBstr(dst, ciphertext)
}
